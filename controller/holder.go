package controller

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// State is where a Holder is in its life. A holder goes
// IDLE -> ACQUIRING -> ACTIVE -> RELEASING -> RELEASED, or ACTIVE -> LOST
// when ownership may have been lost, or ACQUIRING -> RELEASED when the
// acquire gave up. LOST and RELEASED are final: a holder never re-acquires.
type State int32

// The holder states.
const (
	StateIdle      State = iota // created, Acquire not called yet
	StateAcquiring              // Acquire is running
	StateActive                 // every lock is held and renewals are on time
	StateReleasing              // Release is running, or waiting out the TTL
	StateLost                   // ownership may have been lost; nothing more is sent
	StateReleased               // nothing is held (released, or the acquire gave up)
)

func (s State) String() string {
	switch s {
	case StateIdle:
		return "IDLE"
	case StateAcquiring:
		return "ACQUIRING"
	case StateActive:
		return "ACTIVE"
	case StateReleasing:
		return "RELEASING"
	case StateLost:
		return "LOST"
	case StateReleased:
		return "RELEASED"
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// LockOptions configure a Holder. A nil *LockOptions means every default.
type LockOptions struct {
	// TTL of the etcd lease. Zero means 10s. It is rounded up to whole
	// seconds (etcd's granularity); etcd may grant more, never less.
	TTL time.Duration
	// SafetyMargin: ownership counts as lost once the time since the
	// last confirmed renewal was sent reaches TTL - SafetyMargin. Zero
	// means TTL/3. It must be below TTL.
	SafetyMargin time.Duration
	// RenewInterval between timed renewals. Zero means TTL/6.
	RenewInterval time.Duration
	// AcquireTimeout bounds the whole Acquire, retries included. Zero
	// means 30s.
	AcquireTimeout time.Duration
	// AttemptWait bounds how long one attempt waits in etcd's queue for a
	// lock before it gives up its place, backs off and retries. Zero means
	// the attempt may wait until AcquireTimeout.
	AttemptWait time.Duration
	// RequestTimeout bounds each single etcd request (grant, lock txn,
	// renewal, release). Zero means 2s.
	RequestTimeout time.Duration
	// BackoffBase and BackoffMax shape the retry delay: attempt n waits a
	// uniformly random time in [0, min(BackoffMax, BackoffBase*2^n)]
	// ("full jitter"). Zero means 100ms and 2s.
	BackoffBase, BackoffMax time.Duration
	// MaxHold limits the total hold time: once it has passed since the
	// holder became ACTIVE, it cancels its context and releases. Zero
	// means no limit.
	MaxHold time.Duration
	// ReleaseTimeout bounds Release's etcd requests. Zero means 2s.
	ReleaseTimeout time.Duration
	// Name identifies this holder in commands (`holder`) and logs. Zero
	// means "controller".
	Name string
	// OnState, when set, is called on every state change, from the
	// goroutine that made it. It must not block or call the Holder.
	OnState func(from, to State)
}

func (o *LockOptions) withDefaults() LockOptions {
	var c LockOptions
	if o != nil {
		c = *o
	}
	if c.TTL <= 0 {
		c.TTL = 10 * time.Second
	}
	c.TTL = time.Duration(ttlSeconds(c.TTL)) * time.Second
	if c.SafetyMargin <= 0 || c.SafetyMargin >= c.TTL {
		c.SafetyMargin = c.TTL / 3
	}
	if c.RenewInterval <= 0 {
		c.RenewInterval = c.TTL / 6
	}
	if c.AcquireTimeout <= 0 {
		c.AcquireTimeout = 30 * time.Second
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 2 * time.Second
	}
	if c.BackoffBase <= 0 {
		c.BackoffBase = 100 * time.Millisecond
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 2 * time.Second
	}
	if c.ReleaseTimeout <= 0 {
		c.ReleaseTimeout = 2 * time.Second
	}
	if c.Name == "" {
		c.Name = "controller"
	}
	return c
}

func ttlSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return s
}

// Backoff returns a full-jitter delay for retry n (0-based): uniform in
// [0, min(max, base*2^n)].
func Backoff(n int, base, max time.Duration) time.Duration {
	d := base
	for i := 0; i < n && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	if d <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(d) + 1))
}

// Holder is one ownership generation of a set of named etcd locks. Create
// it with NewHolder (no I/O) and call Acquire, or use the package-level
// Acquire. It is safe for concurrent use.
//
// The fencing token of each lock is the create revision of this holder's
// lock key. etcd's revision is a cluster-wide counter raised by every
// write, and a lock key is created once per holder and per lock (the key
// name embeds the lease ID, which etcd never reuses). A new holder's key is
// created after it entered the queue, and it can only own the lock once
// every key with a lower create revision is gone, so the holder that owns
// the lock next always has a higher create revision than every earlier
// owner: the token grows with every new holder, which is exactly what a
// device needs to refuse an older generation.
type Holder struct {
	cli   *clientv3.Client
	opts  LockOptions
	names []string

	mu       sync.Mutex
	state    State
	err      error // why the holder is LOST or RELEASED early
	fences   map[string]int64
	keys     map[string]string
	sess     *concurrency.Session
	lease    clientv3.LeaseID
	lastSent time.Time // send time of the last confirmed renewal (monotonic)
	freeAt   time.Time // when an unconfirmed release counts as released
	attempts []time.Time

	ctx    context.Context // cancelled on LOST, release or MaxHold
	cancel context.CancelCauseFunc

	hb       context.Context // ends the heartbeat goroutines
	hbCancel context.CancelFunc
	wg       sync.WaitGroup
	lostDone chan struct{} // closed once a LOST holder dropped its session
	relDone  chan struct{} // closed when the release that won ACTIVE->RELEASING ends
	relErr   error         // its result

	slots deviceSlots // Senders' per-device order under this holder
}

func (h *Holder) deviceSlot(device string) chan struct{} { return h.slots.slot(device) }

// NewHolder returns an IDLE holder for the named locks. It does no I/O.
// Lock names are etcd key prefixes, and the same string goes into each
// command's `lock` field (e.g. "locks/device/pump-7").
func NewHolder(cli *clientv3.Client, names []string, opts *LockOptions) *Holder {
	sorted := append([]string(nil), names...)
	// One global order (sorted names) for taking several locks, so two
	// holders needing overlapping sets can never wait on each other.
	sort.Strings(sorted)
	ctx, cancel := context.WithCancelCause(context.Background())
	hb, hbCancel := context.WithCancel(context.Background())
	return &Holder{
		cli:      cli,
		opts:     opts.withDefaults(),
		names:    sorted,
		fences:   map[string]int64{},
		keys:     map[string]string{},
		ctx:      ctx,
		cancel:   cancel,
		hb:       hb,
		hbCancel: hbCancel,
		lostDone: make(chan struct{}),
		relDone:  make(chan struct{}),
	}
}

// Acquire creates a holder for names and acquires it; see Holder.Acquire.
func Acquire(ctx context.Context, cli *clientv3.Client, names []string, opts *LockOptions) (*Holder, error) {
	h := NewHolder(cli, names, opts)
	if err := h.Acquire(ctx); err != nil {
		return nil, err
	}
	return h, nil
}

func validNames(names []string) error {
	if len(names) == 0 {
		return fmt.Errorf("%w: no names", ErrNoLocks)
	}
	for i, n := range names {
		if n == "" || strings.ContainsRune(n, 0) {
			return fmt.Errorf("%w: %q", ErrNoLocks, n)
		}
		if i > 0 && names[i-1] == n {
			return fmt.Errorf("%w: %q given twice", ErrNoLocks, n)
		}
		if i > 0 && strings.HasPrefix(n, names[i-1]+"/") {
			return fmt.Errorf("%w: %q is inside %q", ErrNoLocks, n, names[i-1])
		}
	}
	return nil
}

// Acquire takes every lock in sorted-name order, all under one etcd lease.
// It returns once all are held (state ACTIVE) or with ErrAcquireTimeout
// once LockOptions.AcquireTimeout has passed or ctx ended (state RELEASED,
// nothing held). Failed attempts are retried with exponential backoff and
// full jitter. All attempts of one Acquire share one lease: a lock request
// whose outcome is unknown (timed out) is simply repeated under the same
// lease, which finds and reuses its key if the first request did land, so
// one Acquire never has two sessions competing. When it gives up it
// revokes the lease; if that revoke cannot be confirmed, the names count
// as held in this process until the TTL has run out.
func (h *Holder) Acquire(ctx context.Context) error {
	if err := validNames(h.names); err != nil {
		return err
	}
	if !h.transition(StateIdle, StateAcquiring, nil) {
		return ErrUsed
	}
	actx, cancel := context.WithTimeout(ctx, h.opts.AcquireTimeout)
	defer cancel()

	var last error
	if err := local.wait(actx, h.names); err != nil {
		return h.giveUp(fmt.Errorf("waiting out an unconfirmed release in this process: %w", err))
	}
	for n := 0; ; n++ {
		h.mu.Lock()
		h.attempts = append(h.attempts, time.Now())
		h.mu.Unlock()
		err := h.attempt(actx)
		if err == nil {
			return h.activate()
		}
		last = err
		if actx.Err() != nil {
			break
		}
		select {
		case <-actx.Done():
		case <-time.After(Backoff(n, h.opts.BackoffBase, h.opts.BackoffMax)):
		}
		if actx.Err() != nil {
			break
		}
	}
	return h.giveUp(last)
}

func (h *Holder) giveUp(last error) error {
	h.hbCancel()
	h.dropSession(true)
	err := fmt.Errorf("%w: locks %v: %v", ErrAcquireTimeout, h.names, last)
	h.mu.Lock()
	h.err = err
	h.mu.Unlock()
	h.transition(StateAcquiring, StateReleased, err)
	h.cancel(err)
	return err
}

// attempt does one pass: a lease (reused across attempts), then each lock
// not yet held, in order.
func (h *Holder) attempt(actx context.Context) error {
	h.mu.Lock()
	sess := h.sess
	h.mu.Unlock()
	if sess != nil {
		select {
		case <-sess.Done():
			// The lease is gone, and every key with it.
			h.dropSession(true)
			sess = nil
		default:
		}
	}
	if sess == nil {
		rctx, cancel := context.WithTimeout(actx, h.opts.RequestTimeout)
		sent := time.Now()
		// A grant whose answer is lost leaves a lease nobody renews and
		// nothing is attached to: it expires by itself.
		resp, err := h.cli.Grant(rctx, ttlSeconds(h.opts.TTL))
		cancel()
		if err != nil {
			return fmt.Errorf("grant lease: %w", err)
		}
		s, err := concurrency.NewSession(h.cli, concurrency.WithLease(resp.ID), concurrency.WithTTL(int(ttlSeconds(h.opts.TTL))))
		if err != nil {
			h.revoke(resp.ID)
			return fmt.Errorf("session for lease %x: %w", resp.ID, err)
		}
		h.mu.Lock()
		h.sess, h.lease, h.lastSent = s, resp.ID, sent
		h.fences = map[string]int64{}
		h.keys = map[string]string{}
		h.mu.Unlock()
		sess = s
	}
	for _, name := range h.names {
		h.mu.Lock()
		_, held := h.fences[name]
		h.mu.Unlock()
		if held {
			continue
		}
		lctx, cancel := actx, context.CancelFunc(func() {})
		if h.opts.AttemptWait > 0 {
			lctx, cancel = context.WithTimeout(actx, h.opts.AttemptWait)
		}
		m := concurrency.NewMutex(sess, name)
		err := m.Lock(lctx)
		cancel()
		if err != nil {
			if errors.Is(err, concurrency.ErrSessionExpired) {
				h.dropSession(true)
			}
			return fmt.Errorf("lock %s: %w", name, err)
		}
		cmp := m.IsOwner()
		rev, ok := cmp.GetCompare().TargetUnion.(*pb.Compare_CreateRevision)
		if !ok || rev.CreateRevision <= 0 {
			return fmt.Errorf("lock %s: no create revision for key %q", name, m.Key())
		}
		h.mu.Lock()
		h.fences[name] = rev.CreateRevision
		h.keys[name] = m.Key()
		h.mu.Unlock()
	}
	// One timed renewal before going ACTIVE: it proves the lease (and so
	// every key) is alive and starts the ownership clock from its send.
	if err := h.renewOnce(actx); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			h.dropSession(true)
		}
		return err
	}
	return nil
}

// renewOnce sends one keepalive and, once confirmed, moves lastSent to
// when it was sent.
func (h *Holder) renewOnce(ctx context.Context) error {
	h.mu.Lock()
	lease := h.lease
	h.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, h.opts.RequestTimeout)
	defer cancel()
	sent := time.Now()
	resp, err := h.cli.KeepAliveOnce(rctx, lease)
	if err != nil {
		return fmt.Errorf("renew lease %x: %w", lease, err)
	}
	if resp.TTL < ttlSeconds(h.opts.TTL) {
		// Granted less than asked (should not happen): count from the
		// server's figure, which is the conservative one.
		sent = sent.Add(time.Duration(resp.TTL)*time.Second - h.opts.TTL)
	}
	h.mu.Lock()
	if sent.After(h.lastSent) {
		h.lastSent = sent
	}
	h.mu.Unlock()
	return nil
}

// dropSession stops renewing the current lease and revokes it (best
// effort). If the revoke is not confirmed, the names count as held in
// this process until the lease has surely expired. reset forgets the keys
// (during acquisition); a LOST holder keeps them for a late Release.
func (h *Holder) dropSession(reset bool) {
	h.mu.Lock()
	s, lease := h.sess, h.lease
	h.sess = nil
	if reset {
		h.lease = clientv3.NoLease
		h.fences = map[string]int64{}
		h.keys = map[string]string{}
	}
	h.mu.Unlock()
	if s == nil {
		return
	}
	s.Orphan()
	if err := h.revoke(lease); err != nil {
		local.hold(h.names, h.surelyExpired())
	}
}

// surelyExpired is when a lease whose renewals stopped now has run out:
// the session's own keepalive may have sent a renewal up to now, so the
// TTL counts from now, plus one request timeout for a renewal still on
// its way (and never earlier than from the last confirmed renewal).
func (h *Holder) surelyExpired() time.Time {
	return time.Now().Add(h.opts.TTL + h.opts.RequestTimeout)
}

func (h *Holder) revoke(lease clientv3.LeaseID) error {
	ctx, cancel := context.WithTimeout(context.Background(), h.opts.ReleaseTimeout)
	defer cancel()
	_, err := h.cli.Revoke(ctx, lease)
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("revoke lease %x: %w", lease, err)
	}
	return nil
}

func (h *Holder) activate() error {
	h.mu.Lock()
	sess := h.sess
	h.mu.Unlock()
	if !h.transition(StateAcquiring, StateActive, nil) {
		return ErrUsed
	}
	h.wg.Add(2)
	renewed := make(chan struct{}, 1)
	go h.renewLoop(renewed)
	go h.watch(sess, renewed)
	return nil
}

// renewLoop sends a timed renewal every RenewInterval until stop.
func (h *Holder) renewLoop(renewed chan<- struct{}) {
	defer h.wg.Done()
	t := time.NewTicker(h.opts.RenewInterval)
	defer t.Stop()
	for {
		select {
		case <-h.hb.Done():
			return
		case <-t.C:
		}
		err := h.renewOnce(h.hb)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			h.lose(fmt.Errorf("%w: %w", ErrSessionEnded, err))
			return
		}
		if err == nil {
			select {
			case renewed <- struct{}{}:
			default:
			}
		}
	}
}

// watch turns the end of the session, an overdue renewal or MaxHold into
// the holder's end.
func (h *Holder) watch(sess *concurrency.Session, renewed <-chan struct{}) {
	defer h.wg.Done()
	var maxHold <-chan time.Time
	if h.opts.MaxHold > 0 {
		t := time.NewTimer(h.opts.MaxHold)
		defer t.Stop()
		maxHold = t.C
	}
	for {
		wait := time.Until(h.deadline())
		if wait <= 0 {
			h.lose(ErrRenewalOverdue)
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-h.hb.Done():
			t.Stop()
			return
		case <-sess.Done():
			t.Stop()
			h.lose(ErrSessionEnded)
			return
		case <-renewed:
		case <-t.C:
		case <-maxHold:
			t.Stop()
			if !h.transition(StateActive, StateReleasing, nil) {
				return
			}
			h.mu.Lock()
			h.err = ErrMaxHold
			h.mu.Unlock()
			h.cancel(ErrMaxHold)
			// release waits for this goroutine, so it runs apart; Release
			// and relDone wait for it.
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), h.opts.ReleaseTimeout+h.opts.TTL)
				defer cancel()
				h.finishRelease(ctx, StateActive)
			}()
			return
		}
		t.Stop()
	}
}

// deadline is when ownership stops counting: the send time of the last
// confirmed renewal plus TTL minus the safety margin, on the monotonic
// clock (time.Time from time.Now carries it).
func (h *Holder) deadline() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lastSent.Add(h.opts.TTL - h.opts.SafetyMargin)
}

// lose moves an ACTIVE holder to LOST: its context is cancelled so work in
// progress stops, renewals stop, and the lease is revoked best effort. It
// never re-acquires.
func (h *Holder) lose(cause error) {
	err := fmt.Errorf("%w: %w", ErrLost, cause)
	h.mu.Lock()
	if h.state != StateActive {
		h.mu.Unlock()
		return
	}
	h.err = err
	h.mu.Unlock()
	if !h.transition(StateActive, StateLost, err) {
		return
	}
	h.cancel(err)
	h.hbCancel()
	go func() {
		// lose may run on a heartbeat goroutine, so the revoke runs
		// apart; Release waits for lostDone.
		h.dropSession(false)
		close(h.lostDone)
	}()
}

// Lose moves an ACTIVE holder to LOST with cause (Sender calls it on a
// stale_fence or a newer last_fence). It is a no-op in any other state.
func (h *Holder) Lose(cause error) { h.lose(cause) }

func (h *Holder) transition(from, to State, _ error) bool {
	h.mu.Lock()
	if h.state != from {
		h.mu.Unlock()
		return false
	}
	h.state = to
	h.mu.Unlock()
	if h.opts.OnState != nil {
		h.opts.OnState(from, to)
	}
	return true
}

// State returns the holder's state now. An ACTIVE holder whose renewal is
// overdue reports LOST even before its watchdog has run.
func (h *Holder) State() State {
	h.mu.Lock()
	s, freeAt := h.state, h.freeAt
	h.mu.Unlock()
	switch {
	case s == StateActive && !time.Now().Before(h.deadline()):
		h.lose(ErrRenewalOverdue)
		return h.State()
	case s == StateReleasing && !freeAt.IsZero() && !time.Now().Before(freeAt):
		h.transition(StateReleasing, StateReleased, nil)
		return StateReleased
	}
	return s
}

// Check returns nil while the holder is ACTIVE and its last confirmed
// renewal still leaves the safety margin, else why not (wrapping ErrLost
// or ErrNotActive). Call it before every bounded step of work.
func (h *Holder) Check() error {
	switch s := h.State(); s {
	case StateActive:
		return nil
	case StateLost:
		return h.Err()
	default:
		if err := h.Err(); err != nil {
			return fmt.Errorf("%w (%s): %w", ErrNotActive, s, err)
		}
		return fmt.Errorf("%w (%s)", ErrNotActive, s)
	}
}

// Err returns why the holder ended early (LOST, MaxHold, acquire timeout),
// or nil.
func (h *Holder) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Context is cancelled as soon as the holder stops being ACTIVE (LOST,
// MaxHold, Release); context.Cause tells why. Run the work under it.
func (h *Holder) Context() context.Context { return h.ctx }

// Locks returns the lock names in acquisition (sorted) order.
func (h *Holder) Locks() []string { return append([]string(nil), h.names...) }

// Name is the holder's name (LockOptions.Name).
func (h *Holder) Name() string { return h.opts.Name }

// Fence returns the fencing token of the first lock (the only one for a
// single-lock holder), or 0 before ACTIVE.
func (h *Holder) Fence() int64 {
	if len(h.names) == 0 {
		return 0
	}
	f, _ := h.FenceOf(h.names[0])
	return f
}

// FenceOf returns the fencing token of one lock.
func (h *Holder) FenceOf(name string) (int64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f, ok := h.fences[name]
	if !ok {
		return 0, fmt.Errorf("%w: %s", ErrUnknownLock, name)
	}
	return f, nil
}

// Key returns this holder's etcd key for one lock ("" if not held).
func (h *Holder) Key(name string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.keys[name]
}

// Lease returns the etcd lease the locks are attached to.
func (h *Holder) Lease() clientv3.LeaseID {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lease
}

// Attempts returns when each acquire attempt started.
func (h *Holder) Attempts() []time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]time.Time(nil), h.attempts...)
}

// Release gives the locks back if this holder still owns them: each key is
// deleted only under the guard that its create revision is still this
// holder's fence, so a late release never removes a newer holder's lock;
// then the lease is revoked. It is best effort, bounded by
// LockOptions.ReleaseTimeout. If a delete or the revoke is not confirmed,
// the release does not count: Release waits until the lease's TTL has run
// out since its last confirmed renewal (or ctx ends, returning
// ErrReleaseUnconfirmed; until that time, Acquire in this process treats
// the names as held). On a LOST holder Release still sends the guarded
// deletes and returns ErrNotOwner when etcd refused them.
func (h *Holder) Release(ctx context.Context) error { return h.release(ctx, nil) }

func (h *Holder) release(ctx context.Context, reason error) error {
	h.mu.Lock()
	st := h.state
	h.mu.Unlock()
	switch st {
	case StateActive:
		if !h.transition(StateActive, StateReleasing, nil) {
			return h.release(ctx, reason)
		}
		h.cancel(ErrNotActive)
		return h.finishRelease(ctx, StateActive)
	case StateLost:
		return h.finishRelease(ctx, StateLost)
	case StateReleasing:
		// Another release (MaxHold's, or a concurrent call) runs: wait
		// for its result.
		select {
		case <-h.relDone:
			h.mu.Lock()
			defer h.mu.Unlock()
			return h.relErr
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrReleaseUnconfirmed, ctx.Err())
		}
	default:
		return fmt.Errorf("%w (%s)", ErrNotActive, st)
	}
}

// finishRelease does the release's I/O for a holder that was st (ACTIVE,
// now RELEASING, or LOST).
func (h *Holder) finishRelease(ctx context.Context, st State) (err error) {
	if st == StateActive {
		defer func() {
			h.mu.Lock()
			h.relErr = err
			h.mu.Unlock()
			close(h.relDone)
		}()
	}
	h.hbCancel()
	h.wg.Wait()
	if st == StateLost {
		select {
		case <-h.lostDone:
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrReleaseUnconfirmed, ctx.Err())
		}
	}

	h.mu.Lock()
	keys := make(map[string]string, len(h.keys))
	for k, v := range h.keys {
		keys[k] = v
	}
	fences := make(map[string]int64, len(h.fences))
	for k, v := range h.fences {
		fences[k] = v
	}
	sess, lease := h.sess, h.lease
	h.mu.Unlock()

	var errs []error
	unconfirmed := false
	notOwner := false
	rctx, cancel := context.WithTimeout(ctx, h.opts.ReleaseTimeout)
	defer cancel()
	for _, name := range h.names {
		key, ok := keys[name]
		if !ok {
			continue
		}
		resp, err := h.cli.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", fences[name])).
			Then(clientv3.OpDelete(key)).
			Commit()
		switch {
		case err != nil:
			unconfirmed = true
			errs = append(errs, fmt.Errorf("delete %s: %w", key, err))
		case !resp.Succeeded:
			notOwner = true
		}
	}
	var stopped time.Time
	if sess != nil {
		sess.Orphan()
		stopped = h.surelyExpired()
		if _, err := h.cli.Revoke(rctx, lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			unconfirmed = true
			errs = append(errs, fmt.Errorf("revoke lease %x: %w", lease, err))
		}
	}
	if st == StateLost {
		if notOwner {
			return fmt.Errorf("%w: %w", ErrNotOwner, h.Err())
		}
		return h.Err()
	}
	if unconfirmed {
		freeAt := stopped
		if freeAt.IsZero() {
			freeAt = h.surelyExpired()
		}
		local.hold(h.names, freeAt)
		h.mu.Lock()
		h.freeAt = freeAt
		h.mu.Unlock()
		t := time.NewTimer(time.Until(freeAt))
		defer t.Stop()
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrReleaseUnconfirmed, errors.Join(errs...))
		case <-t.C:
		}
	}
	h.transition(StateReleasing, StateReleased, nil)
	if notOwner {
		return ErrNotOwner
	}
	return nil
}
