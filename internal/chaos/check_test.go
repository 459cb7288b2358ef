package chaos

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
)

// hist builds small histories for the checker's tables: times are
// milliseconds after a fixed start.
type hist struct {
	h  History
	t0 time.Time
}

func newHist() *hist {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	return &hist{t0: t0, h: History{Meta: RunMeta{Broker: "mosquitto", Start: t0.UnixNano(),
		Devices: []DeviceSpec{{ID: "r", Type: "relay", Queryable: true}, {ID: "p", Type: "pump", Queryable: true}}}}}
}

func (b *hist) at(ms int) int64 { return b.t0.Add(time.Duration(ms) * time.Millisecond).UnixNano() }

// op records an invocation and its publish.
func (b *hist) op(ms int, ctl, dev, op string, fence int64, action, params string) *hist {
	var p json.RawMessage
	if params != "" {
		p = json.RawMessage(params)
	}
	b.h.Events = append(b.h.Events,
		Event{T: b.at(ms), Src: ctl, Ev: EvInvoked, Dev: dev, Op: op, Fence: fence, Action: action, Params: p},
		Event{T: b.at(ms) + 1, Src: ctl, Ev: EvPublished, Dev: dev, Op: op, Fence: fence})
	return b
}

// res records a Result delivered to the observer.
func (b *hist) res(ms int, dev, op string, fence int64, code wire.Code, lf int64, output string, dup bool, atMS int) *hist {
	r := wire.Result{V: 1, OpID: op, Device: dev, Fence: fence, Status: wire.StatusOf(code), Code: code, LastFence: lf,
		Duplicate: dup, At: b.t0.Add(time.Duration(atMS) * time.Millisecond)}
	if output != "" {
		r.Output = json.RawMessage(output)
	}
	b.h.Events = append(b.h.Events, Event{T: b.at(ms), Src: "observer", Ev: EvResult, Dev: dev, Op: op, Fence: fence, Result: &r})
	return b
}

// applied records a journal entry.
func (b *hist) applied(ms int, dev, op string, fence int64, action, params string) *hist {
	if params == "" {
		params = "{}"
	}
	b.h.Journal = append(b.h.Journal, sim.Entry{Seq: int64(len(b.h.Journal) + 1), Device: dev, OpID: op, Key: op + ".1",
		Fence: fence, Action: action, Params: json.RawMessage(params), At: b.t0.Add(time.Duration(ms) * time.Millisecond)})
	return b
}

// clean is an honest history on relay r: a barrier at fence 5, a toggle,
// an unknown write resolved ok, then a stale holder at fence 3 refused.
func clean() *hist {
	return newHist().
		op(0, "a", "r", "a-1", 5, wire.ActionFence, "").res(2, "r", "a-1", 5, wire.CodeOK, 5, "", false, 1).
		op(3, "a", "r", "a-2", 5, "toggle", "").applied(4, "r", "a-2", 5, "toggle", "").res(5, "r", "a-2", 5, wire.CodeOK, 5, `{"on":true}`, false, 4).
		op(6, "a", "r", "a-3", 5, "set", `{"on":false}`).res(8, "r", "a-3", 5, wire.CodeOutcomeUnknown, 5, "", false, 7).
		applied(9, "r", "a-3", 5, "set", `{"on":false}`).res(20, "r", "a-3", 5, wire.CodeOK, 5, `{"on":false}`, false, 19).
		res(21, "r", "a-3", 5, wire.CodeOK, 5, `{"on":false}`, true, 19). // a replay
		// After a crash the outbox publishes what it still holds again, in order.
		res(22, "r", "a-3", 5, wire.CodeOutcomeUnknown, 5, "", false, 7).res(23, "r", "a-3", 5, wire.CodeOK, 5, `{"on":false}`, false, 19).
		op(1, "b", "r", "b-1", 3, "toggle", "").res(30, "r", "b-1", 3, wire.CodeStaleFence, 5, "", false, 29)
}

// The checker passes an honest history and catches each kind of broken
// one, with the check that is about it.
func TestCheckerCatchesBrokenHistories(t *testing.T) {
	cases := []struct {
		name  string
		h     *hist
		wants []string // checks that must report a violation; none: clean
	}{
		{"honest", clean(), nil},
		{"honest: device_unreachable and policy_error are final, the next op goes on", clean().
			op(40, "a", "r", "a-6", 5, "toggle", "").res(41, "r", "a-6", 5, wire.CodeDeviceUnreachable, 5, "", false, 41).
			res(42, "r", "a-6", 5, wire.CodeDeviceUnreachable, 5, "", true, 41). // a resend's replay
			op(43, "a", "r", "a-7", 5, "toggle", "").res(44, "r", "a-7", 5, wire.CodePolicyError, 5, "", false, 44).
			op(45, "a", "r", "a-8", 5, "toggle", "").applied(46, "r", "a-8", 5, "toggle", "").res(47, "r", "a-8", 5, wire.CodeOK, 5, `{"on":true}`, false, 46),
			nil},
		{"applied twice (dedup off)", clean().applied(22, "r", "a-2", 5, "toggle", ""),
			[]string{"at most once (journal)", "linearizable (porcupine)"}},
		{"a stale fence applied after a newer one (fence check off)", clean().op(40, "c", "r", "c-1", 9, "toggle", "").
			applied(41, "r", "c-1", 9, "toggle", "").res(42, "r", "c-1", 9, wire.CodeOK, 9, `{"on":true}`, false, 41).
			op(43, "d", "r", "d-1", 7, "set", `{"on":true}`).applied(44, "r", "d-1", 7, "set", `{"on":true}`).
			res(45, "r", "d-1", 7, wire.CodeOK, 9, `{"on":true}`, false, 44),
			[]string{"journal fence order", "linearizable (porcupine)"}},
		{"a stale holder applied after a newer barrier (seen by the model only)", clean().op(40, "c", "r", "c-1", 9, wire.ActionFence, "").
			res(41, "r", "c-1", 9, wire.CodeOK, 9, "", false, 40).
			op(1, "b", "r", "b-2", 5, "toggle", "").applied(50, "r", "b-2", 5, "toggle", "").
			res(51, "r", "b-2", 5, wire.CodeOK, 9, `{"on":true}`, false, 50),
			[]string{"linearizable (porcupine)"}},
		{"published, never answered (a lost command)", clean().op(40, "c", "r", "c-1", 5, "toggle", ""),
			[]string{"every command final"}},
		{"an unknown after the final (published before its commit)", clean().res(22, "r", "a-2", 5, wire.CodeOutcomeUnknown, 5, "", false, 21),
			[]string{"results per operation"}},
		{"a second, different final", clean().res(22, "r", "a-2", 5, wire.CodeOK, 5, `{"on":true}`, false, 21),
			[]string{"results per operation"}},
		{"an unrecorded final, then a different one (final means final)", clean().op(40, "a", "p", "a-5", 5, "set", `{"rpm":10}`).
			res(41, "p", "a-5", 5, wire.CodeDeviceUnreachable, 5, "", false, 41).res(43, "p", "a-5", 5, wire.CodeNotApplied, 5, "", false, 42),
			[]string{"final means final"}},
		{"device_unreachable for a write that happened (unknown as failed)", clean().op(40, "a", "r", "a-9", 5, "toggle", "").
			applied(41, "r", "a-9", 5, "toggle", "").res(42, "r", "a-9", 5, wire.CodeDeviceUnreachable, 5, "", false, 41),
			[]string{"nothing rejected/failed applied"}},
		{"applied/ok that never reached the hardware", clean().op(40, "a", "p", "a-8", 5, "set", `{"rpm":10}`).
			res(42, "p", "a-8", 5, wire.CodeOK, 5, `{"rpm":10}`, false, 41),
			[]string{"every applied in the journal once", "linearizable (porcupine)"}},
		{"failed, but the hardware did it", clean().op(40, "a", "p", "a-7", 5, "set", `{"rpm":10}`).applied(41, "p", "a-7", 5, "set", `{"rpm":10}`).
			res(42, "p", "a-7", 5, wire.CodeNotApplied, 5, "", false, 41),
			[]string{"nothing rejected/failed applied", "linearizable (porcupine)"}},
		{"a replay that disagrees with the recorded final", clean().res(22, "r", "a-2", 5, wire.CodeDeviceError, 5, "", true, 4),
			[]string{"results per operation"}},
		{"a Result's output that is not the device's state", clean().op(40, "a", "r", "a-6", 5, "toggle", "").applied(41, "r", "a-6", 5, "toggle", "").
			res(42, "r", "a-6", 5, wire.CodeOK, 5, `{"on":false}`, false, 41),
			[]string{"linearizable (porcupine)"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			res := Check(&tc.h.h, dir, 10*time.Second)
			got := map[string]bool{}
			for _, v := range res.Violations {
				got[v.Check] = true
			}
			for _, w := range tc.wants {
				if !got[w] {
					t.Errorf("check %q found nothing; violations: %v", w, summarize(res.Violations))
				}
			}
			if len(tc.wants) == 0 && len(res.Violations) > 0 {
				t.Errorf("an honest history has violations: %v", summarize(res.Violations))
			}
			for _, v := range res.Violations {
				if len(v.Window) == 0 {
					t.Errorf("violation %q has no window of history", v.Msg)
				}
				// Every violation comes with porcupine's drawing of its
				// device's history.
				if _, err := os.Stat(filepath.Join(dir, "porcupine-"+v.Dev+".html")); err != nil {
					t.Errorf("violation %q: no visualization: %v", v.Msg, err)
				}
			}
		})
	}
}

func summarize(vs []Violation) string {
	var s []string
	for _, v := range vs {
		s = append(s, "["+v.Check+"] "+v.Op+": "+v.Msg)
	}
	return strings.Join(s, "; ")
}

// With the embedded broker, a command published less than a second before
// the agent (and its broker) died may be lost; with mosquitto it may not.
func TestEmbeddedBrokerCrashExemption(t *testing.T) {
	for _, broker := range []string{"mosquitto", "embedded"} {
		b := clean().op(40, "c", "r", "c-1", 5, "toggle", "")
		b.h.Meta.Broker = broker
		b.h.Faults = append(b.h.Faults, FaultRecord{T: b.at(300), Kind: "agent_exit", Phase: "end", Detail: "signal killed"})
		res := Check(&b.h, t.TempDir(), 10*time.Second)
		if want := map[string]int{"mosquitto": 1, "embedded": 0}[broker]; len(res.Violations) != want || res.Exempt != 1-want {
			t.Errorf("%s: %d violations, %d exempt; want %d violations", broker, len(res.Violations), res.Exempt, want)
		}
	}
}

// The model itself, step by step.
func TestStepFence(t *testing.T) {
	s := devState{lf: 5, val: `{"on":false}`}
	in := opIn{id: "x", fence: 5, typ: "relay", action: "toggle", applied: 1}
	if n := stepFence(s, in, opOut{code: wire.CodeOK, lf: 5, lfKnown: true, output: `{"on":true}`}); len(n) != 1 || n[0].val != `{"on":true}` {
		t.Errorf("ok toggle: %v", n)
	}
	if n := stepFence(s, opIn{fence: 4, typ: "relay", action: "toggle", applied: 1}, opOut{open: true}); n != nil {
		t.Errorf("an applied write below last_fence is possible: %v", n)
	}
	if n := stepFence(s, opIn{fence: 7, typ: "relay", action: "toggle"}, opOut{open: true}); len(n) != 2 {
		t.Errorf("an open write not in the journal: want two states (no effect, fence raised), got %v", n)
	}
	if n := stepFence(s, opIn{fence: 7, typ: "relay", action: "toggle"}, opOut{code: wire.CodeDeviceError, lf: 7, lfKnown: true}); len(n) != 1 || n[0].lf != 7 {
		t.Errorf("device_error raises last_fence: %v", n)
	}
	if n := stepFence(s, opIn{fence: 7, typ: "relay", action: "toggle"}, opOut{code: wire.CodeStaleFence, lf: 5, lfKnown: true}); n != nil {
		t.Errorf("stale_fence for a fence above last_fence is possible: %v", n)
	}
	if n := stepFence(s, opIn{fence: 5, typ: "relay", action: "toggle", applied: 2}, opOut{open: true}); n != nil {
		t.Errorf("an op applied twice is possible: %v", n)
	}
}

// Final means final (invariant 8): a final Result, recorded or not, is
// never followed by a different one for the same op_id; a busy before it
// and a replay (duplicate: true, last_fence as it is now) after it are not
// a second final.
func TestFinalMeansFinal(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    *hist
		want int // violations of "final means final"
	}{
		{"device_unreachable, then ok for the same op_id", clean().op(40, "a", "p", "a-5", 5, "set", `{"rpm":10}`).
			res(41, "p", "a-5", 5, wire.CodeDeviceUnreachable, 5, "", false, 41).
			applied(44, "p", "a-5", 5, "set", `{"rpm":10}`).res(45, "p", "a-5", 5, wire.CodeOK, 5, `{"rpm":10}`, false, 44), 1},
		{"ok, then a replay that says device_error", clean().res(30, "r", "a-2", 5, wire.CodeDeviceError, 5, "", true, 29), 1},
		{"busy, then ok, then a faithful replay", clean().op(40, "a", "p", "a-5", 5, "set", `{"rpm":10}`).
			res(41, "p", "a-5", 5, wire.CodeBusy, 5, "", false, 41).
			applied(44, "p", "a-5", 5, "set", `{"rpm":10}`).res(45, "p", "a-5", 5, wire.CodeOK, 5, `{"rpm":10}`, false, 44).
			res(50, "p", "a-5", 5, wire.CodeOK, 7, `{"rpm":10}`, true, 44), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := Check(&tc.h.h, t.TempDir(), 10*time.Second)
			got := 0
			for _, l := range res.Checks {
				if l.Name == "final means final" {
					got = l.Violations
				}
			}
			if got != tc.want {
				t.Errorf("final means final: %d violations, want %d; all: %v", got, tc.want, summarize(res.Violations))
			}
			if tc.want == 0 && len(res.Violations) > 0 {
				t.Errorf("an honest history has violations: %v", summarize(res.Violations))
			}
		})
	}
}
