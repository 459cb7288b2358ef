package chaos

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// lost records that the agent's store lost its memory at ms and the floor
// it then reported on every device.
func (b *hist) lost(ms int, how string, floor int64, since, seen int) *hist {
	b.h.Faults = append(b.h.Faults, FaultRecord{T: b.at(ms), Kind: KindMemoryLost, Phase: "start", Target: how})
	for _, d := range b.h.Meta.Devices {
		b.h.Faults = append(b.h.Faults, FaultRecord{T: b.at(seen), Kind: KindFenceFloor, Phase: "observed", Target: d.ID, Detail: FloorDetail(floor, b.at(since))})
	}
	return b
}

// wiped is clean() and then a wipe: a toggle applied whose Result went
// with the store, a command on p never answered, the fence floor 12, the
// toggle's resend answered stale_fence, a new holder's barrier at 13, the
// old holder stale; then a restore whose outbox publishes the barrier
// a-1's Result again, after the wiped store had answered a-1 stale_fence.
func wiped() *hist {
	return clean().
		op(40, "a", "r", "a-10", 5, "toggle", "").applied(41, "r", "a-10", 5, "toggle", "").
		op(42, "b", "p", "b-5", 5, "set", `{"rpm":10}`).
		lost(50, "wipe", 12, 45, 60).
		res(70, "r", "a-10", 5, wire.CodeStaleFence, 12, "", false, 69).
		res(72, "r", "a-1", 5, wire.CodeStaleFence, 12, "", false, 71).
		op(80, "c", "r", "c-1", 13, wire.ActionFence, "").res(81, "r", "c-1", 13, wire.CodeOK, 13, "", false, 80).
		op(84, "a", "r", "a-11", 5, "toggle", "").res(85, "r", "a-11", 5, wire.CodeStaleFence, 13, "", false, 84).
		lost(90, "restore", 14, 88, 92).
		res(95, "r", "a-1", 5, wire.CodeOK, 5, "", false, 1).
		res(96, "r", "a-3", 5, wire.CodeOK, 14, `{"on":false}`, true, 19)
}

// Across a loss of the store's memory the checker holds what reached the
// hardware (fence order, at most once, the model with the floors) and
// lets a store that forgot an op answer it otherwise; a Result published
// again from a restored outbox is not a second final.
func TestCheckerAcrossLostMemory(t *testing.T) {
	cases := []struct {
		name  string
		h     *hist
		wants []string
	}{
		{"honest: a wipe, then a restore", wiped(), nil},
		{"the floor skipped: the old holder's write passes after the wipe", wiped().
			op(100, "a", "r", "a-12", 5, "set", `{"on":true}`).applied(101, "r", "a-12", 5, "set", `{"on":true}`).
			res(102, "r", "a-12", 5, wire.CodeOK, 5, `{"on":true}`, false, 101),
			[]string{"linearizable (porcupine)"}},
		{"the floor skipped: the old holder's write lands after the new holder's", wiped().
			op(86, "c", "r", "c-2", 13, "toggle", "").applied(87, "r", "c-2", 13, "toggle", "").
			res(88, "r", "c-2", 13, wire.CodeOK, 13, `{"on":true}`, false, 87).
			op(100, "a", "r", "a-12", 5, "set", `{"on":true}`).applied(101, "r", "a-12", 5, "set", `{"on":true}`).
			res(102, "r", "a-12", 5, wire.CodeOK, 13, `{"on":true}`, false, 101),
			[]string{"journal fence order", "linearizable (porcupine)"}},
		{"the floor skipped, seen by the model only", clean().lost(50, "wipe", 12, 45, 60).
			op(70, "a", "r", "a-12", 5, "set", `{"on":true}`).applied(71, "r", "a-12", 5, "set", `{"on":true}`).
			res(72, "r", "a-12", 5, wire.CodeOK, 5, `{"on":true}`, false, 71),
			[]string{"linearizable (porcupine)"}},
		{"an op whose record was lost applied again", wiped().applied(110, "r", "a-10", 5, "toggle", ""),
			[]string{"at most once (journal)", "linearizable (porcupine)"}},
		{"two different finals within one epoch", wiped().res(86, "r", "c-1", 13, wire.CodeStaleFence, 13, "", false, 85),
			[]string{"results per operation", "final means final"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := Check(&tc.h.h, t.TempDir(), 10*time.Second)
			got := map[string]bool{}
			for _, v := range res.Violations {
				got[v.Check] = true
			}
			for _, w := range tc.wants {
				if !got[w] {
					t.Errorf("check %q found nothing; violations: %v", w, summarize(res.Violations))
				}
			}
			if len(tc.wants) == 0 {
				if len(res.Violations) > 0 {
					t.Errorf("an honest history has violations: %v", summarize(res.Violations))
				}
				if res.Lost != 2 {
					t.Errorf("%d operations lost with the store, want 2 (a-10, b-5)", res.Lost)
				}
			}
		})
	}
}

// Where the loss's record lists what the store held unanswered, only those
// operations are lost with it: one the broker acknowledged that never
// reached the store (an acknowledgement ahead of the inbox's commit) is
// still a command without a final Result.
func TestLostOnlyWhatTheStoreHeld(t *testing.T) {
	b := wiped()
	for i, f := range b.h.Faults {
		if f.Kind == KindMemoryLost {
			b.h.Faults[i].Detail = LostDetail([]string{"a-10"})
		}
	}
	res := Check(&b.h, t.TempDir(), 10*time.Second)
	if res.Lost != 1 || len(res.Violations) != 1 || res.Violations[0].Check != "every command final" || res.Violations[0].Op != "b-5" {
		t.Errorf("lost %d, violations %v; want a-10 lost and b-5 without a final Result", res.Lost, summarize(res.Violations))
	}
}

// A clone that was not refused is a violation; a refused one is not.
func TestCheckerClones(t *testing.T) {
	for _, tc := range []struct {
		detail string
		want   int
	}{
		{"refused: exit 1 after 4.1s; the agent (pid 7) still serving", 0},
		{"not started: the agent was not ready with no failpoint armed within 20s", 0},
		{"NOT refused: the clone still ran after 18.0s (killed); the agent serving: true", 1},
	} {
		b := clean()
		b.h.Faults = append(b.h.Faults, FaultRecord{T: b.at(40), Kind: KindClone, Phase: "start"}, FaultRecord{T: b.at(45), Kind: KindClone, Phase: "end", Detail: tc.detail})
		res := Check(&b.h, t.TempDir(), 10*time.Second)
		if len(res.Violations) != tc.want {
			t.Errorf("%q: %d violations, want %d: %v", tc.detail, len(res.Violations), tc.want, summarize(res.Violations))
		}
	}
}

// In a fleet a loss is of one gateway's devices (LostDevicesDetail): it
// starts a new epoch for those only, so a device on another gateway whose
// op gets two different finals across it is still caught.
func TestLossOfOtherDevicesKeepsTheEpoch(t *testing.T) {
	lossOf := func(dev string) *hist {
		b := clean()
		b.h.Faults = append(b.h.Faults, FaultRecord{T: b.at(50), Kind: KindMemoryLost, Phase: "start", Target: "wipe", Detail: LostDevicesDetail([]string{dev}, "")})
		return b.res(72, "r", "a-1", 5, wire.CodeStaleFence, 5, "", false, 71)
	}
	has := func(vs []Violation, check string) bool {
		for _, v := range vs {
			if v.Check == check {
				return true
			}
		}
		return false
	}
	if res := Check(&lossOf("p").h, t.TempDir(), 10*time.Second); !has(res.Violations, "results per operation") {
		t.Errorf("a loss of p only let r's a-1 have two finals: %v", summarize(res.Violations))
	}
	if res := Check(&lossOf("r").h, t.TempDir(), 10*time.Second); has(res.Violations, "results per operation") {
		t.Errorf("a loss of r: a-1 answered again by a store that forgot it was flagged: %v", summarize(res.Violations))
	}
}

// A fleet on NATS: a Result the observer missed and the controller got is
// taken as seen; a command whose original Result nobody got (NATS
// acknowledged a publish it could not store) and whose resend got the
// recorded outcome as a replay (applied) is not "applied but answered
// otherwise"; a gateway the device left answers unknown_device, in no
// order with the new gateway's Results. A device_unreachable alone for
// an applied write is still caught.
func TestFleetWitnesses(t *testing.T) {
	ctlRes := func(b *hist, ms int, dev, op string, fence int64, code wire.Code, lf int64, output string, dup bool) *hist {
		r := wire.Result{V: 1, OpID: op, Device: dev, Fence: fence, Status: wire.StatusOf(code), Code: code, LastFence: lf, Duplicate: dup,
			At: b.t0.Add(time.Duration(ms-1) * time.Millisecond)}
		if output != "" {
			r.Output = json.RawMessage(output)
		}
		b.h.Events = append(b.h.Events, Event{T: b.at(ms), Src: "a", Ev: EvResult, Dev: dev, Op: op, Fence: fence, Result: &r})
		return b
	}
	fleet := func() *hist {
		b := clean()
		b.h.Meta.Fleet = []string{"gw1", "gw2"}
		b.op(40, "a", "r", "a-10", 5, "toggle", "").applied(41, "r", "a-10", 5, "toggle", "")
		ctlRes(b, 42, "r", "a-10", 5, wire.CodeOK, 5, `{"on":true}`, false) // the observer missed it
		b.op(50, "a", "r", "a-11", 5, "toggle", "").applied(51, "r", "a-11", 5, "toggle", "").
			res(70, "r", "a-11", 5, wire.CodeOK, 5, `{"on":false}`, true, 52) // only a replay
		b.op(80, "c", "r", "c-1", 3, "set", `{"on":true}`).
			res(90, "r", "c-1", 3, wire.CodeStaleFence, 5, "", false, 89).
			res(95, "r", "c-1", 3, wire.CodeUnknownDevice, 0, "", false, 85) // the old gateway's, late
		return b
	}
	res := Check(&fleet().h, t.TempDir(), 10*time.Second)
	if len(res.Violations) != 0 || res.CtlOnly != 1 {
		t.Fatalf("honest fleet history: %d taken from a controller, violations %v", res.CtlOnly, summarize(res.Violations))
	}
	b := fleet()
	b.op(100, "a", "r", "a-13", 5, "toggle", "").applied(101, "r", "a-13", 5, "toggle", "")
	ctlRes(b, 102, "r", "a-13", 5, wire.CodeDeviceUnreachable, 5, "", false)
	res = Check(&b.h, t.TempDir(), 10*time.Second)
	found := false
	for _, v := range res.Violations {
		found = found || v.Check == "nothing rejected/failed applied"
	}
	if !found {
		t.Fatalf("an applied write answered device_unreachable (seen by its controller only) was not caught: %v", summarize(res.Violations))
	}
}
