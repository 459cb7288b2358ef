package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/device"
	"github.com/edge-agent/edge-agent/internal/policy"
	"github.com/edge-agent/edge-agent/internal/store"
)

// These tables cover every row of docs/protocol.md §1's result-code table and
// every step of its order of checks, on decide.go's pure functions: no
// broker, no disk.

var (
	t0     = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	past   = t0.Add(-time.Second)
	future = t0.Add(time.Hour)
)

func TestArriveOrder(t *testing.T) {
	pe := &wire.ParseError{Reason: "fence: missing"}
	tests := []struct {
		name string
		in   Arrival
		want Admission
		code wire.Code
	}{
		{"retained is ignored before anything", Arrival{Retained: true, CmdTopic: true, ParseErr: pe}, AdmitIgnore, ""},
		{"retained is ignored before unauthorized", Arrival{Retained: true, CmdTopic: true, Unauthorized: true, Known: true}, AdmitIgnore, ""},
		{"an empty payload is ignored before unauthorized", Arrival{Empty: true, CmdTopic: true, Unauthorized: true}, AdmitIgnore, ""},
		{"unauthorized before invalid", Arrival{CmdTopic: true, Unauthorized: true, ParseErr: pe, Known: true}, AdmitAnswer, wire.CodeUnauthorized},
		{"unauthorized before unknown_device", Arrival{CmdTopic: true, Unauthorized: true}, AdmitAnswer, wire.CodeUnauthorized},
		{"unauthorized on a known device, never to dedup", Arrival{CmdTopic: true, Unauthorized: true, Known: true}, AdmitAnswer, wire.CodeUnauthorized},
		{"empty payload is ignored", Arrival{Empty: true, CmdTopic: true}, AdmitIgnore, ""},
		{"not a cmd topic is ignored", Arrival{Known: true}, AdmitIgnore, ""},
		{"invalid before unknown_device", Arrival{CmdTopic: true, ParseErr: pe}, AdmitAnswer, wire.CodeInvalid},
		{"invalid on a known device", Arrival{CmdTopic: true, ParseErr: pe, Known: true}, AdmitAnswer, wire.CodeInvalid},
		{"unknown_device", Arrival{CmdTopic: true}, AdmitAnswer, wire.CodeUnknownDevice},
		{"valid and known goes to dedup", Arrival{CmdTopic: true, Known: true}, AdmitDedup, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, code := Arrive(tt.in)
			if got != tt.want || code != tt.code {
				t.Fatalf("Arrive = %v %q, want %v %q", got, code, tt.want, tt.code)
			}
		})
	}
}

func TestDedupOrder(t *testing.T) {
	rec := func(s store.OpStatus) *store.Op { return &store.Op{Status: s} }
	tests := []struct {
		name         string
		rec          *store.Op
		same         bool
		depth, limit int64
		want         Admission
		code         wire.Code
	}{
		{"op_conflict before everything", rec(store.OpFinal), false, 100, 1, AdmitAnswer, wire.CodeOpConflict},
		{"op_conflict on a queued record", rec(store.OpQueued), false, 0, 1, AdmitAnswer, wire.CodeOpConflict},
		{"final is replayed", rec(store.OpFinal), true, 0, 1, AdmitReplay, ""},
		{"unknown is replayed", rec(store.OpUnknown), true, 0, 1, AdmitReplay, ""},
		{"queued is only acknowledged", rec(store.OpQueued), true, 0, 1, AdmitInFlight, ""},
		{"pending is only acknowledged", rec(store.OpPending), true, 0, 1, AdmitInFlight, ""},
		{"a resend is never busy", rec(store.OpQueued), true, 100, 1, AdmitInFlight, ""},
		{"busy when more than limit wait", nil, false, 3, 2, AdmitAnswer, wire.CodeBusy},
		{"the limit itself still fits (one in hand)", nil, false, 2, 2, AdmitQueued, ""},
		{"queued", nil, false, 0, 2, AdmitQueued, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, code := Dedup(tt.rec, tt.same, tt.depth, tt.limit)
			if got != tt.want || code != tt.code {
				t.Fatalf("Dedup = %v %q, want %v %q", got, code, tt.want, tt.code)
			}
		})
	}
}

func TestCheckOrder(t *testing.T) {
	op := func(f func(o *store.Op)) *store.Op {
		o := &store.Op{Device: "pump-7", OpID: "op-1", Fence: 10, Action: "set", Lock: "locks/pump-7"}
		if f != nil {
			f(o)
		}
		return o
	}
	locked := DeviceRules{ID: "pump-7", Lock: "locks/pump-7"}
	tests := []struct {
		name   string
		rules  DeviceRules
		o      *store.Op
		last   int64
		want   Step
		code   wire.Code
		raise  bool
		reason string
	}{
		{"lock_mismatch before expired and stale_fence", locked,
			op(func(o *store.Op) { o.Lock, o.ExpiresAt, o.Fence = "other", &past, 1 }), 5, StepEnd, wire.CodeLockMismatch, false, `lock "other" does not match`},
		{"a missing lock is a mismatch", locked, op(func(o *store.Op) { o.Lock = "" }), 0, StepEnd, wire.CodeLockMismatch, false, "bound lock"},
		{"no bound lock: any lock passes", DeviceRules{}, op(func(o *store.Op) { o.Lock = "x" }), 0, StepSend, "", true, ""},
		{"expired before stale_fence", locked, op(func(o *store.Op) { o.ExpiresAt, o.Fence = &past, 1 }), 5, StepEnd, wire.CodeExpired, false, "after expires_at"},
		{"not yet expired", locked, op(func(o *store.Op) { o.ExpiresAt = &future }), 0, StepSend, "", true, ""},
		{"expired before fence_unconfirmed", DeviceRules{Unconfirmed: true}, op(func(o *store.Op) { o.ExpiresAt = &past }), 5, StepEnd, wire.CodeExpired, false, ""},
		{"lock_mismatch before fence_unconfirmed", DeviceRules{Lock: "locks/pump-7", Unconfirmed: true}, op(func(o *store.Op) { o.Lock = "x" }), 0, StepEnd, wire.CodeLockMismatch, false, ""},
		{"fence_unconfirmed before stale_fence", DeviceRules{Unconfirmed: true}, op(func(o *store.Op) { o.Fence = 4 }), 5, StepEnd, wire.CodeFenceUnconfirmed, false, "cannot yet confirm"},
		{"fence_unconfirmed for a barrier too", DeviceRules{Unconfirmed: true}, op(func(o *store.Op) { o.Action = wire.ActionFence }), 5, StepEnd, wire.CodeFenceUnconfirmed, false, ""},
		{"stale_fence", locked, op(func(o *store.Op) { o.Fence = 4 }), 5, StepEnd, wire.CodeStaleFence, false, "fence 4 is below pump-7's last_fence 5"},
		{"stale_fence queued after the floor", locked, op(func(o *store.Op) { o.Fence, o.InboxSeq = 4, 101 }), 5, StepEnd, wire.CodeStaleFence, false, "fence 4 is below"},
		{"below a floor taken after it was queued: fence_unconfirmed, not final (invariant 8)", locked,
			op(func(o *store.Op) { o.Fence, o.InboxSeq = 4, 100 }), 5, StepEnd, wire.CodeFenceUnconfirmed, false, "taken after this command was queued"},
		{"queued before a floor but not below it: sent", locked, op(func(o *store.Op) { o.InboxSeq = 7 }), 5, StepSend, "", true, ""},
		{"stale barrier", locked, op(func(o *store.Op) { o.Fence, o.Action = 4, wire.ActionFence }), 5, StepEnd, wire.CodeStaleFence, false, ""},
		{"equal fence is allowed", locked, op(func(o *store.Op) { o.Fence = 5 }), 5, StepSend, "", true, ""},
		{"barrier is applied and raises, skipping the policy", DeviceRules{Lock: "locks/pump-7", Policy: true},
			op(func(o *store.Op) { o.Action = wire.ActionFence }), 5, StepEnd, wire.CodeOK, true, "barrier: last_fence is now 10"},
		{"equal barrier", locked, op(func(o *store.Op) { o.Fence, o.Action = 5, wire.ActionFence }), 5, StepEnd, wire.CodeOK, true, "last_fence is now 5"},
		{"policy bound: evaluate", DeviceRules{Lock: "locks/pump-7", Policy: true}, op(nil), 5, StepPolicy, "", false, ""},
		{"no policy: send, raising", locked, op(nil), 5, StepSend, "", true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Check(tt.rules, tt.o, store.Device{LastFence: tt.last, FloorSeq: 100}, t0)
			if d.Step != tt.want || d.Code != tt.code || d.Raise != tt.raise || !strings.Contains(d.Reason, tt.reason) {
				t.Fatalf("Check = %+v, want step %v code %q raise %v reason ~%q", d, tt.want, tt.code, tt.raise, tt.reason)
			}
		})
	}
}

func TestAfterPolicy(t *testing.T) {
	o := &store.Op{Device: "pump-7"}
	tests := []struct {
		name   string
		dec    policy.Decision
		err    error
		want   Step
		code   wire.Code
		reason string
	}{
		{"could not decide: policy_error, fail closed", policy.Decision{Allow: true}, errors.New("trap"), StepEnd, wire.CodePolicyError, "could not decide: trap"},
		{"denied", policy.Decision{Reason: "rpm above 3000"}, nil, StepEnd, wire.CodePolicyDenied, "rpm above 3000"},
		{"denied without a reason", policy.Decision{}, nil, StepEnd, wire.CodePolicyDenied, "denied by policy"},
		{"allowed", policy.Decision{Allow: true}, nil, StepSend, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := AfterPolicy(o, tt.dec, tt.err)
			// Every outcome of the policy step passed the fence check, so
			// each raises last_fence (invariant 1).
			if d.Step != tt.want || d.Code != tt.code || !d.Raise || !strings.Contains(d.Reason, tt.reason) {
				t.Fatalf("AfterPolicy = %+v, want step %v code %q raise reason ~%q", d, tt.want, tt.code, tt.reason)
			}
		})
	}
}

func TestAfterWrite(t *testing.T) {
	tests := []struct {
		name       string
		res        device.WriteResult
		wasUnknown bool
		want       Step
		code       wire.Code
	}{
		{"applied", device.WriteResult{Outcome: device.Applied}, false, StepEnd, wire.CodeOK},
		{"refused: device_error", device.WriteResult{Outcome: device.Refused, Reason: "rpm: out of range"}, false, StepEnd, wire.CodeDeviceError},
		{"not sent: device_unreachable", device.WriteResult{Outcome: device.NotSent}, false, StepEnd, wire.CodeDeviceUnreachable},
		{"not sent after unknown: held (invariant 6)", device.WriteResult{Outcome: device.NotSent}, true, StepUnknown, ""},
		{"unknown", device.WriteResult{Outcome: device.Unknown, Reason: "timeout"}, false, StepUnknown, ""},
		{"refused after unknown is final", device.WriteResult{Outcome: device.Refused}, true, StepEnd, wire.CodeDeviceError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := AfterWrite(&store.Op{Device: "pump-7", WasUnknown: tt.wasUnknown}, tt.res)
			if d.Step != tt.want || d.Code != tt.code || d.Raise {
				t.Fatalf("AfterWrite = %+v, want step %v code %q, no raise", d, tt.want, tt.code)
			}
		})
	}
}

func TestAfterQuery(t *testing.T) {
	rules := DeviceRules{Queryable: true, Resends: 2}
	tests := []struct {
		name    string
		q       device.QueryResult
		keys    int
		expires *time.Time
		want    Step
		code    wire.Code
	}{
		{"applied", device.QueryResult{Applied: true}, 1, nil, StepEnd, wire.CodeOK},
		{"applied even after expiry", device.QueryResult{Applied: true}, 1, &past, StepEnd, wire.CodeOK},
		{"not applied: resend", device.QueryResult{}, 1, nil, StepResend, ""},
		{"not applied, expired: expired", device.QueryResult{}, 1, &past, StepEnd, wire.CodeExpired},
		{"expired before the resend limit", device.QueryResult{}, 3, &past, StepEnd, wire.CodeExpired},
		{"not applied, last resend allowed", device.QueryResult{}, 2, &future, StepResend, ""},
		{"not applied, resends used up: not_applied", device.QueryResult{}, 3, nil, StepEnd, wire.CodeNotApplied},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := AfterQuery(rules, &store.Op{Device: "pump-7", Keys: tt.keys, ExpiresAt: tt.expires}, tt.q, t0)
			if d.Step != tt.want || d.Code != tt.code || d.Raise {
				t.Fatalf("AfterQuery = %+v, want step %v code %q", d, tt.want, tt.code)
			}
		})
	}
	if d := AfterQuery(DeviceRules{Resends: 0}, &store.Op{Keys: 1}, device.QueryResult{}, t0); d.Code != wire.CodeNotApplied {
		t.Fatalf("resends: 0 must never resend, got %+v", d)
	}
}

// The read-back decision table (docs/design.md, "Read-back"), every row.
func TestAfterReadBack(t *testing.T) {
	const (
		intended = `{"register 0":1200}`
		before   = `{"register 0":0}`
		third    = `{"register 0":999}`
	)
	tests := []struct {
		name                    string
		intended, before, after string
		want                    Step
		code                    wire.Code
		reason                  string
	}{
		{"equal to the intended values: applied", intended, before, intended, StepEnd, wire.CodeOK, "read back"},
		{"intended equal to before, found: applied", intended, intended, intended, StepEnd, wire.CodeOK, ""},
		{"equal to the values before: did not happen, never resent", intended, before, before, StepEnd, wire.CodeNotApplied, "is not resent"},
		{"a third value: held with both readings", intended, before, third, StepHold, "", `holds {"register 0":999}, neither the intended {"register 0":1200} nor {"register 0":0} from before`},
		{"no reading before, not the intended: held", intended, "", before, StepHold, "", "what it held before the write is not known"},
		{"no reading before, the intended: applied", intended, "", intended, StepEnd, wire.CodeOK, ""},
		{"a partial write of two points: held", `{"coil 0":true,"register 0":1200}`, `{"coil 0":false,"register 0":0}`, `{"coil 0":false,"register 0":1200}`, StepHold, "", "something else wrote"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rb := device.ReadBack{Intended: json.RawMessage(tt.intended), After: json.RawMessage(tt.after)}
			if tt.before != "" {
				rb.Before = json.RawMessage(tt.before)
			}
			// Through AfterQuery, as the worker calls it, with resends left
			// and expires_at passed: neither changes a read-back's row.
			d := AfterQuery(DeviceRules{Queryable: true, Resends: 5}, &store.Op{Device: "pump-9", Action: "set", Keys: 1, ExpiresAt: &past}, device.QueryResult{ReadBack: &rb}, t0)
			if d.Step != tt.want || d.Code != tt.code || d.Raise || !strings.Contains(d.Reason, tt.reason) {
				t.Fatalf("AfterQuery = %+v, want step %v code %q, reason containing %q", d, tt.want, tt.code, tt.reason)
			}
		})
	}
}

// The reading before a write on a device that is read back.
func TestAfterReading(t *testing.T) {
	for _, tt := range []struct {
		name       string
		err        error
		wasUnknown bool
		want       Step
		code       wire.Code
	}{
		{"read: send", nil, false, StepSend, ""},
		{"a param that does not fit: device_error", fmt.Errorf("%w: param rpm: 70000 is out of the uint16 range", device.ErrRefused), false, StepEnd, wire.CodeDeviceError},
		{"could not read: device_unreachable", errors.New("dial tcp: connection refused"), false, StepEnd, wire.CodeDeviceUnreachable},
		{"could not read, once unknown: stays unknown", errors.New("dial tcp: connection refused"), true, StepUnknown, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := AfterReading(&store.Op{Device: "pump-9", WasUnknown: tt.wasUnknown}, tt.err)
			if d.Step != tt.want || d.Code != tt.code || d.Raise {
				t.Fatalf("AfterReading = %+v, want step %v code %q", d, tt.want, tt.code)
			}
		})
	}
}

func TestOperator(t *testing.T) {
	if d := Operator(true); d.Step != StepEnd || d.Code != wire.CodeOK || d.Raise {
		t.Fatalf("Operator(true) = %+v", d)
	}
	if d := Operator(false); d.Step != StepEnd || d.Code != wire.CodeNotApplied || d.Raise {
		t.Fatalf("Operator(false) = %+v", d)
	}
}

// Every code of docs/protocol.md's table: its status, and whether it leaves a
// record ("What is recorded").
func TestResultCodeTable(t *testing.T) {
	tests := []struct {
		code     wire.Code
		status   wire.Status
		recorded bool
	}{
		{wire.CodeOK, wire.StatusApplied, true},
		{wire.CodeInvalid, wire.StatusRejected, false},
		{wire.CodeUnknownDevice, wire.StatusRejected, false},
		{wire.CodeStaleFence, wire.StatusRejected, true},
		{wire.CodeLockMismatch, wire.StatusRejected, true},
		{wire.CodeOpConflict, wire.StatusRejected, false},
		{wire.CodePolicyDenied, wire.StatusRejected, true},
		{wire.CodePolicyError, wire.StatusRejected, true},
		{wire.CodeExpired, wire.StatusRejected, true},
		{wire.CodeBusy, wire.StatusRejected, false},
		{wire.CodeUnauthorized, wire.StatusRejected, false},
		{wire.CodeDeviceError, wire.StatusFailed, true},
		{wire.CodeDeviceUnreachable, wire.StatusFailed, true},
		{wire.CodeNotApplied, wire.StatusFailed, true},
		{wire.CodeOutcomeUnknown, wire.StatusUnknown, true},
		{wire.CodeFenceUnconfirmed, wire.StatusRejected, false},
	}
	if len(tests) != len(wire.Codes) {
		t.Fatalf("the table has %d codes, wire.Codes %d", len(tests), len(wire.Codes))
	}
	for _, tt := range tests {
		if s := wire.StatusOf(tt.code); s != tt.status {
			t.Errorf("StatusOf(%s) = %s, want %s", tt.code, s, tt.status)
		}
		if r := (Decision{Code: tt.code}).Recorded(); r != tt.recorded {
			t.Errorf("Recorded(%s) = %v, want %v", tt.code, r, tt.recorded)
		}
	}
}

// A floor taken after the check: the fence is judged again where the
// pending record (or the barrier) would be written.
func TestRefloored(t *testing.T) {
	o := &store.Op{Device: "pump-7", Fence: 10}
	if d, ok := Refloored(o, store.Device{LastFence: 11}); ok || d.Code != wire.CodeStaleFence || !strings.Contains(d.Reason, "fence floor") {
		t.Fatalf("below a floor: %v %+v", ok, d)
	}
	if _, ok := Refloored(o, store.Device{LastFence: 10}); !ok {
		t.Fatal("an equal fence passes")
	}
	q := &store.Op{Device: "pump-7", Fence: 10, InboxSeq: 3}
	if d, ok := Refloored(q, store.Device{LastFence: 11, FloorSeq: 3}); ok || d.Code != wire.CodeFenceUnconfirmed || d.Recorded() {
		t.Fatalf("queued before the floor that raised last_fence: %v %+v", ok, d)
	}
	if d, ok := Refloored(q, store.Device{LastFence: 11, FloorSeq: 2}); ok || d.Code != wire.CodeStaleFence {
		t.Fatalf("queued after the floor: %v %+v", ok, d)
	}
}

// Expiry is judged again after the pause before a resend (attack round 2:
// a resend after the backoff ignored expires_at).
func TestBeforeResend(t *testing.T) {
	if d := BeforeResend(&store.Op{ExpiresAt: &past}, t0); d.Step != StepEnd || d.Code != wire.CodeExpired {
		t.Fatalf("expired during the pause: %+v", d)
	}
	if d := BeforeResend(&store.Op{ExpiresAt: &future}, t0); d.Step != StepSend || d.Raise {
		t.Fatalf("not expired: %+v", d)
	}
	if d := BeforeResend(&store.Op{}, t0); d.Step != StepSend {
		t.Fatalf("no expiry: %+v", d)
	}
}
