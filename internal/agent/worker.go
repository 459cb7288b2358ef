package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/device"
	"github.com/edge-agent/edge-agent/internal/failpoint"
	"github.com/edge-agent/edge-agent/internal/policy"
	"github.com/edge-agent/edge-agent/internal/store"
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
	resolve chan struct{}    // an operator resolved the held write
	current atomic.Value     // string: op being worked on, for the admin API
	gauge   prometheus.Gauge // edge_agent_queue_depth of this worker
	// unresolved is how many of the entries recovery queued first are
	// unresolved writes (settleRecovered).
	unresolved int
	// reserved counts admissions deciding on arrival (reserve); exited is
	// set when the worker has ended (both under mu).
	reserved int
	exited   bool
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
		if stopping && w.reserved == 0 {
			w.exited = true
			w.mu.Unlock()
			return item{}, false
		}
		w.mu.Unlock()
		if stopping {
			<-w.wake // an admission deciding on arrival pushes or releases
			continue
		}
		select {
		case <-w.a.stopping:
		case <-w.wake:
		}
	}
}

// reserve is called by an admission that would decide its command on
// arrival: it keeps the worker from ending at a stop until release, so the
// write it makes pending is taken (as the write in hand), never left
// behind. False when the worker has ended: the command stays queued.
func (w *worker) reserve() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.exited {
		return false
	}
	w.reserved++
	return true
}

func (w *worker) release() {
	w.mu.Lock()
	w.reserved--
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *worker) pop() {
	w.mu.Lock()
	w.fifo[0] = item{}
	w.fifo = w.fifo[1:]
	w.mu.Unlock()
	d := w.depth.Add(-1)
	w.gauge.Set(float64(d))
}

func (w *worker) run() {
	defer w.a.wg.Done()
	if err := w.settleRecovered(); err != nil {
		if !errors.Is(err, errStopping) {
			w.a.fail(fmt.Errorf("agent: worker %s, recovery: %w", w.id, err))
		}
		return
	}
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

// Steps of the worker's own, besides decide.go's.
const (
	// stepWrite: the write is durable as pending under o.Key: send it.
	stepWrite Step = 100 + iota
	// stepGone: someone else (an operator) ended the operation.
	stepGone
)

// load returns e's record.
func (w *worker) load(e item) (store.Op, bool, error) {
	if e.op != nil {
		return *e.op, true, nil
	}
	var o store.Op
	var ok bool
	err := w.a.st.View(func(tx *store.Tx) error {
		var err error
		o, ok, err = tx.Op(e.Device, e.OpID)
		return err
	})
	return o, ok, err
}

// handle works one inbox entry to its end. done is true when the entry
// left the inbox.
func (w *worker) handle(e item) (bool, error) {
	a := w.a
	o, ok, err := w.load(e)
	if err != nil {
		return false, err
	}
	w.current.Store(e.Device + "/" + e.OpID)
	defer w.current.Store("")
	if !ok || o.Status == store.OpFinal || o.InboxSeq != e.Seq {
		// Finished by an operator, or an orphan: just leave the inbox.
		return true, a.st.Update(context.Background(), func(tx *store.Tx) error { return tx.InboxDelete(e.Worker, e.Seq) })
	}
	rt := a.devs[o.Device]
	var dec Decision
	switch {
	case e.ready != nil:
		// Decided on arrival: send once the admission that made it
		// pending is durable (invariant 3). Not abandoned on a graceful
		// stop: this is the write in hand. Only a failed commit (nothing
		// is sent: invariant 5) or a hard stop ends it.
		select {
		case <-e.ready:
		case <-a.failed:
			return false, errStopping // the failure is reported by whoever saw it
		case <-a.ctx.Done():
			return false, errStopping // pending, if it became durable: recovery resolves it
		}
		a.fenceKnown(rt, o.Device, e.dev)
		failpoint.Hit(failpoint.AfterPending, o.OpID)
		dec = Decision{Step: stepWrite}
	case o.Status == store.OpQueued:
		if dec, err = w.check(rt, &o); err != nil {
			return false, err
		}
	default: // pending (at start-up: counts as unknown) or unknown
		dec = Decision{Step: StepAsk}
	}
	return w.drive(rt, o, dec)
}

// check runs the worker's checks (decide.go's Check, then the policy).
func (w *worker) check(rt *devRT, o *store.Op) (Decision, error) {
	a := w.a
	now := a.now()
	// The rules (fence_unconfirmed) are read before the device's record: a
	// floor is committed before its device is confirmed, so a confirmed
	// read sees the raised last_fence (and pend checks it again).
	rules := a.rules(rt)
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
		return Decision{}, err
	}
	dec := Check(rules, o, d, now)
	params := stateOrEmpty(o.Params)
	o.ParamsSent = params
	if dec.Step != StepPolicy {
		return dec, nil
	}
	pd, err := a.o.Policy.Evaluate(a.ctx, o.Device, policy.Input{
		Device:    policy.DeviceRef{ID: o.Device, Type: rt.cfg.Type},
		Command:   policy.CommandView{OpID: o.OpID, Fence: o.Fence, Action: o.Action, Params: params, Holder: o.Holder},
		State:     stateOrEmpty(d.State),
		Group:     group,
		LastFence: d.LastFence,
		Now:       now.UTC(),
	})
	if err != nil && a.ctx.Err() != nil {
		return Decision{}, errStopping // stopped mid-decision: still queued, decided after restart
	}
	if err == nil && pd.Allow && pd.Params != nil {
		o.ParamsSent, o.Rewritten = pd.Params, true
	}
	return AfterPolicy(o, pd, err), nil
}

// drive carries o from dec to its end: a loop over decide.go's steps, so
// however often a write is resent, the stack does not grow.
func (w *worker) drive(rt *devRT, o store.Op, dec Decision) (bool, error) {
	a := w.a
	var state json.RawMessage
	var err error
	var raise bool // the last StepSend's
	// The admin API's "pending" is 1 from the write's pending record to
	// its end, without a gap between the steps (an unknown Result is
	// published between the write and the asking).
	defer rt.pending.Store(0)
	for {
		if dec.Step != StepEnd && dec.Step != stepGone {
			rt.pending.Store(1)
		}
		switch dec.Step {
		case StepEnd:
			return true, w.end(rt, &o, dec, state)
		case stepGone:
			return true, nil // the operator's transaction left the inbox
		case StepSend:
			if rt.rb != nil && !o.WasUnknown {
				// Read back: the points the write sets are read first,
				// and the reading goes into the pending record with the
				// key (durable before the write: a recovered write can
				// still be read back).
				if next := w.reading(rt, &o); next.Step != StepSend {
					dec = next
					continue
				}
			}
			if err := w.awaitProven(&o); err != nil {
				return false, err
			}
			// Invariant 3: last_fence and the pending record, with the
			// key of the write, are durable before anything is sent.
			raise = dec.Raise
			stale, err := w.pend(rt, &o, dec.Raise)
			if err != nil {
				return false, err
			}
			if stale != nil {
				dec = *stale
				continue
			}
			failpoint.Hit(failpoint.AfterPending, o.OpID)
			dec = Decision{Step: stepWrite}
		case stepWrite:
			if !w.a.proven() {
				// The session stopped being proven after the pending
				// record: this key is never sent. Once proven again (a
				// new activation, the takeover floor taken first), pend
				// judges the op against the floor under a new key.
				dec = Decision{Step: StepSend, Raise: raise}
				continue
			}
			if dec, state, err = w.write(rt, &o); err != nil {
				return false, err
			}
		case StepUnknown:
			if err := w.markUnknown(&o, dec.Reason); err != nil {
				return false, err
			}
			dec = Decision{Step: StepAsk}
		case StepAsk:
			if dec, state, err = w.ask(rt, &o); err != nil {
				return false, err
			}
		case StepHold:
			if dec, state, err = w.holdReadBack(rt, &o, dec.Reason); err != nil {
				return false, err
			}
		case StepResend:
			// The device confirmed the key unapplied and tombstoned it:
			// nothing of the last try can land any more. Back off, then
			// send the operation again under a new key. Once unknown, it
			// is never answered device_unreachable (invariant 6).
			if err := w.pause(a.resendWait(o.Keys)); err != nil {
				return false, err
			}
			if err := w.awaitConfirmed(rt, &o); err != nil {
				return false, err
			}
			o.WasUnknown = true
			dec = BeforeResend(&o, a.now())
		default:
			return false, fmt.Errorf("agent: internal error: step %v", dec.Step)
		}
	}
}

// pause waits d, or returns errStopping when the agent stops first.
func (w *worker) pause(d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.a.stopping:
		return errStopping
	case <-t.C:
		return nil
	}
}

// awaitConfirmed waits, before a resend, until the device's fences are
// confirmed (docs/protocol.md §7). A write recovered pending from a store
// whose memory may be incomplete (a copy put back, a restored backup) was
// never checked against the fence floor: the agent may since have resent
// and applied it under another key that this store does not know. So it
// is not sent again before the floor is taken, and pend's Refloored then
// judges it against the floor (invariants 2 and 7). The write stays
// unresolved meanwhile, holding its device (invariant 6).
func (w *worker) awaitConfirmed(rt *devRT, o *store.Op) error {
	for logged := false; w.a.rules(rt).Unconfirmed; logged = true {
		if !logged {
			w.a.log.Warn("a write the device confirmed unapplied is not sent again until the device's fence floor is taken",
				"device", o.Device, "op_id", o.OpID)
		}
		if err := w.pause(200 * time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// proven is Options.Proven: whether a write may be sent now.
func (a *Agent) proven() bool { return a.o.Proven == nil || a.o.Proven() }

// awaitProven waits, before a write's pending record, until the session
// is proven alive (docs/protocol.md §8: a deposed or standby agent sends
// no write). The op stays in the store meanwhile, holding its device.
// Questions about an unresolved write are not held back: a deposed active
// that resolves them goes on to answer what it queued behind them
// fence_unconfirmed (not final) while it is deposed, instead of a final
// stale_fence once it is active again that could contradict the Result
// the other agent gave a resend (invariant 8,
// e2e.TestHADeposedInboxDoesNotContradictTheOtherActive).
func (w *worker) awaitProven(o *store.Op) error {
	for logged := false; !w.a.proven(); logged = true {
		if !logged {
			w.a.log.Warn("no write is sent while the coordination session is not proven alive (ha: standing down)",
				"device", o.Device, "op_id", o.OpID)
		}
		if err := w.pause(100 * time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// resendWait is the pause before the n-th resend: exponential from 200ms,
// capped at 10s, with jitter (half to all of it), so a device that keeps
// failing is not hammered.
func (a *Agent) resendWait(n int) time.Duration {
	if a.o.ResendWait != nil {
		return a.o.ResendWait(n)
	}
	d := min(200*time.Millisecond<<min(max(n-1, 0), 6), 10*time.Second)
	return d/2 + time.Duration(mrand.Int64N(int64(d/2)+1))
}

// stateOrEmpty is s, or the empty object when s is empty (a state, or
// params).
func stateOrEmpty(s json.RawMessage) json.RawMessage {
	if len(s) == 0 {
		return json.RawMessage("{}")
	}
	return s
}

// pend records a new idempotency key for o as pending (raising last_fence
// when raise is set) before the write under it is sent. When a fence floor
// raised last_fence above o's fence since it was checked, nothing is
// written and stale is the decision instead (Refloored).
func (w *worker) pend(rt *devRT, o *store.Op, raise bool) (stale *Decision, err error) {
	a := w.a
	var d store.Device
	wasUnknown := o.Status == store.OpUnknown // a resend after a confirmed "not applied"
	err = a.st.Update(context.Background(), func(tx *store.Tx) error {
		var err error
		if d, _, err = tx.Device(o.Device); err != nil {
			return err
		}
		if dec, ok := Refloored(o, d); !ok {
			stale = &dec
			return nil
		}
		if err := a.pendTx(tx, o, &d, raise); err != nil {
			return err
		}
		if wasUnknown {
			tx.OnCommit(func() { a.heldBy(rt, -1) })
		}
		return tx.PutOp(*o)
	})
	if err != nil || stale != nil {
		return stale, err
	}
	a.fenceKnown(rt, o.Device, d)
	a.heldChanged(rt, o.Device, d) // no longer unknown: held_writes falls
	return nil, nil
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
	if b, ok := rt.drv.(device.Bounded); ok {
		w, _ := b.Bounds(rt.cfg.ID)
		return w
	}
	return time.Duration(rt.cfg.Retries+1)*(rt.cfg.Timeout+500*time.Millisecond) + time.Second
}

// write sends o (pending under o.Key) and classifies its outcome.
func (w *worker) write(rt *devRT, o *store.Op) (Decision, json.RawMessage, error) {
	a := w.a
	if a.ctx.Err() != nil {
		return Decision{}, nil, errStopping // the pending record stays; recovery resolves it
	}
	ctx, cancel := context.WithTimeout(a.ctx, writeTimeout(rt))
	start := time.Now()
	dw := w.devWrite(o)
	if a.o.Proven != nil {
		// A driver's retry is a write too: none once the session is
		// not proven (a deposed active woken from a pause, §8).
		dw.MayTry = a.proven
	}
	res := rt.drv.Apply(ctx, dw)
	cancel()
	rt.wroteNow()
	rt.wroteWith(a.now(), res.Outcome)
	a.m.writeSeconds.WithLabelValues(res.Outcome.String()).Observe(time.Since(start).Seconds())
	failpoint.Hit(failpoint.AfterWrite, o.OpID)
	return AfterWrite(o, res), res.State, nil
}

// markUnknown records o as unknown and, the first time for this operation,
// publishes the unknown Result (recorded before it is published: invariant
// 4). The first time is the op's own: a write recovered as pending and
// resent, or resent after a tombstone, publishes its first unknown too.
func (w *worker) markUnknown(o *store.Op, reason string) error {
	a := w.a
	first := !o.UnknownSent
	o.Status, o.WasUnknown, o.UnknownSent = store.OpUnknown, true, true
	o.Result, o.Code, o.Reason, o.DecidedAt = wire.StatusUnknown, wire.CodeOutcomeUnknown, reason, a.now().UTC()
	rt := a.devs[o.Device]
	var d store.Device
	err := a.st.Update(context.Background(), func(tx *store.Tx) error {
		// Counted before the unknown Result is handed to the publisher
		// (the hooks run in order), so whoever sees it sees the count.
		tx.OnCommit(func() { a.heldBy(rt, 1) })
		var err error
		if d, _, err = tx.Device(o.Device); err != nil {
			return err
		}
		if !first {
			return tx.PutOp(*o)
		}
		return a.recordOutcome(tx, o, rt.lastFence.Load(), nil)
	})
	if err != nil {
		return err
	}
	// After the unknown Result: the DeviceState says the device holds it.
	a.heldChanged(rt, o.Device, d)
	if first {
		a.m.unknowns.Inc()
		a.observe(&outcome{dev: o.Device, opID: o.OpID, fence: o.Fence, action: o.Action, holder: o.Holder,
			code: wire.CodeOutcomeUnknown, reason: reason, took: a.now().Sub(o.ReceivedAt), rewritten: rewrittenOf(o)})
	}
	return nil
}

// ask resolves an unresolved write (pending at start-up, or unknown)
// before anything else of its device or group is sent (invariant 6): it
// asks the device about the key until it answers, and decides with
// AfterQuery. A device that cannot be asked holds the write until an
// operator resolves it (stepGone).
func (w *worker) ask(rt *devRT, o *store.Op) (Decision, json.RawMessage, error) {
	a := w.a
	if !rt.drv.Queryable(o.Device) {
		return w.hold(o)
	}
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(a.ctx, queryTimeout(rt))
		var q device.QueryResult
		var err error
		if rt.rb != nil {
			q, err = rt.rb.ReadBack(ctx, w.devWrite(o))
		} else {
			q, err = rt.drv.Query(ctx, o.Device, o.Key)
		}
		cancel()
		rt.contacted(a.now(), err == nil)
		if err == nil {
			return AfterQuery(a.rules(rt), o, q, a.now()), q.State, nil
		}
		a.log.Warn("cannot ask the device about an unresolved write; will ask again", "device", o.Device, "op_id", o.OpID, "key", o.Key, "err", err)
		if o.Status != store.OpUnknown {
			// A write interrupted by a restart that cannot be resolved
			// now is held as unknown like any other: recorded, published
			// (once), and replayed as unknown to a resend.
			if err := w.markUnknown(o, fmt.Sprintf("the write to %s may or may not have happened (interrupted); %s cannot be asked now: %v", o.Device, o.Device, err)); err != nil {
				return Decision{}, nil, err
			}
		}
		if err := w.pause(a.o.QueryWait(attempt)); err != nil {
			return Decision{}, nil, err
		}
	}
}

// hold waits for an operator's answer about o on a device that cannot be
// asked. An interrupted write (pending at start-up) is recorded and
// published unknown first.
func (w *worker) hold(o *store.Op) (Decision, json.RawMessage, error) {
	a := w.a
	if o.Status != store.OpUnknown {
		if err := w.markUnknown(o, fmt.Sprintf("the write to %s may or may not have happened (interrupted); %s cannot be asked: an operator must resolve it", o.Device, o.Device)); err != nil {
			return Decision{}, nil, err
		}
	}
	for {
		a.log.Warn("write outcome unknown on a device that cannot be asked; held until an operator resolves it",
			"device", o.Device, "op_id", o.OpID, "resolve", fmt.Sprintf("POST /v1/devices/%s/ops/%s/resolve", o.Device, o.OpID))
		select {
		case <-a.stopping:
			return Decision{}, nil, errStopping
		case <-w.resolve:
		}
		rec, ok, err := w.load(item{InboxEntry: store.InboxEntry{Device: o.Device, OpID: o.OpID}})
		if err != nil {
			return Decision{}, nil, err
		}
		if ok && rec.Status == store.OpFinal {
			return Decision{Step: stepGone}, nil, nil
		}
	}
}

// end records dec's outcome and the inbox entry's removal in one
// transaction (endTx); the Result is published after the commit
// (invariants 3 and 4).
func (w *worker) end(rt *devRT, o *store.Op, dec Decision, state json.RawMessage) error {
	a := w.a
	var d store.Device
	var moved bool
	err := a.st.Update(context.Background(), func(tx *store.Tx) error {
		var err error
		d, moved, err = a.endTx(tx, o, &dec, state)
		return err
	})
	if err != nil {
		return err
	}
	failpoint.Hit(failpoint.AfterOutcome, o.OpID)
	a.ended(rt, o, dec, d, moved)
	return nil
}

// ended updates memory, metrics, the log and the retained state after an
// outcome's commit (o as endTx left it).
func (a *Agent) ended(rt *devRT, o *store.Op, dec Decision, d store.Device, moved bool) {
	rt.lastFence.Store(d.LastFence)
	a.observe(&outcome{dev: o.Device, opID: o.OpID, fence: o.Fence, action: o.Action, holder: o.Holder,
		code: dec.Code, reason: dec.Reason, took: a.now().Sub(o.ReceivedAt), rewritten: rewrittenOf(o)})
	if moved {
		a.publishState(o.Device, d)
	} else {
		a.heldChanged(rt, o.Device, d) // an unknown write ended: held_writes falls
	}
}

// endTx is the one way an operation ends, in the caller's transaction:
// with dec.Raise, last_fence is raised to o.Fence; an applied write sets
// the device's state (state as the device reported it; without it, the
// parameters sent merged into the last known state: policies must not see
// the state from before a write that happened); o becomes final with
// dec's code (every outcome a worker decides, device_unreachable and
// policy_error included: invariant 8, a resend, redelivery or replay
// meets the record and never runs after a final Result), or, for an
// outcome that is not recorded (an orphan of a device no longer
// configured, at start-up), its record goes (last_fence, if raised, stays
// raised); the Result enters the outbox and
// the inbox entry goes (recordOutcome). moved reports whether the device's
// record changed in a way its DeviceState shows.
//
// A decision that raises (a barrier, a policy's outcome) is checked
// against last_fence again here (Refloored): a floor taken since the check
// makes it stale_fence, and dec says so for the caller.
func (a *Agent) endTx(tx *store.Tx, o *store.Op, dec *Decision, state json.RawMessage) (d store.Device, moved bool, err error) {
	if o.Status == store.OpUnknown {
		// No longer held: counted before the final Result is handed to
		// the publisher (the hooks run in order).
		tx.OnCommit(func() { a.heldBy(a.devs[o.Device], -1) })
	}
	now := a.now().UTC()
	if d, _, err = tx.Device(o.Device); err != nil {
		return d, false, err
	}
	if dec.Raise {
		if stale, ok := Refloored(o, d); !ok {
			*dec = stale
		}
	}
	if dec.Raise && o.Fence > d.LastFence {
		d.LastFence, moved = o.Fence, true
	}
	ok := dec.Code == wire.CodeOK
	if ok {
		d.LastOpID, moved = o.OpID, true
		switch {
		case len(state) > 0:
			d.State = state
		case o.Action != wire.ActionFence:
			d.State = mergeState(d.State, o.ParamsSent)
		}
	}
	if moved {
		d.UpdatedAt = now
	}
	o.Result, o.Code, o.Reason, o.DecidedAt = wire.StatusOf(dec.Code), dec.Code, dec.Reason, now
	o.Output = nil
	if ok && o.Action != wire.ActionFence {
		o.Output = stateOrEmpty(d.State)
	}
	if !dec.Recorded() {
		o.Status = "" // not recorded
		if moved {
			if err := tx.PutDevice(o.Device, d); err != nil {
				return d, false, err
			}
		}
		if err := tx.DeleteOp(o.Device, o.OpID); err != nil {
			return d, false, err
		}
		return d, moved, a.recordOutcome(tx, o, d.LastFence, nil)
	}
	o.Status = store.OpFinal
	return d, moved, a.recordOutcome(tx, o, d.LastFence, &d)
}

// recordOutcome is the one way an outcome is written: o (final, unknown,
// or with an empty Status: not recorded, its record already deleted), its
// Result in the outbox, and, unless o is unknown, its inbox entry's
// removal, in the caller's transaction. dev, when set, is o's device
// record as the outcome leaves it, written with o (store.PutOpDevice). The
// Result is handed to the publisher only after the commit (invariants 3
// and 4: durable before visible; recorded before published).
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

// mergeState merges the top-level keys of params into state (both JSON
// objects; anything unreadable yields params alone).
func mergeState(state, params json.RawMessage) json.RawMessage {
	m := map[string]json.RawMessage{}
	if len(state) > 0 && json.Unmarshal(state, &m) != nil {
		m = map[string]json.RawMessage{}
	}
	var p map[string]json.RawMessage
	if len(params) > 0 && json.Unmarshal(params, &p) == nil {
		for k, v := range p {
			m[k] = v
		}
	}
	return mustJSON(m)
}
