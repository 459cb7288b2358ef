package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/clip"
	"github.com/edge-agent/edge-agent/internal/failpoint"
	"github.com/edge-agent/edge-agent/internal/store"
	"github.com/edge-agent/edge-agent/internal/wirefast"
)

// arrival is one delivery on its way to its acknowledgement. The acker
// handles arrivals strictly in arrival order.
type arrival struct {
	d      Delivery
	done   <-chan error // the admission's commit; nil when no store write was needed
	kind   Admission
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
	lanes := map[string]*lane{}
	for {
		select {
		case <-a.stopping:
			return
		case d := <-a.incoming:
			a.toLane(lanes, d) // read on its worker's lane (lanes.go)
		case o := <-a.opened:
			if a.stoppingNow() {
				return // left unacknowledged: the broker redelivers it
			}
			ar := a.admit(o)
			select {
			case a.acks <- ar:
			case <-a.failed:
				return
			case <-a.ctx.Done(): // hard stop; the acker may have returned
				return
			}
		}
	}
}

// admit runs the checks on arrival (docs/protocol.md §1, order of checks 1:
// decide.go's Arrive and Dedup) and submits the admission to the group
// commit without waiting for it, so one MQTT session's commands share
// fsyncs.
func (a *Agent) admit(o opened) *arrival {
	d := o.d
	ar := &arrival{d: d, kind: AdmitIgnore}
	pfx, gw := a.cfg.TopicPrefix, a.cfg.GatewayID
	dev, isCmd := wire.DeviceFromCmdTopic(pfx, gw, d.Topic)
	cmd, unauth, pe := o.cmd, o.unauth, o.pe
	a.logArrival(dev, &cmd, d.Retained, len(d.Payload))
	rt := a.devs[dev]
	kind, code := Arrive(Arrival{Retained: d.Retained, Empty: len(d.Payload) == 0, CmdTopic: isCmd,
		Unauthorized: unauth != nil, ParseErr: pe, Known: rt != nil})
	ar.dev, ar.cmd = dev, cmd
	switch {
	case d.Retained:
		// A replay of a retained message is never a command: log, count,
		// clear it.
		a.m.retained.Inc()
		if len(d.Payload) > 0 {
			a.log.Warn("ignoring a retained message on a cmd topic, and clearing it", "topic", clip.String(d.Topic, 120))
			a.pub.push(pubItem{topic: d.Topic, payload: nil, retained: true, dev: d.Topic})
		}
		return ar
	case kind == AdmitIgnore:
		if len(d.Payload) > 0 {
			a.log.Warn("ignoring a message on an unexpected topic", "topic", clip.String(d.Topic, 120))
		}
		return ar
	case code == wire.CodeUnauthorized:
		a.unauthorized(ar, dev, d.Payload, unauth)
		return ar
	case kind == AdmitAnswer:
		var lf int64
		if rt != nil {
			lf = rt.lastFence.Load()
		}
		r := wire.Result{V: wire.Version, OpID: cmd.OpID, Device: dev, Fence: cmd.Fence,
			Status: wire.StatusOf(code), Code: code, LastFence: lf, At: a.now().UTC()}
		replyTo := cmd.ReplyTo
		switch code {
		case wire.CodeInvalid:
			r.OpID, r.Fence, r.Reason, replyTo = pe.OpID, pe.Fence, pe.Reason, pe.ReplyTo
		case wire.CodeUnknownDevice:
			r.Reason = fmt.Sprintf("device %q is not configured on gateway %s", clip.String(dev, 80), gw)
		}
		a.answerOnArrival(ar, replyTo, r)
		return ar
	}
	ar.topic = a.destination(cmd.ReplyTo, dev)
	hash, err := wirefast.ContentHash(cmd.Action, cmd.Params)
	if err != nil { // cannot happen after ParseCommand; answer rather than guess
		a.answerOnArrival(ar, cmd.ReplyTo, wire.Result{V: wire.Version, OpID: cmd.OpID, Device: dev, Fence: cmd.Fence,
			Status: wire.StatusRejected, Code: wire.CodeInvalid, Reason: err.Error(), LastFence: rt.lastFence.Load(), At: a.now().UTC()})
		return ar
	}
	w := rt.w
	received := a.now()
	ar.done = a.st.Submit(a.ctx, func(tx *store.Tx) error {
		// Dedup against the record, inside the same serial commit stream
		// as every other admission, so two deliveries of one op_id cannot
		// both enter the inbox (invariant 2).
		rec, found, err := tx.Op(dev, cmd.OpID)
		if err != nil {
			return err
		}
		var recp *store.Op
		if found {
			recp = &rec
		}
		var refused wire.Code
		ar.kind, refused = Dedup(recp, found && bytes.Equal(rec.ContentHash, hash), w.depth.Load(), w.limit)
		switch ar.kind {
		case AdmitReplay:
			ar.rec = rec
			return nil
		case AdmitAnswer:
			ar.answer = a.refusal(rt, dev, cmd, refused)
			return nil
		case AdmitInFlight:
			return nil
		}
		seq, err := tx.InboxAppend(w.id, dev, cmd.OpID)
		if err != nil {
			return err
		}
		o := store.Op{Device: dev, OpID: cmd.OpID, Status: store.OpQueued,
			Fence: cmd.Fence, Action: cmd.Action, Params: cmd.Params, Lock: cmd.Lock,
			Holder: cmd.Holder, ExpiresAt: cmd.ExpiresAt, ReplyTo: cmd.ReplyTo,
			ContentHash: hash, Worker: w.id, InboxSeq: seq, ReceivedAt: received.UTC()}
		it := item{InboxEntry: store.InboxEntry{Worker: w.id, Seq: seq, Device: dev, OpID: cmd.OpID}, op: &o}
		if w.depth.Load() == 0 && w.reserve() {
			defer w.release() // after the push below: the worker takes it
			// The worker is idle: when the checks leave nothing but the
			// send (no policy; lock, expiry and fence pass), decide here,
			// and make this commit the pending write's (invariant 3:
			// last_fence and the pending record with its key are durable
			// before the worker sends anything; it waits for this
			// commit). One commit less on the command's path. Anything
			// else is left to the worker, which decides it with the same
			// Check.
			d, _, err := tx.Device(dev)
			if err != nil {
				return err
			}
			// The clock is read now, in the commit, not at arrival: a
			// busy commit loop may run this after expires_at.
			// Not for a device that is read back: its pending record
			// must carry the reading taken before the write, which is
			// I/O and so the worker's.
			if dec := Check(a.rules(rt), &o, d, a.now()); dec.Step == StepSend && rt.rb == nil {
				o.ParamsSent = stateOrEmpty(o.Params)
				if err := a.pendTx(tx, &o, &d, dec.Raise); err != nil {
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

// answerOnArrival makes ar an answer on arrival (not recorded) to replyTo,
// or to the device's result topic. A destination that can never be
// published to (a device ID that makes the result topic longer than MQTT
// allows) is not answered: logged and counted, the delivery only
// acknowledged. Invariant 4 is about commands that entered the inbox; this
// one never did, and a Result that can never be published must not stall
// the ones behind it.
func (a *Agent) answerOnArrival(ar *arrival, replyTo string, r wire.Result) {
	ar.topic = a.destination(replyTo, ar.dev)
	if !wire.ValidPublishTopic(ar.topic) && replyTo != "" {
		ar.topic = a.destination("", ar.dev) // docs/protocol.md: when reply_to cannot be used, the result topic
	}
	if !wire.ValidPublishTopic(ar.topic) {
		a.unpublishable(ar.topic, r.Device, r.Code)
		ar.kind = AdmitIgnore
		return
	}
	ar.kind, ar.answer = AdmitAnswer, &r
}

// unpublishable logs and counts a Result that can never be published.
func (a *Agent) unpublishable(topic, dev string, code wire.Code) {
	a.m.unpublishable.Inc()
	a.log.Warn("a Result cannot be published (its topic is not a valid MQTT topic); dropped",
		"topic", clip.String(topic, 120), "topic_bytes", len(topic), "device", clip.String(dev, 80), "code", code)
}

// refusal is the Result of a command refused on arrival after the store
// was read (op_conflict, busy).
func (a *Agent) refusal(rt *devRT, dev string, cmd wire.Command, code wire.Code) *wire.Result {
	r := &wire.Result{V: wire.Version, OpID: cmd.OpID, Device: dev, Fence: cmd.Fence,
		Status: wire.StatusOf(code), Code: code, LastFence: rt.lastFence.Load(), At: a.now().UTC()}
	switch code {
	case wire.CodeOpConflict:
		r.Reason = fmt.Sprintf("op_id %s was already used on %s with a different action or params", cmd.OpID, dev)
	case wire.CodeBusy:
		r.Reason = fmt.Sprintf("the queue of %s is full (%d commands); retry later with backoff", dev, rt.w.limit)
	}
	return r
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
				if errors.Is(err, context.Canceled) && a.ctx.Err() != nil {
					// A hard stop, not a store failure: the admission was
					// never committed, so the delivery (and every one
					// after it) stays unacknowledged for the broker to
					// redeliver, and the stop stays clean.
					return
				}
				a.fail(fmt.Errorf("agent: admitting %s/%s: %w", ar.dev, ar.cmd.OpID, err))
				return
			}
			if ar.kind == AdmitQueued {
				failpoint.Hit(failpoint.AfterInbox, ar.cmd.OpID)
			}
		}
		select {
		case <-a.failed: // invariant 5: nothing answered or acknowledged after a store failure
			return
		default:
		}
		switch ar.kind {
		case AdmitQueued:
			w := a.devs[ar.dev].w
			w.gauge.Set(float64(w.depth.Load()))
		case AdmitAnswer:
			a.answerNow(ar.topic, *ar.answer, &ar.cmd)
		case AdmitReplay:
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
			a.answerNow(ar.topic, r, &ar.cmd)
		}
		if ar.kind == AdmitQueued && failpoint.Armed(failpoint.BeforeAck, ar.cmd.OpID) {
			a.waitPublished(ar.dev, ar.cmd.OpID, 10*time.Second)
			failpoint.Hit(failpoint.BeforeAck, ar.cmd.OpID)
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
func (a *Agent) answerNow(topic string, r wire.Result, cmd *wire.Command) {
	a.observe(&outcome{dev: r.Device, opID: r.OpID, fence: r.Fence, action: cmd.Action, holder: cmd.Holder,
		code: r.Code, reason: r.Reason, dup: r.Duplicate, rewritten: r.RewrittenParams})
	done := make(chan struct{})
	a.pub.push(pubItem{topic: topic, payload: resultJSON(r), dev: r.Device, done: done})
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		a.log.Warn("an answer was not confirmed published within 5s", "topic", topic, "op_id", r.OpID, "code", r.Code)
	case <-a.ctx.Done():
	}
}
