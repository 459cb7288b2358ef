package controller

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

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
	// Registry is where this holder marks locks whose release could not
	// be confirmed, and where its Acquire waits such marks out. Nil means
	// DefaultRegistry (shared by the process).
	Registry *Registry
	// Metrics records acquire wait, hold time, renewals and losses. Nil
	// means none are recorded.
	Metrics *Metrics
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
	if c.Registry == nil {
		c.Registry = DefaultRegistry
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
	since    time.Time // when the current state began (metrics)

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

func (h *Holder) transition(from, to State) bool {
	h.mu.Lock()
	if h.state != from {
		h.mu.Unlock()
		return false
	}
	h.state = to
	since := h.since
	h.since = time.Now()
	h.mu.Unlock()
	switch {
	case from == StateAcquiring:
		h.opts.Metrics.acquired(since, to == StateActive)
	case from == StateActive:
		h.opts.Metrics.held(since)
	}
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
		h.transition(StateReleasing, StateReleased)
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
