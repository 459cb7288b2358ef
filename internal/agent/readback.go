package agent

import (
	"context"
	"encoding/json"
	"time"

	"github.com/edge-agent/edge-agent/internal/device"
	"github.com/edge-agent/edge-agent/internal/store"
)

// The worker's steps for devices that are read back (verify: readback;
// docs/design.md, "Read-back"): the reading before a write, and holding a
// write the read-back could not decide. The decisions are decide.go's
// AfterReading and AfterReadBack.

// queryTimeout bounds one query (or read-back).
func queryTimeout(rt *devRT) time.Duration {
	if b, ok := rt.drv.(device.Bounded); ok {
		_, q := b.Bounds(rt.cfg.ID)
		return q
	}
	return rt.cfg.Timeout
}

// reading reads the points o's write sets (a device that is read back)
// into o.Before, and decides with AfterReading.
func (w *worker) reading(rt *devRT, o *store.Op) Decision {
	ctx, cancel := context.WithTimeout(w.a.ctx, writeTimeout(rt))
	defer cancel()
	before, err := rt.rb.Before(ctx, w.devWrite(o))
	o.Before = before
	return AfterReading(o, err)
}

// devWrite is o's write as the driver sees it.
func (w *worker) devWrite(o *store.Op) device.Write {
	return device.Write{Device: o.Device, OpID: o.OpID, Key: o.Key, Fence: o.Fence, Action: o.Action,
		Params: o.ParamsSent, Before: o.Before}
}

// holdReadBack holds a write a read-back could not decide for an
// operator (invariant 6: unknown is never treated as failure): its record
// stays unknown with reason, which holds both readings (recorded and
// published unknown first if it was pending: a write recovered at
// start-up), and the resolve API accepts it while it is held.
func (w *worker) holdReadBack(rt *devRT, o *store.Op, reason string) (Decision, json.RawMessage, error) {
	a := w.a
	if o.Status != store.OpUnknown {
		if err := w.markUnknown(o, reason); err != nil {
			return Decision{}, nil, err
		}
	} else {
		o.Reason = reason
		if err := a.st.Update(context.Background(), func(tx *store.Tx) error { return tx.PutOp(*o) }); err != nil {
			return Decision{}, nil, err
		}
	}
	a.log.Warn("read-back could not decide an unknown write; held for an operator", "device", o.Device, "op_id", o.OpID, "reason", reason)
	op := o.OpID
	rt.held.Store(&op)
	defer rt.held.Store(nil)
	return w.hold(o)
}
