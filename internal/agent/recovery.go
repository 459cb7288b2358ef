package agent

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/store"
)

// recover loads what the store holds at start-up (docs/design.md, Recovery):
// last_fence of every device, the inbox, the outbox.
//
// Each inbox entry goes to its device's worker as configured now, not the
// worker it was admitted to (the configuration may have moved the device
// into or out of a group since): invariant 6 is about the device and the
// group it is in now. In each worker, the unresolved writes (pending or
// unknown) come first, so each is resolved with the device before any
// queued command of that device or group is processed; then the queued
// commands, in arrival order.
//
// An entry of a device that is no longer configured: a queued command ends
// rejected/unknown_device (its Result published; it never reached the
// device); an unresolved write refuses the start with a configuration
// error naming the device (config.ErrInvalid: exit 2), because nobody
// could resolve it: restore the device to resolve it first.
func (a *Agent) recover(ctx context.Context) error {
	type entry struct {
		item
		status store.OpStatus
	}
	var entries []entry
	var orphans []store.Op // queued commands of devices no longer configured
	var lost []string      // unresolved writes of devices no longer configured
	// known is the configured devices' records.
	known := map[string]store.Device{}
	err := a.st.View(func(tx *store.Tx) error {
		if err := tx.Devices(func(dev string, d store.Device) error {
			if rt := a.devs[dev]; rt != nil {
				rt.lastFence.Store(d.LastFence)
				known[dev] = d
			}
			return nil
		}); err != nil {
			return err
		}
		if err := tx.Inbox(func(e store.InboxEntry) error {
			o, ok, err := tx.Op(e.Device, e.OpID)
			if err != nil {
				return err
			}
			if a.devs[e.Device] == nil {
				switch {
				case !ok || o.InboxSeq != e.Seq || o.Status == store.OpFinal:
					orphans = append(orphans, store.Op{Device: e.Device, OpID: e.OpID, InboxSeq: e.Seq}) // only the entry goes
				case o.Status == store.OpQueued:
					orphans = append(orphans, o)
				default:
					lost = append(lost, fmt.Sprintf("%s (op %s, %s)", e.Device, e.OpID, o.Status))
				}
				return nil
			}
			st := store.OpQueued
			if ok && o.InboxSeq == e.Seq {
				st = o.Status
			}
			if st == store.OpUnknown {
				a.heldBy(a.devs[e.Device], 1)
			}
			it := item{InboxEntry: e}
			entries = append(entries, entry{it, st})
			return nil
		}); err != nil {
			return err
		}
		return tx.Outbox(func(e store.Outbox) error {
			a.pub.push(outboxItem(e))
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("agent: recovery: %w", err)
	}
	if len(lost) > 0 {
		return fmt.Errorf("%w: devices: the store holds unresolved writes of devices that are no longer configured: %s; add them back to resolve the writes (they may have reached the device), then remove them",
			config.ErrInvalid, strings.Join(lost, ", "))
	}
	if err := a.dropOrphans(ctx, orphans); err != nil {
		return fmt.Errorf("agent: recovery: %w", err)
	}
	// A device that holds unknown writes says so again in its DeviceState
	// (the retained one may predate them: a crash before its publish).
	for _, dev := range a.DeviceIDs() {
		if rt := a.devs[dev]; rt.unknown.Load() > 0 {
			a.heldChanged(rt, dev, known[dev])
		}
	}
	unresolved := func(e entry) bool { return e.status == store.OpPending || e.status == store.OpUnknown }
	for _, e := range entries {
		if unresolved(e) {
			a.devs[e.Device].w.fifo = append(a.devs[e.Device].w.fifo, e.item)
		}
	}
	for _, w := range a.workers {
		w.unresolved = len(w.fifo)
		// With more than one (devices regrouped since), the ones on
		// devices that cannot be asked go first: while one is held for an
		// operator, nothing else of the group may be sent, and the others
		// can only be asked (settleRecovered), never resent.
		sort.SliceStable(w.fifo, func(i, j int) bool {
			return !a.devs[w.fifo[i].Device].drv.Queryable(w.fifo[i].Device) && a.devs[w.fifo[j].Device].drv.Queryable(w.fifo[j].Device)
		})
	}
	for _, e := range entries {
		if !unresolved(e) {
			a.devs[e.Device].w.fifo = append(a.devs[e.Device].w.fifo, e.item)
		}
	}
	for _, w := range a.workers {
		w.depth.Store(int64(len(w.fifo)))
	}
	return nil
}

// dropOrphans ends the queued commands of devices no longer configured
// (rejected/unknown_device, not recorded, Result published) and removes
// inbox entries whose record is gone or final.
func (a *Agent) dropOrphans(ctx context.Context, orphans []store.Op) error {
	if len(orphans) == 0 {
		return nil
	}
	var ended []outcome
	defer func() {
		for i := range ended {
			a.observe(&ended[i])
		}
	}()
	return a.st.Update(ctx, func(tx *store.Tx) error {
		for i := range orphans {
			o := &orphans[i]
			if o.Status != store.OpQueued {
				if err := tx.InboxDelete(o.Worker, o.InboxSeq); err != nil {
					return err
				}
				continue
			}
			dec := end(wire.CodeUnknownDevice, "device %q is no longer configured on gateway %s; the command was not executed", o.Device, a.cfg.GatewayID)
			if _, _, err := a.endTx(tx, o, &dec, nil); err != nil {
				return err
			}
			// Logged once committed (a failed commit fails the start).
			tx.OnCommit(func() {
				ended = append(ended, outcome{dev: o.Device, opID: o.OpID, fence: o.Fence, action: o.Action, holder: o.Holder,
					code: dec.Code, reason: dec.Reason})
			})
		}
		return nil
	})
}

// settleRecovered runs before a worker's first command when recovery gave
// it more than one unresolved write (only after its devices were regrouped:
// a worker leaves at most one unresolved write behind). Resolving them one
// after the other would resend the first while the second might still
// land (invariant 6), so first every write on a device that can be asked is
// asked about: applied ends it now; not applied leaves its key tombstoned,
// so nothing of it can land any more, and the main loop resends it in
// turn. Writes on devices that cannot be asked come first in the queue
// (recover): held for an operator, they block everything behind them.
func (w *worker) settleRecovered() error {
	w.mu.Lock()
	items := append([]item(nil), w.fifo[:w.unresolved]...)
	w.mu.Unlock()
	if len(items) < 2 {
		return nil
	}
	// The writes on devices that cannot be asked come first: recorded and
	// published unknown now, so an operator can resolve them while the
	// others are asked about (which lasts as long as their devices cannot
	// answer).
	for _, e := range items {
		rt := w.a.devs[e.Device]
		if rt.drv.Queryable(e.Device) {
			continue
		}
		o, ok, err := w.load(e)
		if err != nil {
			return err
		}
		if ok && o.Status == store.OpPending {
			if err := w.markUnknown(&o, fmt.Sprintf("the write to %s may or may not have happened (interrupted); %s cannot be asked: an operator must resolve it", o.Device, o.Device)); err != nil {
				return err
			}
		}
	}
	for _, e := range items {
		rt := w.a.devs[e.Device]
		if !rt.drv.Queryable(e.Device) {
			continue
		}
		o, ok, err := w.load(e)
		if err != nil {
			return err
		}
		if !ok || (o.Status != store.OpPending && o.Status != store.OpUnknown) {
			continue
		}
		dec, state, err := w.ask(rt, &o)
		if err != nil {
			return err
		}
		if dec.Step == StepEnd {
			if err := w.end(rt, &o, dec, state); err != nil {
				return err
			}
			w.forget(e.Seq)
		}
	}
	return nil
}

// forget removes the entry seq, ended out of turn, from the queue.
func (w *worker) forget(seq uint64) {
	w.mu.Lock()
	for i, e := range w.fifo {
		if e.Seq == seq {
			w.fifo = append(w.fifo[:i], w.fifo[i+1:]...)
			w.unresolved--
			break
		}
	}
	w.mu.Unlock()
	d := w.depth.Add(-1)
	w.gauge.Set(float64(d))
}
