package agent

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/edge-agent/edge-agent/internal/policy"
	"github.com/edge-agent/edge-agent/internal/store"
	"github.com/edge-agent/edge-agent/wire"
)

// admitKind is what the intake decided for one delivery.
type admitKind int

const (
	admitIgnore   admitKind = iota // acknowledged only (retained, empty payload)
	admitAnswer                    // answered on arrival (invalid, unknown_device)
	admitQueued                    // entered the inbox
	admitInFlight                  // a resend of a queued or pending op: acknowledged only
	admitReplay                    // a resend of a recorded op: its Result replayed
	admitConflict                  // same op_id, other command: op_conflict
	admitBusy                      // the worker's queue is full
)

// arrival is one delivery on its way to its acknowledgement. The acker
// handles arrivals strictly in arrival order.
type arrival struct {
	d      Delivery
	done   <-chan error // the admission's commit; nil when no store write was needed
	kind   admitKind
	cmd    wire.Command
	dev    string
	rec    store.Op // for replays
	entry  store.InboxEntry
	answer *wire.Result
	topic  string // where answer goes
}

func (a *Agent) intakeLoop() {
	defer a.wg.Done()
	defer close(a.acks)
	for {
		select {
		case <-a.stopping:
			return
		case d := <-a.incoming:
			ar := a.admit(d)
			select {
			case a.acks <- ar:
			case <-a.failed:
				return
			}
		}
	}
}

// admit runs the checks on arrival (PROTOCOL.md §1, order of checks 1) and
// submits the admission to the group commit without waiting for it, so one
// MQTT session's commands share fsyncs.
func (a *Agent) admit(d Delivery) *arrival {
	ar := &arrival{d: d}
	pfx, gw := a.cfg.MQTT.TopicPrefix, a.cfg.GatewayID
	if d.Retained {
		// A replay of a retained message is never a command: log, count,
		// clear it.
		a.m.retained.Inc()
		if len(d.Payload) > 0 {
			a.log.Warn("ignoring a retained message on a cmd topic, and clearing it", "topic", d.Topic)
			a.pub.push(pubItem{topic: d.Topic, payload: nil, retained: true, dev: d.Topic})
		}
		return ar
	}
	if len(d.Payload) == 0 {
		return ar
	}
	dev, ok := wire.DeviceFromCmdTopic(pfx, gw, d.Topic)
	if !ok {
		a.log.Warn("ignoring a message on an unexpected topic", "topic", d.Topic)
		return ar
	}
	ar.dev = dev
	cmd, err := wire.ParseCommand(d.Payload)
	if err != nil {
		var pe *wire.ParseError
		errors.As(err, &pe)
		rt := a.devs[dev]
		var lf int64
		if rt != nil {
			lf = rt.lastFence.Load()
		}
		ar.kind, ar.topic = admitAnswer, a.destination(pe.ReplyTo, dev)
		if !wire.ValidPublishTopic(ar.topic) {
			ar.kind = admitIgnore
			return ar
		}
		ar.answer = &wire.Result{V: wire.Version, OpID: pe.OpID, Device: dev, Fence: pe.Fence,
			Status: wire.StatusRejected, Code: wire.CodeInvalid, Reason: pe.Reason, LastFence: lf, At: a.now().UTC()}
		return ar
	}
	ar.cmd = cmd
	ar.topic = a.destination(cmd.ReplyTo, dev)
	rt := a.devs[dev]
	if rt == nil {
		ar.kind = admitAnswer
		ar.answer = &wire.Result{V: wire.Version, OpID: cmd.OpID, Device: dev, Fence: cmd.Fence,
			Status: wire.StatusRejected, Code: wire.CodeUnknownDevice,
			Reason: fmt.Sprintf("device %q is not configured on gateway %s", dev, gw), At: a.now().UTC()}
		return ar
	}
	hash, err := wire.ContentHash(cmd.Action, cmd.Params)
	if err != nil { // cannot happen after ParseCommand; answer rather than guess
		ar.kind = admitAnswer
		ar.answer = &wire.Result{V: wire.Version, OpID: cmd.OpID, Device: dev, Fence: cmd.Fence,
			Status: wire.StatusRejected, Code: wire.CodeInvalid, Reason: err.Error(), LastFence: rt.lastFence.Load(), At: a.now().UTC()}
		return ar
	}
	w := rt.w
	now := a.now()
	ar.done = a.st.Submit(a.ctx, func(tx *store.Tx) error {
		// Dedup against the record, inside the same serial commit stream
		// as every other admission, so two deliveries of one op_id cannot
		// both enter the inbox (invariant 2).
		o, ok, err := tx.Op(dev, cmd.OpID)
		if err != nil {
			return err
		}
		if ok {
			switch {
			case !bytes.Equal(o.ContentHash, hash):
				ar.kind = admitConflict
			case o.Status == store.OpFinal || o.Status == store.OpUnknown:
				ar.kind, ar.rec = admitReplay, o
			default:
				ar.kind = admitInFlight
			}
			return nil
		}
		// The inbox holds the command in hand plus up to limit waiting.
		if w.depth.Load() > w.limit {
			ar.kind = admitBusy
			return nil
		}
		seq, err := tx.InboxAppend(w.id, dev, cmd.OpID)
		if err != nil {
			return err
		}
		o = store.Op{Device: dev, OpID: cmd.OpID, Status: store.OpQueued,
			Fence: cmd.Fence, Action: cmd.Action, Params: cmd.Params, Lock: cmd.Lock,
			Holder: cmd.Holder, ExpiresAt: cmd.ExpiresAt, ReplyTo: cmd.ReplyTo,
			ContentHash: hash, Worker: w.id, InboxSeq: seq, ReceivedAt: now.UTC()}
		it := item{InboxEntry: store.InboxEntry{Worker: w.id, Seq: seq, Device: dev, OpID: cmd.OpID}, op: &o}
		if w.depth.Load() == 0 && a.decidedOnArrival(rt, &o, now) {
			// The worker is idle and nothing but the fence is left to
			// check: decide here, and make this commit the pending write's
			// (invariant 3: last_fence and the pending record with its
			// key are durable before the worker sends anything; it waits
			// for this commit). One commit less on the command's path.
			d, _, err := tx.Device(dev)
			if err != nil {
				return err
			}
			// Invariant 1: a fence below last_fence is left to the
			// worker, which rejects it.
			if o.Fence >= d.LastFence {
				o.ParamsSent = stateOrEmpty(o.Params)
				if err := a.pendTx(tx, &o, &d, true); err != nil {
					return err
				}
				ready := make(chan struct{})
				tx.OnCommit(func() { close(ready) })
				it.ready, it.dev = ready, d
			}
		}
		if err := tx.PutOp(o); err != nil {
			return err
		}
		w.depth.Add(1)
		ar.kind = admitQueued
		ar.entry = it.InboxEntry
		// Hand it to the worker now, in commit order (= arrival order),
		// without waiting for the fsync: the worker's own next commit
		// lands in a later batch, so nothing it does becomes visible
		// unless this admission is durable (invariant 3); an item
		// decided here carries the commit's signal and is not sent
		// before it.
		w.push(it)
		return nil
	})
	return ar
}

// decidedOnArrival reports whether o can be decided in its admission's
// commit: every check before the fence passes (PROTOCOL.md order: lock,
// expires_at), no policy is bound to the device, and it is a write (a
// barrier is left to the worker). Anything else is left to the worker,
// which runs every check in order.
func (a *Agent) decidedOnArrival(rt *devRT, o *store.Op, now time.Time) bool {
	if o.Action == wire.ActionFence {
		return false
	}
	if rt.cfg.Lock != "" && o.Lock != rt.cfg.Lock {
		return false
	}
	if o.ExpiresAt != nil && now.After(*o.ExpiresAt) {
		return false
	}
	b, ok := a.o.Policy.(policy.Binder)
	return ok && !b.Bound(o.Device)
}

// ackLoop acknowledges deliveries strictly in arrival order, each once its
// admission is durable (invariant 3: durable before acknowledged) or it has
// been answered. A failed commit stops it: nothing more is acknowledged
// (invariant 5), so the broker redelivers to the next session.
func (a *Agent) ackLoop() {
	defer a.wg.Done()
	for ar := range a.acks {
		if ar.done != nil {
			if err := <-ar.done; err != nil {
				a.fail(fmt.Errorf("agent: admitting %s/%s: %w", ar.dev, ar.cmd.OpID, err))
				return
			}
		}
		select {
		case <-a.failed: // invariant 5: nothing answered or acknowledged after a store failure
			return
		default:
		}
		switch ar.kind {
		case admitQueued:
			a.m.queueDepth.WithLabelValues(ar.entry.Worker).Set(float64(a.devs[ar.dev].w.depth.Load()))
		case admitAnswer:
			a.answerNow(ar.topic, *ar.answer)
		case admitReplay:
			if ar.rec.Status == store.OpUnknown {
				// It may have become final since: replay what is recorded now.
				a.st.View(func(tx *store.Tx) error {
					if o, ok, err := tx.Op(ar.dev, ar.cmd.OpID); err == nil && ok {
						ar.rec = o
					}
					return nil
				})
			}
			r := resultOf(ar.rec, a.devs[ar.dev].lastFence.Load(), true)
			r.OpID, r.Fence = ar.cmd.OpID, ar.cmd.Fence
			a.m.replays.Inc()
			a.answerNow(ar.topic, r)
		case admitConflict:
			rt := a.devs[ar.dev]
			a.answerNow(ar.topic, wire.Result{V: wire.Version, OpID: ar.cmd.OpID, Device: ar.dev, Fence: ar.cmd.Fence,
				Status: wire.StatusRejected, Code: wire.CodeOpConflict,
				Reason:    fmt.Sprintf("op_id %s was already used on %s with a different action or params", ar.cmd.OpID, ar.dev),
				LastFence: rt.lastFence.Load(), At: a.now().UTC()})
		case admitBusy:
			rt := a.devs[ar.dev]
			a.answerNow(ar.topic, wire.Result{V: wire.Version, OpID: ar.cmd.OpID, Device: ar.dev, Fence: ar.cmd.Fence,
				Status: wire.StatusRejected, Code: wire.CodeBusy,
				Reason:    fmt.Sprintf("the queue of %s is full (%d commands); retry later with backoff", ar.dev, rt.w.limit),
				LastFence: rt.lastFence.Load(), At: a.now().UTC()})
		}
		if ar.kind == admitQueued && a.crashArmed("before_ack", ar.cmd.OpID) {
			a.waitPublished(ar.dev, ar.cmd.OpID, 10*time.Second)
			a.crash("before_ack", ar.cmd.OpID)
		}
		if ar.d.Ack != nil {
			ar.d.Ack()
		}
	}
}

// answerNow publishes a Result that is not recorded (answered on arrival)
// through the ordered publisher, and waits (bounded) for the broker to take
// it before the delivery is acknowledged. Not answered in time: logged;
// the controller resends until it sees a Result.
func (a *Agent) answerNow(topic string, r wire.Result) {
	a.m.answered(r.Code)
	done := make(chan struct{})
	a.pub.push(pubItem{topic: topic, payload: resultJSON(r), dev: r.Device, done: done})
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		a.log.Warn("an answer was not confirmed published within 5s", "topic", topic, "op_id", r.OpID, "code", r.Code)
	case <-a.ctx.Done():
	}
}
