package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/store"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

func want(t testing.TB, r wire.Result, status wire.Status, code wire.Code) {
	t.Helper()
	if r.Status != status || r.Code != code {
		t.Fatalf("Result %s: got %s/%s (%s), want %s/%s", r.OpID, r.Status, r.Code, r.Reason, status, code)
	}
}

// Invariant 1: a stale holder's write never reaches the device.
func TestStaleHolderIsFencedOff(t *testing.T) { forEachBroker(t, testStaleHolderIsFencedOff) }

func testStaleHolderIsFencedOff(t *testing.T, b brokerKind) {
	e := newEnvOn(t, b, pump("pump-7"))
	e.start()

	e.send("pump-7", cmd("b-1", 42, "set", `{"rpm":1200}`))
	r := e.result("b-1", 1)
	want(t, r, wire.StatusApplied, wire.CodeOK)
	if r.LastFence != 42 || string(r.Output) != `{"rpm":1200}` {
		t.Fatalf("applied Result: %+v", r)
	}

	e.send("pump-7", cmd("a-1", 41, "set", `{"rpm":3000}`))
	r = e.result("a-1", 1)
	want(t, r, wire.StatusRejected, wire.CodeStaleFence)
	if r.LastFence != 42 || r.Duplicate {
		t.Fatalf("stale Result: %+v", r)
	}

	// Equal fences: the same owner sends many commands in one generation.
	e.send("pump-7", cmd("b-2", 42, "set", `{"rpm":1300}`))
	want(t, e.result("b-2", 1), wire.StatusApplied, wire.CodeOK)

	// A barrier at 50 shuts out 42 without touching the device.
	e.send("pump-7", cmd("c-fence", 50, wire.ActionFence, ""))
	r = e.result("c-fence", 1)
	want(t, r, wire.StatusApplied, wire.CodeOK)
	if r.LastFence != 50 {
		t.Fatalf("barrier: last_fence %d, want 50", r.LastFence)
	}
	e.send("pump-7", cmd("b-3", 42, "set", `{"rpm":1400}`))
	want(t, e.result("b-3", 1), wire.StatusRejected, wire.CodeStaleFence)

	// A barrier below last_fence is stale too.
	e.send("pump-7", cmd("old-fence", 49, wire.ActionFence, ""))
	r = e.result("old-fence", 1)
	want(t, r, wire.StatusRejected, wire.CodeStaleFence)
	if r.LastFence != 50 {
		t.Fatalf("last_fence moved: %+v", r)
	}

	if got := strings.Join(e.journalOps(), ","); got != "b-1,b-2" {
		t.Fatalf("journal holds %q, want only b-1,b-2", got)
	}
	for _, j := range e.journal() {
		if j.Fence != 42 {
			t.Fatalf("journal entry with fence %d", j.Fence)
		}
	}
	// The retained DeviceState says the same.
	code, body := e.admin("/v1/devices/pump-7")
	var di wire.DeviceInfo
	json.Unmarshal(body, &di)
	if code != 200 || di.LastFence != 50 || di.LastOpID != "c-fence" {
		t.Fatalf("admin device: %d %s", code, body)
	}
}

// Invariant 2: a resend gets the recorded outcome; another command under
// the same op_id is op_conflict and leaves the record untouched.
func TestDuplicateAndConflict(t *testing.T) { forEachBroker(t, testDuplicateAndConflict) }

func testDuplicateAndConflict(t *testing.T, b brokerKind) {
	e := newEnvOn(t, b, pump("pump-7"))
	e.start()
	e.send("pump-7", cmd("op-1", 5, "set", `{"rpm":100}`))
	first := e.result("op-1", 1)
	want(t, first, wire.StatusApplied, wire.CodeOK)

	// The same op with params in another key order and number format, and
	// another fence: the same operation.
	e.send("pump-7", cmd("op-1", 6, "set", `{"rpm":1e2}`))
	dup := e.result("op-1", 2)
	want(t, dup, wire.StatusApplied, wire.CodeOK)
	if !dup.Duplicate || dup.Fence != 6 || !dup.At.Equal(first.At) || string(dup.Output) != string(first.Output) {
		t.Fatalf("replay: %+v (first %+v)", dup, first)
	}

	e.send("pump-7", cmd("op-1", 5, "set", `{"rpm":999}`))
	conflict := e.result("op-1", 3)
	want(t, conflict, wire.StatusRejected, wire.CodeOpConflict)

	if n := len(e.journal()); n != 1 {
		t.Fatalf("journal has %d entries, want 1", n)
	}
	code, body := e.admin("/v1/devices/pump-7/ops/op-1")
	var rec wire.Result
	json.Unmarshal(body, &rec)
	if code != 200 || rec.Code != wire.CodeOK || !rec.At.Equal(first.At) {
		t.Fatalf("record after conflict: %d %s", code, body)
	}
	if code, _ := e.admin("/v1/devices/pump-7/ops/nope"); code != http.StatusNotFound {
		t.Fatalf("unknown op: %d", code)
	}
}

// Malformed input: each gets its code, and the agent keeps serving.
func TestMalformedCommands(t *testing.T) {
	d := pump("pump-7")
	d.lock = "locks/device/pump-7"
	e := newEnv(t, d)
	e.start()
	huge := `{"op_id":"huge","fence":1,"action":"set","params":{"x":"` + strings.Repeat("y", wire.MaxCommandSize) + `"}}`
	cases := []struct {
		name, dev, payload, op string
		code                   wire.Code
	}{
		{"bad json", "pump-7", `{"op_id":"bad-json","fence":`, "", wire.CodeInvalid},
		{"duplicate keys", "pump-7", `{"op_id":"dupkeys","fence":1,"action":"set","action":"stop"}`, "dupkeys", wire.CodeInvalid},
		{"fence 0", "pump-7", `{"op_id":"f0","fence":0,"action":"set"}`, "f0", wire.CodeInvalid},
		{"negative fence", "pump-7", `{"op_id":"fneg","fence":-1,"action":"set"}`, "fneg", wire.CodeInvalid},
		{"fence 2^64", "pump-7", `{"op_id":"f64","fence":18446744073709551616,"action":"set"}`, "f64", wire.CodeInvalid},
		{"float fence", "pump-7", `{"op_id":"ffloat","fence":1.5,"action":"set"}`, "ffloat", wire.CodeInvalid},
		{"huge payload", "pump-7", huge, "", wire.CodeInvalid},
		{"bad op_id", "pump-7", `{"op_id":"a b","fence":1,"action":"set"}`, "", wire.CodeInvalid},
		{"wildcard reply_to", "pump-7", `{"op_id":"wild","fence":1,"action":"set","reply_to":"x/+"}`, "wild", wire.CodeInvalid},
		{"unknown device", "pump-99", `{"op_id":"nodev","fence":1,"action":"set"}`, "nodev", wire.CodeUnknownDevice},
		{"missing lock on a bound device", "pump-7", `{"op_id":"nolock","fence":1,"action":"set","params":{"rpm":1}}`, "nolock", wire.CodeLockMismatch},
		{"wrong lock", "pump-7", `{"op_id":"wronglock","fence":1,"action":"set","lock":"other","params":{"rpm":1}}`, "wronglock", wire.CodeLockMismatch},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := e.res.count(tc.op)
			e.send(tc.dev, tc.payload)
			r := e.res.wait(tc.op, before+1, 10*time.Second)
			if r.Code != tc.code || r.Status != wire.StatusRejected || r.Reason == "" {
				t.Fatalf("got %+v, want %s", r, tc.code)
			}
			if r.Device != tc.dev {
				t.Fatalf("device %q, want %q", r.Device, tc.dev)
			}
		})
	}
	// Still serving.
	e.send("pump-7", wire.Command{OpID: "good", Fence: 3, Action: "set", Lock: "locks/device/pump-7", Params: json.RawMessage(`{"rpm":10}`)})
	want(t, e.result("good", 1), wire.StatusApplied, wire.CodeOK)
	if got := strings.Join(e.journalOps(), ","); got != "good" {
		t.Fatalf("journal: %s", got)
	}
}

// A retained message on a cmd topic is a replay, never a command: not
// executed, not answered, and cleared.
func TestRetainedCommandIsIgnoredAndCleared(t *testing.T) {
	e := newEnv(t, pump("pump-7"))
	topic := wire.CmdTopic(wire.DefaultPrefix, gw, "pump-7")
	tok := e.sender.Publish(topic, 1, true, []byte(`{"op_id":"ret","fence":1,"action":"set","params":{"rpm":5}}`))
	tok.Wait()
	e.start()
	e.send("pump-7", cmd("after", 1, "set", `{"rpm":6}`))
	want(t, e.result("after", 1), wire.StatusApplied, wire.CodeOK)
	if e.res.count("ret") != 0 {
		t.Fatal("the retained command was answered")
	}
	if got := strings.Join(e.journalOps(), ","); got != "after" {
		t.Fatalf("journal: %s", got)
	}
	// Cleared: a new subscriber gets no retained message on that topic.
	testkit.Eventually(t, 5*time.Second, "retained message cleared", func() bool {
		c := connect(t, e.broker, fmt.Sprintf("probe-%d", time.Now().UnixNano()))
		got := make(chan struct{}, 1)
		c.Subscribe(topic, 1, func(_ pahoClient, m pahoMessage) { got <- struct{}{} }).Wait()
		select {
		case <-got:
			c.Disconnect(10)
			return false
		case <-time.After(300 * time.Millisecond):
			c.Disconnect(10)
			return true
		}
	})
}

func TestExpiredAndBusy(t *testing.T) {
	d := pump("pump-7")
	d.queue = 2
	e := newEnv(t, d, pump("pump-8"))
	e.start()
	past := time.Now().Add(-time.Minute)
	c := cmd("late", 1, "set", `{"rpm":1}`)
	c.ExpiresAt = &past
	e.send("pump-7", c)
	want(t, e.result("late", 1), wire.StatusRejected, wire.CodeExpired)

	// Hold the worker in a write, fill the queue of 2, the next is busy.
	if err := e.sim.SetFaults(sim.Faults{Device: "pump-7", Hang: true}); err != nil {
		t.Fatal(err)
	}
	e.send("pump-7", cmd("h0", 1, "set", `{"rpm":1}`))
	testkit.Eventually(t, 5*time.Second, "h0 in the device", func() bool { return e.sim.Injected().Held > 0 })
	e.send("pump-7", cmd("q1", 1, "set", `{"rpm":2}`))
	e.send("pump-7", cmd("q2", 1, "set", `{"rpm":3}`))
	e.send("pump-7", cmd("q3", 1, "set", `{"rpm":4}`))
	want(t, e.result("q3", 1), wire.StatusRejected, wire.CodeBusy)
	if e.res.count("q1")+e.res.count("q2") != 0 {
		t.Fatal("queued commands answered while the device hangs")
	}
	// Busy is not recorded: after the device recovers, q3 resent is handled afresh.
	if err := e.sim.SetFaults(sim.Faults{}); err != nil {
		t.Fatal(err)
	}
	want(t, e.final("h0"), wire.StatusApplied, wire.CodeOK)
	want(t, e.final("q1"), wire.StatusApplied, wire.CodeOK)
	want(t, e.final("q2"), wire.StatusApplied, wire.CodeOK)
	e.send("pump-7", cmd("q3", 1, "set", `{"rpm":4}`))
	r := e.result("q3", 2)
	want(t, r, wire.StatusApplied, wire.CodeOK)
	if r.Duplicate {
		t.Fatal("busy was recorded")
	}
}

var _ = store.OpFinal
