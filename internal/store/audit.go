package store

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// ActionFenceReset is the action of the audit record ResetFence writes.
const ActionFenceReset = "fence_reset"

// ResetFence sets dev's last_fence back to `to` (an operator undoing a
// poisoned fence, offline: `edge-agent fence reset`) and records the act
// in the device's history: an op record with Audit set, op_id
// "fence-reset:" and the time, action ActionFenceReset, status final
// (applied/ok), fence `to`, holder `by`, params {"from","to","reason",
// "by"}. It is the one way last_fence moves backwards (invariant 3's
// exception, docs/design.md "Who is trusted"); the record is never swept.
// It refuses (ErrResetBusy) while the device has a record that is not
// final.
//
// Call CheckReset in a View first: an error returned inside Update fails
// the store (invariant 5), and ResetFence returns CheckReset's errors.
func (t *Tx) ResetFence(dev string, to int64, by, reason string, now time.Time) (Op, error) {
	d, err := t.CheckReset(dev, to)
	if err != nil {
		return Op{}, err
	}
	now = now.UTC()
	params, _ := json.Marshal(map[string]any{"from": d.LastFence, "to": to, "reason": reason, "by": by})
	o := Op{Device: dev, OpID: "fence-reset:" + now.Format("2006-01-02T15:04:05.000000000Z"), Status: OpFinal,
		Result: wire.StatusApplied, Code: wire.CodeOK,
		Reason: fmt.Sprintf("last_fence reset from %d to %d by %s: %s", d.LastFence, to, by, reason),
		Fence:  to, Action: ActionFenceReset, Params: params, Holder: by, Audit: true,
		ReceivedAt: now, DecidedAt: now}
	d.LastFence, d.UpdatedAt = to, now
	d.Finals++
	o.FinalSeq = d.Finals
	// PutDevice refuses a lower last_fence (invariant 3); this is the
	// sanctioned exception, so the record is written directly.
	if err := t.tx.Bucket(bucketDevices).Put([]byte(dev), encodeDevice(&d)); err != nil {
		return Op{}, err
	}
	if err := t.putOp(o); err != nil {
		return Op{}, err
	}
	got, _, err := t.Op(dev, o.OpID)
	return got, err
}

// CheckReset returns dev's record when ResetFence(dev, to) may be done:
// the device has a record, to is from 0 to below its last_fence
// (ErrResetNotLower), and none of its op records is queued, pending or
// unknown (ErrResetBusy, naming them).
func (t *Tx) CheckReset(dev string, to int64) (Device, error) {
	d, ok, err := t.Device(dev)
	switch {
	case err != nil:
		return d, err
	case !ok:
		return d, fmt.Errorf("%w: %s", ErrNoDevice, dev)
	case to < 0 || to >= d.LastFence:
		return d, fmt.Errorf("%w: %s's last_fence is %d, the reset asks for %d", ErrResetNotLower, dev, d.LastFence, to)
	}
	var open []string
	if err := t.Ops(dev, func(o Op) error {
		if o.Status != OpFinal {
			open = append(open, fmt.Sprintf("%s (%s)", o.OpID, o.Status))
		}
		return nil
	}); err != nil {
		return d, err
	}
	if len(open) > 0 {
		return d, fmt.Errorf("%w: %s: %v", ErrResetBusy, dev, open)
	}
	return d, nil
}
