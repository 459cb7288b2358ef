package e2e

// Adversarial tests: each TestAttack* drives one sequence of events that
// breaks an invariant of docs/design.md or a rule of docs/protocol.md §1. A test that
// fails shows a real bug (see the comment above it).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/app"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/store"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// Invariant 1 (docs/design.md): "once a command or barrier with fence F has
// passed the worker's fence check, no command with a fence below F ever
// takes effect on the device afterwards", and docs/protocol.md's order of checks
// puts `last_fence = max(last_fence, fence)` before the policy.
//
// Sequence: the new owner's command (fence 10) passes lock/expiry/fence,
// then the policy cannot decide (here: its input exceeds the binding's
// max_input) -> policy_error. worker.drop() deletes the record and never
// raises last_fence. The old owner's command (fence 5) then passes the
// fence check (last_fence is still 0) and reaches the device.
func TestAttackPolicyErrorLeavesFenceDown(t *testing.T) {
	dir := plugins(t)
	d := pump("pump-7")
	d.policy = "      plugin: range-limit-c\n      config: {param: rpm, min: 0, max: 3000}\n      limits: {max_input: 2048}\n"
	e := newEnv(t, d)
	e.extra = "plugins:\n  dir: " + dir + "\n"
	e.start()

	pad := strings.Repeat("x", 4096)
	e.send("pump-7", cmd("new-1", 10, "set", fmt.Sprintf(`{"rpm":100,"note":%q}`, pad)))
	r := e.final("new-1")
	want(t, r, wire.StatusRejected, wire.CodePolicyError)

	e.send("pump-7", cmd("old-1", 5, "set", `{"rpm":2500}`))
	r = e.final("old-1")
	for _, j := range e.journal() {
		if j.OpID == "old-1" {
			t.Fatalf("fence 5 took effect on the device after fence 10 passed the fence check (policy_error left last_fence at %d): %+v", r.LastFence, j)
		}
	}
	want(t, r, wire.StatusRejected, wire.CodeStaleFence)
}

// docs/protocol.md DeviceState: `state` is "the device's last confirmed state as
// the agent knows it" (retained). worker.newKey publishes, whenever it
// raises last_fence, a DeviceState built from store.Device{LastFence: lf}:
// empty state and empty last_op_id. The retained state is wiped on every
// fence raise; while the write is then held (unknown on a device that
// cannot be asked, or a hanging device) the retained message keeps lying.
func TestAttackFenceRaiseWipesRetainedState(t *testing.T) {
	e := newEnv(t, pump("pump-7"))
	states := mqtttest.Subscribe(t, e.broker, wire.StateTopic(wire.DefaultPrefix, gw, "pump-7"))
	e.start()

	e.send("pump-7", cmd("a-1", 1, "set", `{"rpm":100}`))
	want(t, e.final("a-1"), wire.StatusApplied, wire.CodeOK)
	// Skip up to the state that a-1 produced.
	mqtttest.Await(t, states, 10*time.Second, func(m mqtttest.Received) bool {
		var s wire.DeviceState
		return json.Unmarshal(m.Payload, &s) == nil && s.LastOpID == "a-1"
	})

	e.send("pump-7", cmd("b-1", 2, "set", `{"rpm":200}`))
	want(t, e.final("b-1"), wire.StatusApplied, wire.CodeOK)
	for {
		m := mqtttest.Await(t, states, 10*time.Second, func(mqtttest.Received) bool { return true })
		var s wire.DeviceState
		if err := json.Unmarshal(m.Payload, &s); err != nil {
			t.Fatal(err)
		}
		if s.LastOpID == "" || string(s.State) == "{}" {
			t.Fatalf("retained DeviceState lost the device's confirmed state on a fence raise: %s", m.Payload)
		}
		if s.LastOpID == "b-1" {
			return
		}
	}
}

// docs/protocol.md §1: "An `unknown` outcome is recorded as unknown, published,
// and once resolved, recorded and published again"; docs/design.md recovery:
// "every pending record counts as unknown".
//
// Sequence: device queryable: false; the agent is SIGKILLed after the
// write (after_write). On restart, settle() sets o.WasUnknown = true before
// markUnknown(), so markUnknown's `first` is false and no unknown Result
// enters the outbox: the op is held for an operator indefinitely and the
// controller is never told its outcome is unknown.
func TestAttackNonQueryableCrashPublishesNoUnknown(t *testing.T) {
	d := pump("pump-7")
	d.queryable = false
	e := newEnv(t, d)
	e.startProc("EDGE_AGENT_CRASH=after_write:op-1")
	e.send("pump-7", cmd("op-1", 7, "set", `{"rpm":700}`))
	if code := e.waitExit(20 * time.Second); code != -1 {
		t.Fatalf("agent exited %d, want killed at the crash point", code)
	}
	e.startProc()
	// Held until an operator resolves it: an unknown Result must come.
	r := e.res.wait("op-1", 1, 8*time.Second)
	want(t, r, wire.StatusUnknown, wire.CodeOutcomeUnknown)
}

// docs/design.md Retention: "records whose Result is still in the outbox are
// never deleted", and a final record goes once it is older than the
// retention and not among the last N. (The first version counted each op's
// unpublished Results on its record; the worker wrote stale copies back
// and the count drifted, so records leaked or could be swept unpublished.
// Sweep now looks the outbox up instead.) With the broker down, an op that
// was unknown and then applied has both Results in the outbox: a sweep with
// the clock ten years ahead and keep_last 0 must keep its record; once the
// broker is back and the Results are published, the same sweep deletes it.
func TestAttackRetentionKeepsUnpublishedRecords(t *testing.T) {
	d := pump("pump-7")
	d.timeout = "300ms"
	e := newEnv(t, d)
	a := e.start()
	inOutbox := func(op string) (rec store.Op, found bool, entries int) {
		a.Store().View(func(tx *store.Tx) error {
			rec, found, _ = tx.Op("pump-7", op)
			return tx.Outbox(func(o store.Outbox) error {
				if o.OpID == op {
					entries++
				}
				return nil
			})
		})
		return
	}
	sweep := func() int {
		var n int
		if err := a.Store().Update(context.Background(), func(tx *store.Tx) error {
			var err error
			n, err = tx.Sweep(time.Now().Add(10*365*24*time.Hour), time.Hour, 0, 1000)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", LatencyMS: 1500})
	e.send("pump-7", cmd("op-2", 3, "set", `{"rpm":400}`))
	testkit.Eventually(t, 10*time.Second, "op-2 under way", func() bool { return e.sim.Injected().Delayed > 0 })
	e.mosq.Stop()
	testkit.Eventually(t, 15*time.Second, "op-2 final", func() bool {
		r, _, _ := inOutbox("op-2")
		return r.Status == store.OpFinal
	})
	if _, _, n := inOutbox("op-2"); n != 2 {
		t.Fatalf("op-2 has %d Results in the outbox with the broker down, want 2 (unknown, applied)", n)
	}
	sweep()
	if _, found, _ := inOutbox("op-2"); !found {
		t.Fatal("retention deleted a record whose Result is still in the outbox")
	}
	e.mosq.Restart()
	testkit.Eventually(t, 20*time.Second, "op-2's Results published", func() bool {
		_, _, n := inOutbox("op-2")
		return n == 0
	})
	if n := sweep(); n != 1 {
		t.Fatalf("sweep after publishing deleted %d records, want 1", n)
	}
	if _, found, _ := inOutbox("op-2"); found {
		t.Fatal("published old record beyond keep_last 0 was kept")
	}
}

// docs/design.md device groups: "its policy sees every member's state"; the
// group exists so that "the valve may not open while the pump runs".
//
// Sequence: pump-1 (queryable: false) and valve-2 form a group guarded by
// the interlock policy. "pump-1 set rpm 500" times out (the firmware
// applies it late) -> unknown, held. The operator resolves it applied.
// Agent.Resolve records applied/ok but leaves the device's State as it was
// ({}: never confirmed), so the group view still shows pump-1 stopped and
// the interlock lets "valve-2 open 50" reach the device while the pump runs.
func TestAttackOperatorResolveHidesPumpFromInterlock(t *testing.T) {
	dir := plugins(t)
	p := pump("pump-1")
	p.group, p.queryable, p.timeout = "station", false, "300ms"
	v := pump("valve-2")
	v.typ, v.group = "valve", "station"
	v = withPolicy(v, "interlock", "{pump: pump-1, valve: valve-2}")
	e := newEnv(t, p, v)
	e.extra = "plugins:\n  dir: " + dir + "\n"
	e.start()
	setFaults(t, e.sim, sim.Faults{Device: "pump-1", LatencyMS: 1500})

	e.send("pump-1", cmd("i1", 10, "set", `{"rpm":500}`))
	want(t, e.result("i1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	testkit.Eventually(t, 10*time.Second, "the firmware applied i1", func() bool {
		for _, j := range e.journal() {
			if j.OpID == "i1" {
				return true
			}
		}
		return false
	})
	resp, err := http.Post("http://"+e.app.AdminAddr()+"/v1/devices/pump-1/ops/i1/resolve", "application/json", strings.NewReader(`{"applied":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("resolve: HTTP %d", resp.StatusCode)
	}
	want(t, e.final("i1"), wire.StatusApplied, wire.CodeOK)

	e.send("valve-2", cmd("i2", 10, "set", `{"open":50}`))
	r := e.final("i2")
	for _, j := range e.journal() {
		if j.OpID == "i2" {
			t.Fatalf("valve-2 opened while pump-1 runs (operator confirmed rpm 500 applied); Result %s/%s: %s", r.Status, r.Code, r.Reason)
		}
	}
}

// Invariant 4: "unpublished Results are published" after a restart.
//
// Sequence: op-1's Results are recorded while the broker is down (they stay
// in the outbox); the agent is stopped and started again while the broker
// is still down; then the broker comes back. At start-up the publisher
// hands the outbox to mqtt.Client.PublishAsync as soon as Start has built
// the paho client, but before its first connect succeeded: paho (with
// ConnectRetry false) completes that publish token at once with
// ErrNotConnected, publisher.confirm logs "publish not confirmed" and moves
// on, and nothing ever retries it in this run: the Results stay in the
// outbox unpublished until the next restart. The same happens to every
// Result recorded by recovery (pending writes resolved, queued commands)
// before the first connect.
func TestAttackOutboxNotRepublishedWhenBrokerDownAtStart(t *testing.T) {
	d := pump("pump-7")
	d.timeout = "300ms"
	e := newEnv(t, d)
	a := e.start()
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", LatencyMS: 1500})
	e.send("pump-7", cmd("op-1", 3, "set", `{"rpm":300}`))
	testkit.Eventually(t, 10*time.Second, "write under way", func() bool { return e.sim.Injected().Delayed > 0 })
	e.mosq.Stop()
	outbox := func(a *app.App) int {
		n := 0
		a.Store().View(func(tx *store.Tx) error {
			return tx.Outbox(func(o store.Outbox) error {
				if o.OpID == "op-1" {
					n++
				}
				return nil
			})
		})
		return n
	}
	testkit.Eventually(t, 15*time.Second, "op-1 final", func() bool {
		var rec store.Op
		a.Store().View(func(tx *store.Tx) error { rec, _, _ = tx.Op("pump-7", "op-1"); return nil })
		return rec.Status == store.OpFinal
	})
	e.stop()

	// Start again with the broker still down (start() would wait for it).
	cfg, err := config.Load(e.writeConfig())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	a2 := app.New(cfg, app.Options{Logger: log, Version: "e2e"})
	if err := a2.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.app = a2
	if n := outbox(a2); n == 0 {
		t.Fatal("op-1's Results are not in the outbox at the restart; the sequence did not happen")
	}
	time.Sleep(2 * time.Second)
	e.mosq.Restart()
	testkit.Eventually(t, 10*time.Second, "agent connected again", func() bool { return a2.Ready() == nil })
	deadline := time.Now().Add(10 * time.Second)
	for outbox(a2) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("op-1 still has %d Results in the outbox 10s after the broker came back: never published in this run", outbox(a2))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Found by the review of the fast path (a command decided in its
// admission's commit): a graceful stop that came while that commit was
// under way left the command pending although nothing had been sent; after
// a restart a device that cannot be asked published outcome_unknown and was
// held for an operator. Now the worker sends it as the write in hand.
func TestStopDuringFastPathAdmissionSendsTheWrite(t *testing.T) {
	d := pump("p1")
	d.queryable = false
	e := newEnv(t, d)
	var slow atomic.Bool
	inCommit := make(chan struct{})
	var once sync.Once
	var commitEnd atomic.Int64
	e.failCommit = func() error {
		if slow.Load() {
			once.Do(func() { close(inCommit) })
			time.Sleep(300 * time.Millisecond) // a slow fsync
			commitEnd.CompareAndSwap(0, time.Now().UnixNano())
		}
		return nil
	}
	e.start()
	slow.Store(true)
	e.send("p1", cmd("op-1", 5, "set", `{"rpm":100}`))
	select {
	case <-inCommit: // the admission (pending, decided on arrival) is being committed
	case <-time.After(10 * time.Second):
		t.Fatal("the admission never reached the store")
	}
	stopAt := time.Now().UnixNano()
	e.stop()
	if end := commitEnd.Load(); end == 0 || stopAt >= end {
		t.Fatalf("the stop did not come while the admission was being committed (stop %d, commit end %d)", stopAt, end)
	}
	if got := e.journalOps(); fmt.Sprint(got) != "[op-1]" {
		t.Fatalf("journal after the stop: %v, want [op-1] (the write in hand is sent)", got)
	}
	if r := e.final("op-1"); r.Status != wire.StatusApplied {
		t.Fatalf("op-1: %+v", r)
	}
	slow.Store(false)
	e.start()
	code, body := e.admin("/v1/devices/p1/ops/op-1")
	var o struct{ Status string }
	json.Unmarshal(body, &o)
	if code != http.StatusOK || o.Status != string(wire.StatusApplied) {
		t.Fatalf("after restart op-1 is %d %s, want applied", code, body)
	}
	for _, r := range e.res.results("op-1") {
		if r.Status == wire.StatusUnknown {
			t.Errorf("an unknown Result was published for a write that was sent and applied: %+v", r)
		}
	}
}

// Invariant 3 on the fast path: a command decided in its admission's
// commit is not sent before that commit is durable. The admission's commit
// is slowed down and then fails: the device must never see the write
// (without the worker's wait for the commit, it is written while the
// commit is still under way).
func TestFastPathSendsNothingBeforeItsCommit(t *testing.T) {
	e := newEnv(t, pump("p1"))
	var armed atomic.Bool
	var injected atomic.Int32
	e.failCommit = func() error {
		if !armed.CompareAndSwap(true, false) {
			return nil
		}
		time.Sleep(300 * time.Millisecond) // a slow fsync...
		injected.Add(1)
		return errors.New("injected commit failure") // ...that fails
	}
	a := e.start()
	armed.Store(true)
	e.send("p1", cmd("op-1", 5, "set", `{"rpm":100}`))
	select {
	case <-a.Failed():
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not stop on the failed commit")
	}
	if injected.Load() != 1 || !strings.Contains(fmt.Sprint(a.Err()), "injected commit failure") {
		t.Fatalf("the fault did not happen as planned: injected %d, agent error %v", injected.Load(), a.Err())
	}
	if got := e.journalOps(); len(got) != 0 {
		t.Fatalf("the device was written before (and without) the admission's commit: %v", got)
	}
	if n := e.res.count("op-1"); n != 0 {
		t.Fatalf("%d Results published after a failed commit", n)
	}
}
