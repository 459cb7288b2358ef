package controller

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
)

// Owner is the ownership a Sender sends under. *Holder implements it; so
// does *FixedFence for an operator who already knows the fence.
type Owner interface {
	// Check returns nil while commands may be sent.
	Check() error
	// FenceOf returns the fencing token issued by the named lock.
	FenceOf(lock string) (int64, error)
	// Locks lists the held lock names; the first fences devices for
	// which SendOptions.LockFor says nothing.
	Locks() []string
	// Lose records evidence of a newer owner: the owner is LOST from now on.
	Lose(cause error)
	// Context ends when the ownership does.
	Context() context.Context
	// Name identifies the sender in commands (`holder`).
	Name() string
}

// FixedFence is an Owner with a fence given by hand (edgectl --fence). It
// becomes lost like a Holder when a device reports a newer fence. Use it
// by pointer.
type FixedFence struct {
	Lock   string // sent as the command's `lock`; "" for none
	Fence  int64
	Holder string
	lost   atomic.Pointer[error]
	slots  deviceSlots
}

// deviceSlots serialises sends per device for one owner: every Sender
// of that owner shares them.
type deviceSlots struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

func (d *deviceSlots) slot(device string) chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[string]chan struct{}{}
	}
	c, ok := d.m[device]
	if !ok {
		c = make(chan struct{}, 1)
		d.m[device] = c
	}
	return c
}

// serialiser is implemented by owners that keep their own per-device
// order (Holder, FixedFence), so two Senders of one owner share it.
type serialiser interface {
	deviceSlot(device string) chan struct{}
}

func (f *FixedFence) deviceSlot(device string) chan struct{} { return f.slots.slot(device) }

// Check implements Owner.
func (f *FixedFence) Check() error {
	if e := f.lost.Load(); e != nil {
		return *e
	}
	return nil
}

// FenceOf implements Owner.
func (f *FixedFence) FenceOf(string) (int64, error) { return f.Fence, nil }

// Locks implements Owner.
func (f *FixedFence) Locks() []string { return []string{f.Lock} }

// Lose implements Owner.
func (f *FixedFence) Lose(cause error) {
	err := fmt.Errorf("%w: %w", ErrLost, cause)
	f.lost.CompareAndSwap(nil, &err)
}

// Context implements Owner.
func (f *FixedFence) Context() context.Context { return context.Background() }

// Name implements Owner.
func (f *FixedFence) Name() string { return f.Holder }

// SendOptions configure a Sender. A nil *SendOptions means every default.
type SendOptions struct {
	// ResultTimeout is how long Send waits for a final Result before it
	// resends the same command (same op_id). Zero means 5s.
	ResultTimeout time.Duration
	// BackoffBase and BackoffMax shape the delay before resending after
	// `busy` (full jitter). Zero means 100ms and 2s.
	BackoffBase, BackoffMax time.Duration
	// LockFor names the lock whose fence goes with commands to a device.
	// Nil means the owner's first lock for every device.
	LockFor func(device string) string
	// ExpiresIn puts expires_at = now + ExpiresIn on each command, so a
	// Send that gives up (ErrOutcomeUnknown) knows the agent will not
	// start the command after that time (by the agent's clock; fencing,
	// not the clock, is what protects the device). Zero means
	// DefaultExpiry.
	ExpiresIn time.Duration
	// SignKey, when set, signs every command (docs/protocol.md §6): a JWS
	// with kid KeyID, its payload the command with gateway, device and
	// expires_at, which must be within the agent's security.max_ttl
	// (default 15m). Nil: commands are sent as plain JSON.
	SignKey ed25519.PrivateKey
	// KeyID names SignKey in the agent's security.keys; required with
	// SignKey.
	KeyID string
	// OnUnknown, when set, is called (on Send's goroutine) with each
	// unknown Result Send receives before the final one. Nil: none.
	OnUnknown func(wire.Result)
	// Metrics counts stale results. Nil means none are recorded.
	Metrics *Metrics
	// OnPublish, when set, is called after each publish of a command,
	// resends included, with its outcome: nil once the broker
	// acknowledged it (PUBACK), else the error. It runs on Send's
	// goroutine and must not block. For a history of what was sent (the
	// chaos campaign records "published" with it). Nil: not called.
	OnPublish func(cmd wire.Command, err error)
}

// DefaultExpiry is how long a command may be started when
// SendOptions.ExpiresIn is zero: long enough for a Send's resends of the
// same command, and well within the agent's default security.max_ttl
// (15m) for a signed one.
const DefaultExpiry = time.Minute

// Sender sends commands under one Owner over one Conn. Sends to one device
// are serialised per owner (every Sender of a Holder shares the order):
// the next starts only after the previous one has a final Result (or gave
// up), so commands under one fence keep the owner's order.
// It is safe for concurrent use.
type Sender struct {
	conn  *Conn
	owner Owner
	opts  SendOptions

	mu      sync.Mutex
	devices deviceSlots // per device, when the owner keeps none
	stats   SendStats
}

// SendStats count what Senders did, for tests and metrics.
type SendStats struct {
	Published int // publishes, resends included
	Resends   int // resends after a Result timeout
	Busy      int // busy answers retried
	Unknown   int // unknown (non-final) Results seen
}

// NewSender returns a Sender. It does no I/O.
func NewSender(conn *Conn, owner Owner, opts *SendOptions) *Sender {
	var o SendOptions
	if opts != nil {
		o = *opts
	}
	if o.ResultTimeout <= 0 {
		o.ResultTimeout = 5 * time.Second
	}
	if o.BackoffBase <= 0 {
		o.BackoffBase = 100 * time.Millisecond
	}
	if o.BackoffMax <= 0 {
		o.BackoffMax = 2 * time.Second
	}
	if o.ExpiresIn <= 0 {
		o.ExpiresIn = DefaultExpiry
	}
	return &Sender{conn: conn, owner: owner, opts: o}
}

// Stats returns counters so far.
func (s *Sender) Stats() SendStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// CallOption adjusts one Send.
type CallOption func(*call)

type call struct {
	opID string
}

// WithOpID makes Send use a caller-supplied op_id (to resend an operation
// whose outcome is unknown). It must never be reused for another operation.
func WithOpID(id string) CallOption { return func(c *call) { c.opID = id } }

// Send publishes one command to the device with the owner's current fence
// and awaits its final Result on the reply topic.
//
//   - Before every publish, resends included, it checks ownership; a LOST
//     owner sends nothing (ErrLost).
//   - No final Result within ResultTimeout: the outcome is unknown, so it
//     resends the same command with the same op_id (the agent runs an
//     op_id at most once and replays its outcome).
//   - A Result with status unknown is not final: it keeps waiting.
//   - busy, and fence_unconfirmed (the gateway cannot yet confirm it
//     remembers the device's fences: its floor from etcd is not taken):
//     not final, nothing happened; resent after a full-jitter backoff;
//     ctx ends first: ErrOutcomeUnknown, since a resend may have been
//     queued meanwhile.
//   - stale_fence, or any Result whose last_fence is above the fence: the
//     owner is moved to LOST and Send returns an error wrapping ErrLost
//     and ErrNewerFence (with the Result). What to do next: release,
//     take the lock again (a new generation, a fence above the newer
//     one, or above the gateway's fence floor after it forgot its
//     fences), send a barrier (action "fence") and then the commands.
//   - Another final Result that is not applied: (Result, *ResultError).
//     It is final, device_unreachable and policy_error included: the
//     agent records it and answers the same op_id with it from then on,
//     so trying again (the device is back, the plugin fixed) is a new
//     Send with a new op_id.
//   - ctx ends first: ErrOutcomeUnknown; the command may still be started
//     until its expires_at (SendOptions.ExpiresIn), never after; resend
//     with WithOpID to learn its outcome.
//
// params is nil, a JSON object as json.RawMessage or []byte, or any value
// that marshals to a JSON object.
func (s *Sender) Send(ctx context.Context, device, action string, params any, opts ...CallOption) (wire.Result, error) {
	var c call
	for _, o := range opts {
		o(&c)
	}
	if c.opID == "" {
		c.opID = NewOpID()
	}
	cmd, err := s.command(device, action, params, c.opID)
	if err != nil {
		return wire.Result{}, err
	}
	release, err := s.lockDevice(ctx, device)
	if err != nil {
		return wire.Result{}, fmt.Errorf("device %s: waiting for the previous command: %w", device, err)
	}
	defer release()
	// Counted from when the command can go out, after the device's
	// previous command has ended.
	exp := time.Now().Add(s.opts.ExpiresIn).UTC()
	cmd.ExpiresAt = &exp
	payload, err := s.encode(cmd)
	if err != nil {
		return wire.Result{}, err
	}
	results, unregister, err := s.conn.register(cmd.OpID, device, wire.PayloadDigest(payload))
	if err != nil {
		return wire.Result{}, err
	}
	defer unregister()
	topic := wire.CmdTopic(s.conn.opts.Prefix, s.conn.opts.Gateway, device)
	// An unauthorized Result comes on the device's result topic, never to
	// reply_to. A broker that refuses the subscription (its ACL) only
	// costs that answer: the command goes out all the same.
	if err := s.conn.watchDevice(ctx, device); err != nil && ctx.Err() != nil {
		return wire.Result{}, fmt.Errorf("device %s: %w", device, err)
	}

	busy, lostPublish := 0, 0
	var last wire.Result
	for {
		// Ownership is checked before every publish, resends included.
		if err := s.owner.Check(); err != nil {
			return last, fmt.Errorf("device %s op %s: not sent: %w", device, cmd.OpID, err)
		}
		err := s.conn.publish(ctx, topic, payload)
		if s.opts.OnPublish != nil {
			s.opts.OnPublish(cmd, err)
		}
		if err != nil {
			if ctx.Err() != nil {
				return last, gaveUp(device, cmd, "publish", err)
			}
			if errors.Is(err, ErrClosed) {
				return last, fmt.Errorf("device %s op %s: %w", device, cmd.OpID, err)
			}
			// The connection was lost with the publish (paho fails a
			// publish in flight on a connection it is losing; a NATS
			// node that lost a peer drops connections): the same op_id
			// again once it may be back, as for a lost Result (a resend
			// of what the agent took is answered from its record:
			// invariant 2).
			s.count(func(st *SendStats) { st.Resends++ })
			if !s.backoff(ctx, &lostPublish) {
				return last, gaveUp(device, cmd, "publish", err)
			}
			continue
		}
		s.count(func(st *SendStats) { st.Published++ })
		r, outcome, err := s.await(ctx, device, cmd, results)
		if r.OpID != "" {
			last = r
		}
		switch outcome {
		case awaitFinal:
			return r, err
		case awaitBusy:
			s.count(func(st *SendStats) { st.Busy++ })
			if !s.backoff(ctx, &busy) {
				return last, gaveUp(device, cmd, "busy until the deadline", ctx.Err())
			}
		case awaitTimeout:
			s.count(func(st *SendStats) { st.Resends++ })
		case awaitEnded:
			return last, err
		}
	}
}

type awaitOutcome int

const (
	awaitFinal awaitOutcome = iota
	awaitBusy
	awaitTimeout
	awaitEnded
)

// await waits for one final answer to cmd, or a reason to resend.
func (s *Sender) await(ctx context.Context, device string, cmd wire.Command, results <-chan wire.Result) (wire.Result, awaitOutcome, error) {
	t := time.NewTimer(s.opts.ResultTimeout)
	defer t.Stop()
	var last wire.Result
	for {
		select {
		case <-ctx.Done():
			return last, awaitEnded, gaveUp(device, cmd, "no final Result", ctx.Err())
		case <-s.owner.Context().Done():
			return last, awaitEnded, fmt.Errorf("device %s op %s: result not awaited: %w", device, cmd.OpID, s.owner.Check())
		case <-t.C:
			return last, awaitTimeout, nil
		case r := <-results:
			last = r
			if r.Code == wire.CodeStaleFence || r.LastFence > cmd.Fence {
				s.opts.Metrics.stale()
				cause := fmt.Errorf("%w: device %s answered %s with last_fence %d for fence %d",
					ErrNewerFence, r.Device, r.Code, r.LastFence, cmd.Fence)
				s.owner.Lose(cause)
				return r, awaitFinal, &ResultError{Result: r, lost: true}
			}
			switch {
			case !r.Final():
				// unknown: the agent resolves it with the device and
				// publishes the final Result to the same reply topic.
				s.count(func(st *SendStats) { st.Unknown++ })
				if s.opts.OnUnknown != nil {
					s.opts.OnUnknown(r)
				}
				continue
			case r.Code == wire.CodeBusy, r.Code == wire.CodeFenceUnconfirmed:
				// Neither is final: nothing happened; the same op_id is
				// sent again after a backoff (a gateway that cannot yet
				// confirm its fence memory answers fence_unconfirmed).
				return r, awaitBusy, nil
			case r.Status == wire.StatusApplied:
				return r, awaitFinal, nil
			default:
				return r, awaitFinal, &ResultError{Result: r}
			}
		}
	}
}

// gaveUp is Send's error when ctx ends before a final Result: the
// outcome is unknown until the command's expires_at.
func gaveUp(device string, cmd wire.Command, what string, cause error) error {
	return fmt.Errorf("device %s op %s: %s: %w; it is not started after its expires_at %s: %w",
		device, cmd.OpID, what, ErrOutcomeUnknown, cmd.ExpiresAt.Format(time.RFC3339Nano), cause)
}

// backoff waits the n-th full-jitter backoff (and counts it), or until
// ownership ends (the resend's Check then says so); false when ctx ended
// first.
func (s *Sender) backoff(ctx context.Context, n *int) bool {
	t := time.NewTimer(Backoff(*n, s.opts.BackoffBase, s.opts.BackoffMax))
	defer t.Stop()
	*n++
	select {
	case <-ctx.Done():
		return false
	case <-s.owner.Context().Done():
	case <-t.C:
	}
	return true
}

func (s *Sender) count(f func(*SendStats)) {
	s.mu.Lock()
	f(&s.stats)
	s.mu.Unlock()
}

func (s *Sender) lockDevice(ctx context.Context, device string) (func(), error) {
	var sem chan struct{}
	if o, ok := s.owner.(serialiser); ok {
		sem = o.deviceSlot(device)
	} else {
		sem = s.devices.slot(device)
	}
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (s *Sender) command(device, action string, params any, opID string) (wire.Command, error) {
	if !wire.ValidDeviceID(device) {
		return wire.Command{}, fmt.Errorf("%w: device %q", ErrInvalidCommand, device)
	}
	if !wire.ValidAction(action) {
		return wire.Command{}, fmt.Errorf("%w: action %q", ErrInvalidCommand, action)
	}
	if !wire.ValidOpID(opID) {
		return wire.Command{}, fmt.Errorf("%w: op_id %q", ErrInvalidCommand, opID)
	}
	raw, err := paramsJSON(params)
	if err != nil {
		return wire.Command{}, fmt.Errorf("%w: params: %w", ErrInvalidCommand, err)
	}
	lock := ""
	if s.opts.LockFor != nil {
		lock = s.opts.LockFor(device)
	} else if l := s.owner.Locks(); len(l) > 0 {
		lock = l[0]
	}
	fence, err := s.owner.FenceOf(lock)
	if err != nil {
		return wire.Command{}, fmt.Errorf("device %s: %w", device, err)
	}
	if fence < 1 {
		return wire.Command{}, fmt.Errorf("device %s: %w (no fence yet)", device, ErrNotActive)
	}
	cmd := wire.Command{
		V: wire.Version, OpID: opID, Fence: fence, Action: action, Params: raw,
		Lock: lock, Holder: s.owner.Name(), ReplyTo: s.conn.reply,
	}
	if s.opts.SignKey != nil {
		cmd.Device = device // the binding of a signed command (encode)
	}
	return cmd, nil
}

// encode is the command as published: JSON, or with SendOptions.SignKey
// a JWS of it, bound to the gateway and the device.
func (s *Sender) encode(cmd wire.Command) ([]byte, error) {
	if s.opts.SignKey != nil {
		cmd.Gateway = s.conn.opts.Gateway
	}
	payload, err := json.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidCommand, err)
	}
	if s.opts.SignKey == nil {
		return payload, nil
	}
	b, err := jws.Sign(s.opts.SignKey, s.opts.KeyID, payload)
	if err != nil {
		return nil, fmt.Errorf("%w: signing: %w", ErrInvalidCommand, err)
	}
	return b, nil
}

func paramsJSON(p any) (json.RawMessage, error) {
	var b []byte
	switch v := p.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		b = v
	case []byte:
		b = v
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			return nil, err
		}
	}
	t := bytes.TrimSpace(b)
	if len(t) == 0 || string(t) == "null" {
		return nil, nil
	}
	if t[0] != '{' || !json.Valid(t) {
		return nil, errors.New("must be a JSON object")
	}
	if err := wire.CheckParamKeys(t); err != nil {
		return nil, err
	}
	return json.RawMessage(t), nil
}

// Barrier sends the reserved `fence` action to every device (concurrently,
// one per device), so each shuts out older generations before anything
// else is sent. A device counts only when its Result is applied with
// last_fence >= the fence; otherwise Barrier returns ErrBarrier naming the
// devices (and ErrLost if a device showed a newer owner).
func (s *Sender) Barrier(ctx context.Context, devices ...string) error {
	type out struct {
		dev string
		err error
	}
	ch := make(chan out, len(devices))
	var wg sync.WaitGroup
	for _, d := range devices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.Send(ctx, d, wire.ActionFence, nil)
			if err == nil && (r.Status != wire.StatusApplied || r.LastFence < r.Fence || r.Fence == 0) {
				err = fmt.Errorf("result %s/%s last_fence %d", r.Status, r.Code, r.LastFence)
			}
			ch <- out{d, err}
		}()
	}
	wg.Wait()
	close(ch)
	var errs []error
	for o := range ch {
		if o.err != nil {
			errs = append(errs, fmt.Errorf("%w: device %s: %w", ErrBarrier, o.dev, o.err))
		}
	}
	return errors.Join(errs...)
}
