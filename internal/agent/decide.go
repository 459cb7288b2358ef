package agent

import (
	"errors"
	"fmt"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/device"
	"github.com/edge-agent/edge-agent/internal/policy"
	"github.com/edge-agent/edge-agent/internal/store"
)

// This file is docs/protocol.md §1's order of checks and result-code table in
// one place, as pure functions: each takes what is known at one step of a
// command (the device's configuration, the command's record, the device's
// record, the time, what the policy or the device said) and returns what
// happens next. They do no I/O; the intake, the worker and the resolve API
// call them and do the store transaction, the device write and the publish
// around them. decide_test.go tables every row.

// Step is what happens next to a command.
type Step int

const (
	// StepEnd: the command ends with Decision.Code (recorded or not, as
	// wire.Recorded says).
	StepEnd Step = iota + 1
	// StepPolicy: every check before the policy passed; evaluate it.
	StepPolicy
	// StepSend: allowed. Record the write as pending under a new key
	// (raising last_fence when Raise is set), then send it.
	StepSend
	// StepUnknown: the write may have reached the device. Record it
	// unknown (and publish that, once), then resolve it (StepAsk).
	StepUnknown
	// StepAsk: the write is unresolved: ask the device about its key, or
	// hold it for an operator when the device cannot be asked.
	StepAsk
	// StepResend: the device confirmed the last key was not applied (and
	// will never be): wait, then send the operation again under a new key.
	StepResend
	// StepHold: a read-back could not decide (the device holds a value
	// that is neither the intended one nor the one from before the
	// write): the write stays unknown, its record keeps both readings
	// (Reason), and it is held for an operator like a write on a device
	// that cannot be asked.
	StepHold
)

func (s Step) String() string {
	switch s {
	case StepEnd:
		return "end"
	case StepPolicy:
		return "policy"
	case StepSend:
		return "send"
	case StepUnknown:
		return "unknown"
	case StepAsk:
		return "ask"
	case StepResend:
		return "resend"
	case StepHold:
		return "hold"
	}
	return fmt.Sprintf("Step(%d)", int(s))
}

// Decision is what one step decided.
type Decision struct {
	Step   Step
	Code   wire.Code // StepEnd: the outcome's code
	Reason string    // StepEnd, StepUnknown and StepHold: one sentence for the Result or the record
	// Raise: last_fence is raised to the command's fence in the
	// transaction that records this step (docs/protocol.md: the pending record
	// or policy_denied, and policy_error, which passed the fence check).
	Raise bool
}

// Recorded reports whether the outcome leaves an op record.
func (d Decision) Recorded() bool { return wire.Recorded(d.Code) }

// DeviceRules is the part of a device's configuration the checks read.
type DeviceRules struct {
	ID        string
	Lock      string // the bound lock; "": none
	Policy    bool   // a policy plugin is bound (it may deny or rewrite)
	Queryable bool   // the device answers ops queries with tombstones
	// Resends is how many times an operation the device confirmed
	// unapplied is sent again under a new key; after that it ends
	// failed/not_applied.
	Resends int
	// Unconfirmed: the gateway cannot yet confirm it remembers the
	// device's fences (its fence floor is not taken: docs/protocol.md §7).
	Unconfirmed bool
}

// Admission is what the checks on arrival decided for one delivery.
type Admission int

const (
	// AdmitIgnore: acknowledged only, never answered (RETAIN=1, an empty
	// payload, a topic that is not a device's cmd topic).
	AdmitIgnore Admission = iota + 1
	// AdmitAnswer: answered now with the Admission's code, not recorded.
	AdmitAnswer
	// AdmitDedup: the device is configured; the op_id must be looked up.
	AdmitDedup
	// AdmitQueued: into the inbox.
	AdmitQueued
	// AdmitInFlight: a resend of a queued or pending op: acknowledged
	// only (its Result will come).
	AdmitInFlight
	// AdmitReplay: a resend of a recorded op: its Result is replayed
	// (duplicate: true).
	AdmitReplay
)

// Arrival is what is known of a delivery before the store is read.
type Arrival struct {
	Retained bool
	Empty    bool // no payload
	CmdTopic bool // the topic is one of this gateway's cmd topics
	// Unauthorized: the device requires signatures and the payload is not
	// a valid JWS by a key allowed for it, with the binding of
	// docs/protocol.md §6 (auth.Verifier.Open).
	Unauthorized bool
	ParseErr     *wire.ParseError // the payload is not a valid Command
	Known        bool             // the device is configured
}

// Arrive is step 1 of the order of checks up to the store: RETAIN=1 ->
// unauthorized (§6) -> invalid -> unknown_device; a command that passes
// goes on to Dedup. An unauthorized command is decided before anything
// is read or written: it claims no op_id, raises no fence and takes no
// queue slot.
func Arrive(a Arrival) (Admission, wire.Code) {
	switch {
	case a.Retained, a.Empty, !a.CmdTopic:
		return AdmitIgnore, ""
	case a.Unauthorized:
		return AdmitAnswer, wire.CodeUnauthorized
	case a.ParseErr != nil:
		return AdmitAnswer, wire.CodeInvalid
	case !a.Known:
		return AdmitAnswer, wire.CodeUnknownDevice
	}
	return AdmitDedup, ""
}

// Dedup is the rest of step 1, against the op's record (nil: none) inside
// the admission's transaction: op_conflict -> replay of a final or unknown
// record / acknowledgement of a queued or pending one -> busy when the
// worker holds more than limit commands besides the one in hand -> inbox.
func Dedup(rec *store.Op, sameContent bool, depth, limit int64) (Admission, wire.Code) {
	switch {
	case rec != nil && !sameContent:
		return AdmitAnswer, wire.CodeOpConflict
	case rec != nil && (rec.Status == store.OpFinal || rec.Status == store.OpUnknown):
		return AdmitReplay, ""
	case rec != nil:
		return AdmitInFlight, ""
	case depth > limit:
		return AdmitAnswer, wire.CodeBusy
	}
	return AdmitQueued, ""
}

// Check is step 2 of the order of checks, for a queued command in its
// worker (or in its admission's commit when the worker is idle): lock ->
// expires_at -> fence_unconfirmed -> fence -> barrier -> policy or send. d
// is the device's record.
func Check(r DeviceRules, o *store.Op, d store.Device, now time.Time) Decision {
	switch {
	case r.Lock != "" && o.Lock != r.Lock:
		return end(wire.CodeLockMismatch, "lock %q does not match %s's bound lock %q", o.Lock, o.Device, r.Lock)
	case expired(o, now):
		return end(wire.CodeExpired, "reached at %s, after expires_at %s", stamp(now), stamp(*o.ExpiresAt))
	case r.Unconfirmed:
		// Invariant 7: until the floor is taken, last_fence may be below
		// a fence this gateway once accepted, so no fence can be judged.
		return end(wire.CodeFenceUnconfirmed, "gateway cannot yet confirm it remembers %s's fences (its fence floor from etcd is not taken); retry later with backoff", o.Device)
	case o.Fence < d.LastFence && queuedBeforeFloor(o, d):
		// Invariants 1 and 8: below the floor, so never sent; but its
		// outcome may be in another store (the other agent of a pair
		// after a takeover, the original of a restored store), so no
		// final answer here: not recorded, and a resend is judged
		// against the floor.
		return end(wire.CodeFenceUnconfirmed, "fence %d is below %s's fence floor (last_fence %d), taken after this command was queued: another store may hold its outcome; send it again to have it judged", o.Fence, o.Device, d.LastFence)
	case o.Fence < d.LastFence:
		// Invariant 1: a fence below last_fence never reaches the device.
		return end(wire.CodeStaleFence, "fence %d is below %s's last_fence %d", o.Fence, o.Device, d.LastFence)
	case o.Action == wire.ActionFence:
		dec := end(wire.CodeOK, "barrier: last_fence is now %d", max(o.Fence, d.LastFence))
		dec.Raise = true
		return dec
	case r.Policy:
		return Decision{Step: StepPolicy}
	}
	return Decision{Step: StepSend, Raise: true}
}

// AfterPolicy is the policy's step: it could not decide -> policy_error
// (fail closed, invariant 5; the command passed the fence check, so
// last_fence is raised: invariant 1); denied -> policy_denied (recorded,
// raised); allowed -> send.
func AfterPolicy(o *store.Op, dec policy.Decision, err error) Decision {
	var d Decision
	switch {
	case err != nil:
		d = end(wire.CodePolicyError, "policy for %s could not decide: %v", o.Device, err)
	case !dec.Allow:
		d = end(wire.CodePolicyDenied, "%s", dec.Reason)
		if dec.Reason == "" {
			d.Reason = "denied by policy"
		}
	default:
		d = Decision{Step: StepSend}
	}
	d.Raise = true
	return d
}

// AfterWrite classifies a write's outcome (docs/design.md, "Talking to a
// device"): applied -> ok; refused -> device_error; not sent ->
// device_unreachable, unless the operation has been unknown (invariant 6:
// it stays held until final); anything else may have happened: unknown.
func AfterWrite(o *store.Op, res device.WriteResult) Decision {
	switch res.Outcome {
	case device.Applied:
		return applied(o)
	case device.Refused:
		return end(wire.CodeDeviceError, "%s refused the write: %s", o.Device, res.Reason)
	case device.NotSent:
		if !o.WasUnknown {
			return end(wire.CodeDeviceUnreachable, "%s could not be reached: %s", o.Device, res.Reason)
		}
	}
	return Decision{Step: StepUnknown, Reason: fmt.Sprintf("the write to %s may or may not have happened: %s", o.Device, res.Reason)}
}

// AfterQuery is the device's answer about an unresolved write's key:
// applied -> ok; not applied (the key is now tombstoned) -> expired once
// expires_at has passed, failed/not_applied once the resends are used up,
// else a resend under a new key. A read-back's readings are decided by
// AfterReadBack.
func AfterQuery(r DeviceRules, o *store.Op, q device.QueryResult, now time.Time) Decision {
	if q.ReadBack != nil {
		return AfterReadBack(o, *q.ReadBack)
	}
	switch {
	case q.Applied:
		return applied(o)
	case expired(o, now):
		return end(wire.CodeExpired, "the write was not applied and expires_at %s has passed; not resent", stamp(*o.ExpiresAt))
	case o.Keys > r.Resends:
		return end(wire.CodeNotApplied, "%s confirmed that the write was not applied, %d times; not resent again (driver.resends: %d)", o.Device, o.Keys, r.Resends)
	}
	return Decision{Step: StepResend}
}

// AfterReading is the step before a write on a device that is read back:
// the points it sets are read first, and the reading goes into the
// pending record. Nil error -> send; a write that can never be sent (a
// parameter that does not fit: device.ErrRefused) -> device_error; the
// device could not be read -> as a write that was not sent (nothing was
// written).
func AfterReading(o *store.Op, err error) Decision {
	switch {
	case err == nil:
		return Decision{Step: StepSend}
	case errors.Is(err, device.ErrRefused):
		return AfterWrite(o, device.WriteResult{Outcome: device.Refused, Reason: err.Error()})
	}
	return AfterWrite(o, device.WriteResult{Outcome: device.NotSent, Reason: err.Error()})
}

// AfterReadBack is the read-back decision table (docs/design.md,
// "Read-back"), for an unknown write of absolute values whose points were
// read again after the settle time: equal to the intended values ->
// applied; else equal to the values read before the write -> it did not
// happen: failed/not_applied, never resent (nothing tombstones a Modbus
// write, so a resend could meet the first one landing late); anything
// else (a third value: something else wrote, or the reading before is not
// known) -> held for an operator, with the readings in the record.
func AfterReadBack(o *store.Op, rb device.ReadBack) Decision {
	after := string(rb.After)
	switch {
	case len(rb.Intended) > 0 && after == string(rb.Intended):
		return end(wire.CodeOK, "%s applied %s (read back after the outcome was unknown: %s)", o.Device, o.Action, after)
	case len(rb.Before) > 0 && after == string(rb.Before):
		return end(wire.CodeNotApplied, "read back after the outcome was unknown: %s still holds the values from before the write %s, not the intended %s; the write did not happen and is not resent",
			o.Device, after, rb.Intended)
	case len(rb.Before) == 0:
		return Decision{Step: StepHold, Reason: fmt.Sprintf("read back after the outcome was unknown: %s holds %s, not the intended %s, and what it held before the write is not known; held for an operator",
			o.Device, after, rb.Intended)}
	}
	return Decision{Step: StepHold, Reason: fmt.Sprintf("read back after the outcome was unknown: %s holds %s, neither the intended %s nor %s from before the write: something else wrote; held for an operator",
		o.Device, after, rb.Intended, rb.Before)}
}

// Refloored is the fence check again, inside the transaction that would
// record o's pending write or its barrier or policy outcome: a fence floor
// taken since the worker read the device's record (docs/protocol.md §7)
// may have raised last_fence above o's fence. ok is false then, and dec is
// stale_fence (invariants 1 and 7), or fence_unconfirmed when o was queued
// before that floor (as in Check: its outcome may be in another store).
func Refloored(o *store.Op, d store.Device) (dec Decision, ok bool) {
	if o.Fence < d.LastFence && queuedBeforeFloor(o, d) {
		return end(wire.CodeFenceUnconfirmed, "fence %d is below %s's fence floor (last_fence %d), taken after this command was queued: another store may hold its outcome; send it again to have it judged", o.Fence, o.Device, d.LastFence), false
	}
	if o.Fence < d.LastFence {
		return end(wire.CodeStaleFence, "fence %d is below %s's last_fence %d (raised by a fence floor while the command was being checked)", o.Fence, o.Device, d.LastFence), false
	}
	return Decision{}, true
}

// BeforeResend is judged after the pause before a resend, when the new
// key is about to be recorded: expires_at may have passed during the pause
// (docs/protocol.md: expired is judged again before any resend). The last key
// is tombstoned, so nothing of the operation has happened.
func BeforeResend(o *store.Op, now time.Time) Decision {
	if expired(o, now) {
		return end(wire.CodeExpired, "the write was not applied and expires_at %s passed before it could be sent again; not resent", stamp(*o.ExpiresAt))
	}
	return Decision{Step: StepSend}
}

// Operator is an operator's answer for an unknown write on a device that
// cannot be asked: applied -> ok; not applied -> failed/not_applied, never
// resent (invariant 6).
func Operator(applied bool) Decision {
	if applied {
		return end(wire.CodeOK, "an operator resolved the unknown write: it was applied")
	}
	return end(wire.CodeNotApplied, "an operator resolved the unknown write: it did not happen; it is not resent")
}

func applied(o *store.Op) Decision {
	return end(wire.CodeOK, "%s applied %s", o.Device, o.Action)
}

func end(code wire.Code, format string, a ...any) Decision {
	return Decision{Step: StepEnd, Code: code, Reason: fmt.Sprintf(format, a...)}
}

func expired(o *store.Op, now time.Time) bool {
	return o.ExpiresAt != nil && now.After(*o.ExpiresAt)
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// queuedBeforeFloor reports whether o was queued in this store before d's
// last fence floor was taken (store.Device.FloorSeq).
func queuedBeforeFloor(o *store.Op, d store.Device) bool {
	return o.InboxSeq != 0 && o.InboxSeq <= d.FloorSeq
}
