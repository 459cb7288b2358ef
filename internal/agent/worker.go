package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edge-agent/edge-agent/internal/device"
	"github.com/edge-agent/edge-agent/internal/policy"
	"github.com/edge-agent/edge-agent/internal/store"
	"github.com/edge-agent/edge-agent/wire"
)

// worker serialises the commands of one device or one device group, in
// arrival order. Only its worker changes a device's record (admin resolve
// aside, which only finishes an op the worker is holding), so the checks it
// reads outside a transaction cannot go stale before it writes.
type worker struct {
	a     *Agent
	id    string
	devs  []string
	limit int64
	depth atomic.Int64

	mu      sync.Mutex
	fifo    []item
	wake    chan struct{}
	resolve chan struct{} // an operator resolved the held write
	current atomic.Value  // string: op being worked on, for the admin API
}

func newWorker(a *Agent, id string) *worker {
	return &worker{a: a, id: id, wake: make(chan struct{}, 1), resolve: make(chan struct{}, 1)}
}

// item is one inbox entry in a worker's memory. op is the record as the
// intake wrote it, when the entry arrived while running (the worker may
// start on it before the intake's commit is durable: everything the worker
// does that anyone can see comes after its own later commit, which cannot
// succeed unless the intake's did); nil for entries loaded at start-up.
type item struct {
	store.InboxEntry
	op *store.Op
	// ready, when set, means the intake decided op in its admission's
	// commit (pending, last_fence raised to dev's): it is closed once that
	// commit is durable, and nothing may be sent before.
	ready <-chan struct{}
	dev   store.Device
}

func (w *worker) push(e item) {
	w.mu.Lock()
	w.fifo = append(w.fifo, e)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *worker) next() (item, bool) {
	for {
		stopping := w.a.stoppingNow()
		w.mu.Lock()
		// While stopping, only a command decided on arrival is taken: it
		// is already pending, so it is the write in hand (left pending,
		// it would come back unknown after a restart although nothing
		// was sent). Anything else stays queued for the next start.
		if len(w.fifo) > 0 && (!stopping || w.fifo[0].ready != nil) {
			e := w.fifo[0]
			w.mu.Unlock()
			return e, true
		}
		w.mu.Unlock()
		if stopping {
			return item{}, false
		}
		select {
		case <-w.a.stopping:
		case <-w.wake:
		}
	}
}

func (w *worker) pop() {
	w.mu.Lock()
	w.fifo[0] = item{}
	w.fifo = w.fifo[1:]
	w.mu.Unlock()
	d := w.depth.Add(-1)
	w.a.m.queueDepth.WithLabelValues(w.id).Set(float64(d))
}

func (w *worker) run() {
	defer w.a.wg.Done()
	for {
		e, ok := w.next()
		if !ok {
			return
		}
		done, err := w.handle(e)
		if err != nil {
			if !errors.Is(err, errStopping) {
				w.a.fail(fmt.Errorf("agent: worker %s, op %s/%s: %w", w.id, e.Device, e.OpID, err))
			}
			return
		}
		if !done {
			return
		}
		w.pop()
	}
}

// errStopping ends a worker's item early during a stop: the record stays
// as it is (queued, pending or unknown) and recovery resumes it.
var errStopping = errors.New("agent: stopping")

// handle works one inbox entry to its end. done is true when the entry
// left the inbox.
func (w *worker) handle(e item) (bool, error) {
	a := w.a
	var o store.Op
	ok := e.op != nil
	if ok {
		o = *e.op
	} else if err := a.st.View(func(tx *store.Tx) error {
		var err error
		o, ok, err = tx.Op(e.Device, e.OpID)
		return err
	}); err != nil {
		return false, err
	}
	w.current.Store(e.Device + "/" + e.OpID)
	defer w.current.Store("")
	if !ok || o.Status == store.OpFinal || o.InboxSeq != e.Seq {
		// Finished by an operator, or an orphan: just leave the inbox.
		return true, a.st.Update(context.Background(), func(tx *store.Tx) error { return tx.InboxDelete(e.Worker, e.Seq) })
	}
	rt := a.devs[o.Device]
	if e.ready != nil {
		return w.decided(rt, o, e)
	}
	switch o.Status {
	case store.OpQueued:
		return w.decide(rt, o)
	default: // pending (at start-up: counts as unknown) or unknown
		rt.pending.Store(1)
		defer rt.pending.Store(0)
		return w.settle(rt, o)
	}
}

// decide runs the worker's checks in PROTOCOL.md's order: lock_mismatch ->
// expired -> stale_fence -> raise last_fence -> policy -> the device.
func (w *worker) decide(rt *devRT, o store.Op) (bool, error) {
	a := w.a
	now := a.now()
	if rt.cfg.Lock != "" && o.Lock != rt.cfg.Lock {
		return w.finish(rt, o, wire.CodeLockMismatch,
			fmt.Sprintf("lock %q does not match %s's bound lock %q", o.Lock, o.Device, rt.cfg.Lock), false, nil)
	}
	if o.ExpiresAt != nil && now.After(*o.ExpiresAt) {
		return w.finish(rt, o, wire.CodeExpired,
			fmt.Sprintf("reached at %s, after expires_at %s", now.UTC().Format(time.RFC3339Nano), o.ExpiresAt.UTC().Format(time.RFC3339Nano)), false, nil)
	}
	var d store.Device
	var group map[string]json.RawMessage
	err := a.st.View(func(tx *store.Tx) error {
		var err error
		d, _, err = tx.Device(o.Device)
		if err != nil || len(w.devs) < 2 || o.Action == wire.ActionFence {
			return err
		}
		group = map[string]json.RawMessage{}
		for _, m := range w.devs {
			md, _, err := tx.Device(m)
			if err != nil {
				return err
			}
			group[m] = stateOrEmpty(md.State)
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	// Invariant 1: a fence below last_fence never reaches the device.
	if o.Fence < d.LastFence {
		return w.finish(rt, o, wire.CodeStaleFence,
			fmt.Sprintf("fence %d is below %s's last_fence %d", o.Fence, o.Device, d.LastFence), false, nil)
	}
	if o.Action == wire.ActionFence {
		return w.finish(rt, o, wire.CodeOK, fmt.Sprintf("barrier: last_fence is now %d", max(o.Fence, d.LastFence)), true, nil)
	}
	params := stateOrEmpty(o.Params)
	dec, err := a.o.Policy.Evaluate(a.ctx, o.Device, policy.Input{
		Device:    policy.DeviceRef{ID: o.Device, Type: rt.cfg.Type},
		Command:   policy.CommandView{OpID: o.OpID, Fence: o.Fence, Action: o.Action, Params: params, Holder: o.Holder},
		State:     stateOrEmpty(d.State),
		Group:     group,
		LastFence: d.LastFence,
		Now:       now.UTC(),
	})
	if err != nil && a.ctx.Err() != nil {
		return false, errStopping // stopped mid-decision: still queued, decided after restart
	}
	if err != nil {
		// Invariant 5: a policy that cannot decide sends nothing. The
		// command passed the fence check, so last_fence is raised
		// (invariant 1: nothing below it may take effect afterwards).
		return w.drop(rt, o, wire.CodePolicyError, fmt.Sprintf("policy for %s could not decide: %v", o.Device, err), true)
	}
	if !dec.Allow {
		reason := dec.Reason
		if reason == "" {
			reason = "denied by policy"
		}
		return w.finish(rt, o, wire.CodePolicyDenied, reason, true, nil)
	}
	o.ParamsSent = params
	if dec.Params != nil {
		o.ParamsSent, o.Rewritten = dec.Params, true
	}
	// Invariant 3: last_fence and the pending record, with the key of the
	// write, are durable before anything is sent.
	if err := w.newKey(rt, &o, true); err != nil {
		return false, err
	}
	a.crash("after_pending", o.OpID)
	return w.write(rt, o)
}

// decided sends a write the intake decided on arrival, once the admission
// that made it pending is durable (invariant 3).
func (w *worker) decided(rt *devRT, o store.Op, e item) (bool, error) {
	a := w.a
	// Not abandoned on a graceful stop: this is the write in hand. Only a
	// failed commit (nothing is sent: invariant 5) or a hard stop ends it.
	select {
	case <-e.ready:
	case <-a.failed:
		return false, errStopping // the failure is reported by whoever saw it
	case <-a.ctx.Done():
		return false, errStopping // pending, if it became durable: recovery resolves it
	}
	a.fenceKnown(rt, o.Device, e.dev)
	a.crash("after_pending", o.OpID)
	return w.write(rt, o)
}

// stateOrEmpty is s, or the empty object when s is empty (a state, or
// params).
func stateOrEmpty(s json.RawMessage) json.RawMessage {
	if len(s) == 0 {
		return json.RawMessage("{}")
	}
	return s
}

// newKey records a new idempotency key for o as pending (raising last_fence
// when raise is set) before the write under it is sent.
func (w *worker) newKey(rt *devRT, o *store.Op, raise bool) error {
	a := w.a
	var d store.Device
	err := a.st.Update(context.Background(), func(tx *store.Tx) error {
		var err error
		if d, _, err = tx.Device(o.Device); err != nil {
			return err
		}
		if err := a.pendTx(tx, o, &d, raise); err != nil {
			return err
		}
		return tx.PutOp(*o)
	})
	if err != nil {
		return err
	}
	a.fenceKnown(rt, o.Device, d)
	return nil
}

// pendTx makes o pending under a new idempotency key in tx and, with raise,
// raises last_fence to o.Fence in d, the device's record in tx (invariant
// 3: both are durable before the write under the key is sent). The caller
// writes o.
func (a *Agent) pendTx(tx *store.Tx, o *store.Op, d *store.Device, raise bool) error {
	o.Keys++
	o.Key = fmt.Sprintf("%s.%d.%s", o.OpID, o.Keys, a.keyRand())
	o.Status = store.OpPending
	if raise && o.Fence > d.LastFence {
		d.LastFence, d.UpdatedAt = o.Fence, a.now().UTC()
		return tx.PutDevice(o.Device, *d)
	}
	return nil
}

// fenceKnown records a committed last_fence of rt's device (d) in memory and
// publishes the device's state when it moved.
func (a *Agent) fenceKnown(rt *devRT, dev string, d store.Device) {
	if old := rt.lastFence.Swap(d.LastFence); old != d.LastFence {
		a.publishState(dev, d)
	}
}

func (a *Agent) keyRand() string {
	if a.o.KeyRand != nil {
		return a.o.KeyRand()
	}
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// writeTimeout bounds one write, all its tries included.
func writeTimeout(rt *devRT) time.Duration {
	return time.Duration(*rt.cfg.Driver.Retries+1)*(rt.cfg.Driver.Timeout.D()+500*time.Millisecond) + time.Second
}

// write sends o (pending under o.Key) and records its outcome.
func (w *worker) write(rt *devRT, o store.Op) (bool, error) {
	a := w.a
	rt.pending.Store(1)
	defer rt.pending.Store(0)
	if a.ctx.Err() != nil {
		return false, errStopping // the pending record stays; recovery resolves it
	}
	{
		ctx, cancel := context.WithTimeout(a.ctx, writeTimeout(rt))
		start := time.Now()
		res := rt.drv.Apply(ctx, device.Write{Device: o.Device, OpID: o.OpID, Key: o.Key,
			Fence: o.Fence, Action: o.Action, Params: o.ParamsSent})
		cancel()
		a.m.writeSeconds.WithLabelValues(res.Outcome.String()).Observe(time.Since(start).Seconds())
		a.crash("after_write", o.OpID)
		switch res.Outcome {
		case device.Applied:
			return w.applied(rt, o, res.State)
		case device.Refused:
			return w.finish(rt, o, wire.CodeDeviceError, fmt.Sprintf("%s refused the write: %s", o.Device, res.Reason), false, nil)
		case device.NotSent:
			if !o.WasUnknown {
				return w.drop(rt, o, wire.CodeDeviceUnreachable, fmt.Sprintf("%s could not be reached: %s", o.Device, res.Reason), false)
			}
			// Invariant 6: once unknown, held until final; never device_unreachable.
		}
		var err error
		if o, err = w.markUnknown(o, fmt.Sprintf("the write to %s may or may not have happened: %s", o.Device, res.Reason)); err != nil {
			return false, err
		}
		return w.settle(rt, o)
	}
}

// markUnknown records o as unknown and, the first time, publishes the
// unknown Result (recorded before it is published: invariant 4).
func (w *worker) markUnknown(o store.Op, reason string) (store.Op, error) {
	a := w.a
	first := !o.WasUnknown
	o.Status, o.WasUnknown = store.OpUnknown, true
	o.Result, o.Code, o.Reason, o.DecidedAt = wire.StatusUnknown, wire.CodeOutcomeUnknown, reason, a.now().UTC()
	rt := a.devs[o.Device]
	err := a.st.Update(context.Background(), func(tx *store.Tx) error {
		if !first {
			return tx.PutOp(o)
		}
		return a.recordOutcome(tx, &o, rt.lastFence.Load(), nil)
	})
	if err == nil && first {
		a.m.unknowns.Inc()
		a.m.answered(wire.CodeOutcomeUnknown)
	}
	return o, err
}

// settle resolves an unresolved write (pending at start-up, or unknown)
// before anything else of its device or group is sent (invariant 6): ask
// the device; applied ends it; not applied (now tombstoned) sends it again
// under a new key unless it expired. A device that cannot be asked holds
// the write until an operator resolves it.
func (w *worker) settle(rt *devRT, o store.Op) (bool, error) {
	a := w.a
	for attempt := 0; ; attempt++ {
		if !rt.drv.Queryable(o.Device) {
			if o.Status != store.OpUnknown {
				var err error
				if o, err = w.markUnknown(o, fmt.Sprintf("the write to %s may or may not have happened (interrupted); %s cannot be asked: an operator must resolve it", o.Device, o.Device)); err != nil {
					return false, err
				}
			}
			a.log.Warn("write outcome unknown on a device that cannot be asked; held until an operator resolves it",
				"device", o.Device, "op_id", o.OpID, "resolve", fmt.Sprintf("POST /v1/devices/%s/ops/%s/resolve", o.Device, o.OpID))
			select {
			case <-a.stopping:
				return false, errStopping
			case <-w.resolve:
			}
			var ok bool
			err := a.st.View(func(tx *store.Tx) error {
				var err error
				o, ok, err = tx.Op(o.Device, o.OpID)
				return err
			})
			if err != nil {
				return false, err
			}
			if ok && o.Status == store.OpFinal {
				return true, nil // the operator's transaction left the inbox
			}
			continue
		}
		ctx, cancel := context.WithTimeout(a.ctx, rt.cfg.Driver.Timeout.D())
		q, err := rt.drv.Query(ctx, o.Device, o.Key)
		cancel()
		if err != nil {
			a.log.Warn("cannot ask the device about an unresolved write; will ask again", "device", o.Device, "op_id", o.OpID, "key", o.Key, "err", err)
			select {
			case <-a.stopping:
				return false, errStopping
			case <-time.After(a.o.QueryWait(attempt)):
			}
			continue
		}
		if q.Applied {
			return w.applied(rt, o, q.State)
		}
		// Not applied, and the device now refuses that key for ever.
		if now := a.now(); o.ExpiresAt != nil && now.After(*o.ExpiresAt) {
			return w.finish(rt, o, wire.CodeExpired,
				fmt.Sprintf("the write was not applied and expires_at %s has passed; not resent", o.ExpiresAt.UTC().Format(time.RFC3339Nano)), false, nil)
		}
		if a.stoppingNow() {
			return false, errStopping
		}
		// A pending record at start-up counts as unknown: once resent, it
		// is never answered device_unreachable (invariant 6).
		o.WasUnknown = true
		if err := w.newKey(rt, &o, false); err != nil {
			return false, err
		}
		a.crash("after_pending", o.OpID)
		return w.write(rt, o)
	}
}

// applied records a confirmed write and the device's new state.
func (w *worker) applied(rt *devRT, o store.Op, state json.RawMessage) (bool, error) {
	return w.finish(rt, o, wire.CodeOK, fmt.Sprintf("%s applied %s", o.Device, o.Action), false, state)
}

// finish records a final outcome, its Result in the outbox and the inbox
// entry's removal in one transaction; the Result is published after the
// commit (invariants 3 and 4). raise raises last_fence to o.Fence.
func (w *worker) finish(rt *devRT, o store.Op, code wire.Code, reason string, raise bool, state json.RawMessage) (bool, error) {
	a := w.a
	now := a.now().UTC()
	var d store.Device
	err := a.st.Update(context.Background(), func(tx *store.Tx) error {
		var err error
		if d, _, err = tx.Device(o.Device); err != nil {
			return err
		}
		if raise && o.Fence > d.LastFence {
			d.LastFence = o.Fence
		}
		if code == wire.CodeOK {
			d.LastOpID = o.OpID
			switch {
			case state != nil:
				d.State = state
			case o.Action != wire.ActionFence:
				// Applied, but the device did not say its state: what
				// was sent is the best knowledge (policies must not see
				// the state from before a write that happened).
				d.State = mergeState(d.State, o.ParamsSent)
			}
		}
		d.UpdatedAt = now
		o.Status, o.Result, o.Code, o.Reason, o.DecidedAt = store.OpFinal, wire.StatusOf(code), code, reason, now
		o.Output = nil
		if code == wire.CodeOK && o.Action != wire.ActionFence {
			o.Output = stateOrEmpty(state)
		}
		return a.recordOutcome(tx, &o, d.LastFence, &d)
	})
	if err != nil {
		return false, err
	}
	rt.lastFence.Store(d.LastFence)
	a.m.answered(code)
	if code == wire.CodeOK || raise {
		a.publishState(o.Device, d)
	}
	return true, nil
}

// drop ends a command that leaves no record (policy_error,
// device_unreachable): its record and inbox entry go, its Result enters the
// outbox, in one transaction. raise raises last_fence to o.Fence;
// last_fence, if raised earlier, stays raised.
func (w *worker) drop(rt *devRT, o store.Op, code wire.Code, reason string, raise bool) (bool, error) {
	a := w.a
	o.Result, o.Code, o.Reason, o.DecidedAt = wire.StatusOf(code), code, reason, a.now().UTC()
	o.Status = "" // not recorded
	var d store.Device
	raised := false
	err := a.st.Update(context.Background(), func(tx *store.Tx) error {
		var err error
		if d, _, err = tx.Device(o.Device); err != nil {
			return err
		}
		if raise && o.Fence > d.LastFence {
			d.LastFence, d.UpdatedAt, raised = o.Fence, o.DecidedAt, true
			if err := tx.PutDevice(o.Device, d); err != nil {
				return err
			}
		}
		if err := tx.DeleteOp(o.Device, o.OpID); err != nil {
			return err
		}
		return a.recordOutcome(tx, &o, d.LastFence, nil)
	})
	if err != nil {
		return false, err
	}
	rt.lastFence.Store(d.LastFence)
	a.m.answered(code)
	if raised {
		a.publishState(o.Device, d)
	}
	return true, nil
}

// recordOutcome is the one way an outcome is written: o (final, unknown,
// or with an empty Status: not recorded, its record already deleted), its
// Result in the outbox, and, unless o is unknown, its inbox entry's
// removal, in the caller's transaction. dev, when set, is o's device
// record as the outcome leaves it, written with o (store.PutOpDevice). The Result is handed to the
// publisher only after the commit (invariants 3 and 4: durable before
// visible; recorded before published).
func (a *Agent) recordOutcome(tx *store.Tx, o *store.Op, lastFence int64, dev *store.Device) error {
	ob := store.Outbox{Topic: a.destination(o.ReplyTo, o.Device),
		Payload: resultJSON(resultOf(*o, lastFence, false)), Device: o.Device}
	switch {
	case dev != nil:
		ob.OpID = o.OpID
		if err := tx.PutOpDevice(*o, *dev); err != nil {
			return err
		}
	case o.Status != "":
		ob.OpID = o.OpID
		if err := tx.PutOp(*o); err != nil {
			return err
		}
	}
	e, err := tx.OutboxAppend(ob)
	if err != nil {
		return err
	}
	if o.Status != store.OpUnknown {
		if err := tx.InboxDelete(o.Worker, o.InboxSeq); err != nil {
			return err
		}
	}
	tx.OnCommit(func() { a.pub.push(outboxItem(e)) })
	return nil
}
