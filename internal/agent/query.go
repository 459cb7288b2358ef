package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/store"
)

// The operator's queries (docs/protocol.md §3), served over HTTP by
// internal/admin. Every read of the store is one bbolt read transaction
// (Store.View): a snapshot that never waits for the commit loop, and short
// (a page) so it never holds bbolt's map.

// Device returns the admin view of one device.
func (a *Agent) Device(dev string) (wire.DeviceInfo, error) {
	rt := a.devs[dev]
	if rt == nil {
		return wire.DeviceInfo{}, fmt.Errorf("%w: %s", ErrUnknownDevice, dev)
	}
	var d store.Device
	var holder string
	if err := a.st.View(func(tx *store.Tx) error {
		var err error
		if d, _, err = tx.Device(dev); err != nil || d.LastOpID == "" {
			return err
		}
		o, _, err := tx.Op(dev, d.LastOpID)
		holder = o.Holder
		return err
	}); err != nil {
		return wire.DeviceInfo{}, err
	}
	// Queue depth is the worker's (a group shares one queue).
	info := wire.DeviceInfo{Device: dev, LastFence: d.LastFence, LastOpID: d.LastOpID,
		QueueDepth: int(rt.w.depth.Load()), Pending: int(rt.pending.Load()),
		Holder: holder, Group: rt.cfg.Group, QueueLimit: int(rt.w.limit), Queryable: rt.drv.Queryable(dev)}
	if !d.UpdatedAt.IsZero() {
		info.UpdatedAt = &d.UpdatedAt
	}
	info.State = stateOrEmpty(d.State)
	if c, tried := rt.lastContact(); tried {
		try := c.tried.UTC()
		info.LastTryAt, info.Reachable = &try, c.reached
		if !c.last.IsZero() {
			at := c.last.UTC()
			info.LastContactAt = &at
		}
	}
	info.FenceConfirmed = true
	if a.o.Fences != nil {
		info.FenceFloor, info.FenceConfirmed = a.o.Fences.Device(dev)
	}
	return info, nil
}

// OpResult returns the recorded outcome of (dev, op) as a Result.
func (a *Agent) OpResult(dev, op string) (wire.Result, error) {
	rt := a.devs[dev]
	if rt == nil {
		return wire.Result{}, fmt.Errorf("%w: %s", ErrUnknownDevice, dev)
	}
	var o store.Op
	var ok bool
	if err := a.st.View(func(tx *store.Tx) error {
		var err error
		o, ok, err = tx.Op(dev, op)
		return err
	}); err != nil {
		return wire.Result{}, err
	}
	if !ok || (o.Status != store.OpFinal && o.Status != store.OpUnknown) {
		return wire.Result{}, fmt.Errorf("%w: %s/%s", ErrNoSuchOp, dev, op)
	}
	return resultOf(o, rt.lastFence.Load(), false), nil
}

// Resolve records an operator's answer for an unknown write on a device that
// cannot be asked (queryable: false): applied ends it applied/ok; not
// applied ends it failed/not_applied, never resent (invariant 6).
//
// An applied write changed the device, so the state the agent knows (and
// policies see) changes too: state, when the operator gives it, is the
// device's state now; otherwise the parameters that were sent are merged
// into the last known state, key by key (what a "set" does on the
// simulated device types). Policies never see the pre-write state of a
// write an operator confirmed.
func (a *Agent) Resolve(ctx context.Context, dev, op string, applied bool, state json.RawMessage) (wire.Result, error) {
	rt := a.devs[dev]
	if rt == nil {
		return wire.Result{}, fmt.Errorf("%w: %s", ErrUnknownDevice, dev)
	}
	if rt.drv.Queryable(dev) && rt.heldOp() != op {
		// A device that can be asked is resolved by the agent, except a
		// write a read-back could not decide: that one is held for an
		// operator (worker.holdReadBack).
		return wire.Result{}, fmt.Errorf("%w: %s", ErrQueryable, dev)
	}
	if err := a.settled(rt); err != nil {
		return wire.Result{}, err
	}
	dec := Operator(applied)
	if !applied {
		state = nil
	}
	var res wire.Result
	var d store.Device
	var o store.Op
	var moved, missing, notUnknown bool
	err := a.st.Update(ctx, func(tx *store.Tx) error {
		var ok bool
		var err error
		o, ok, err = tx.Op(dev, op)
		if err != nil {
			return err
		}
		if !ok {
			missing = true
			return nil
		}
		if o.Status != store.OpUnknown {
			notUnknown = true
			return nil
		}
		if d, moved, err = a.endTx(tx, &o, &dec, state); err != nil {
			return err
		}
		res = resultOf(o, d.LastFence, false)
		return nil
	})
	switch {
	case err != nil:
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			a.fail(err)
		}
		return wire.Result{}, err
	case missing:
		return wire.Result{}, fmt.Errorf("%w: %s/%s", ErrNoSuchOp, dev, op)
	case notUnknown:
		return wire.Result{}, fmt.Errorf("%w: %s/%s", ErrNotUnknown, dev, op)
	}
	a.ended(rt, &o, dec, d, moved)
	select {
	case rt.w.resolve <- struct{}{}:
	default:
	}
	return res, nil
}

// OpEntry is one record in a device's history or in /v1/ops: the recorded
// Result (status and code empty while the command is queued or pending)
// plus the command as received.
type OpEntry struct {
	wire.Result
	Action     string          `json:"action"`
	Params     json.RawMessage `json:"params,omitempty"`
	Holder     string          `json:"holder,omitempty"`
	Lock       string          `json:"lock,omitempty"`
	ReceivedAt time.Time       `json:"received_at"`
	// Extensions: where the record stands (queued, pending, unknown,
	// final), the idempotency key of its last write, and for a held
	// write whether the agent can ask the device (else an operator
	// resolves it).
	Record    store.OpStatus `json:"record"`
	Key       string         `json:"key,omitempty"`
	Queryable *bool          `json:"queryable,omitempty"`
}

// OpPage is a page of GET /v1/devices/{dev}/ops, and GET /v1/ops.
type OpPage struct {
	Ops  []OpEntry `json:"ops"`
	Next string    `json:"next,omitempty"`
}

func (a *Agent) entry(o store.Op, lastFence int64) OpEntry {
	e := OpEntry{Action: o.Action, Params: o.Params, Holder: o.Holder, Lock: o.Lock,
		ReceivedAt: o.ReceivedAt, Record: o.Status, Key: o.Key}
	switch o.Status {
	case store.OpFinal, store.OpUnknown:
		e.Result = resultOf(o, lastFence, false)
	default:
		e.Result = wire.Result{V: wire.Version, OpID: o.OpID, Device: o.Device, Fence: o.Fence, LastFence: lastFence,
			RewrittenParams: rewrittenOf(&o)}
	}
	return e
}

// History returns a page of dev's records, newest first: up to limit
// (1..store.MaxHistory; 0 means 50) that arrived before the cursor ("" for
// the newest).
func (a *Agent) History(dev, cursor string, limit int) (OpPage, error) {
	rt := a.devs[dev]
	if rt == nil {
		return OpPage{}, fmt.Errorf("%w: %s", ErrUnknownDevice, dev)
	}
	var before uint64
	if cursor != "" {
		var err error
		if before, err = strconv.ParseUint(cursor, 10, 64); err != nil || before == 0 {
			return OpPage{}, fmt.Errorf("%w: before=%q is not a cursor from a previous page", ErrBadRequest, cursor)
		}
	}
	var ops []store.Op
	var more bool
	if err := a.st.View(func(tx *store.Tx) error {
		var err error
		ops, more, err = tx.History(dev, before, limit)
		return err
	}); err != nil {
		return OpPage{}, err
	}
	page := OpPage{Ops: make([]OpEntry, 0, len(ops))}
	lf := rt.lastFence.Load()
	for _, o := range ops {
		page.Ops = append(page.Ops, a.entry(o, lf))
	}
	if more && len(ops) > 0 {
		page.Next = strconv.FormatUint(ops[len(ops)-1].InboxSeq, 10)
	}
	return page, nil
}

// HeldUnknown returns every write recorded unknown now, on every device,
// oldest first. Such a write keeps its inbox entry until it is final, so
// the inbox (bounded by the queues) is all there is to read.
func (a *Agent) HeldUnknown() ([]OpEntry, error) {
	out := []OpEntry{}
	err := a.st.View(func(tx *store.Tx) error {
		return tx.Inbox(func(e store.InboxEntry) error {
			o, ok, err := tx.Op(e.Device, e.OpID)
			if err != nil || !ok || o.Status != store.OpUnknown || o.InboxSeq != e.Seq {
				return err
			}
			var lf int64
			q := false
			if rt := a.devs[o.Device]; rt != nil {
				lf, q = rt.lastFence.Load(), rt.drv.Queryable(o.Device)
			}
			en := a.entry(o, lf)
			en.Queryable = &q
			out = append(out, en)
			return nil
		})
	})
	return out, err
}

// oldestHeldAge is how long the oldest write held unknown now has been
// (since it was recorded unknown); 0 when none is, or when the store
// cannot be read.
func (a *Agent) oldestHeldAge() time.Duration {
	if a.held.Load() <= 0 {
		return 0
	}
	held, err := a.HeldUnknown()
	if err != nil || len(held) == 0 {
		return 0
	}
	oldest := held[0].At
	for _, e := range held[1:] {
		if e.At.Before(oldest) {
			oldest = e.At
		}
	}
	return max(0, a.now().Sub(oldest))
}

// StatSeconds is the most seconds Stats returns.
const StatSeconds = statSlots

// Summary is the command path's part of GET /v1/status.
type Summary struct {
	Gateway      string
	Uptime       time.Duration
	StoreOK      bool  // the store commits and the agent has not failed
	HeldUnknown  int64 // writes recorded unknown and not yet final
	EventClients int   // open event subscriptions
}

// Summary returns the gateway's figures for GET /v1/status.
func (a *Agent) Summary() Summary {
	return Summary{Gateway: a.cfg.GatewayID, Uptime: time.Since(a.begun), StoreOK: a.st.Err() == nil && a.Err() == nil,
		HeldUnknown: a.held.Load(), EventClients: int(a.ev.n.Load())}
}

// Done is closed at the agent's hard stop (the end of Stop, or a fatal
// error): an event stream ends then.
func (a *Agent) Done() <-chan struct{} { return a.ctx.Done() }

// Backup writes a consistent copy of the store to w (GET /v1/backup,
// `edge-agent backup --admin`). The copy carries a backup mark, so a start
// on it takes the fence floor (store.Backup, invariant 7).
//
// The copy is written to a file next to the store first and sent from
// there: written straight to w, its read transaction would stay open as
// long as the client takes to read, and every commit that grows the file
// (bbolt remaps it only when no read transaction is open) would wait for
// the client, and the command path with it.
func (a *Agent) Backup(ctx context.Context, w io.Writer) error {
	note := fmt.Sprintf("online backup of gateway %s at %s", a.cfg.GatewayID, a.now().UTC().Format(time.RFC3339))
	err := a.backup(ctx, w, note)
	if err != nil {
		a.log.Error("backup failed", "err", err)
	}
	return err
}

func (a *Agent) backup(ctx context.Context, w io.Writer, note string) error {
	f, err := os.CreateTemp(filepath.Dir(a.st.Path()), ".backup-*.db")
	if err != nil {
		return fmt.Errorf("agent: backup: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := a.st.Backup(ctx, f, note); err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("agent: backup: %w", err)
	}
	_, err = io.Copy(w, f)
	return err
}
