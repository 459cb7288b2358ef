package e2e

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/store"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// lastFence reads the device's last_fence from the store file (the agent
// process must be stopped).
func (e *env) lastFence(dev string) (int64, store.Op) {
	e.t.Helper()
	st, err := store.Open(e.dataDir+"/agent.db", &store.Options{ReadOnly: true})
	if err != nil {
		e.t.Fatal(err)
	}
	defer st.Close()
	var d store.Device
	var last store.Op
	st.View(func(tx *store.Tx) error {
		d, _, _ = tx.Device(dev)
		return tx.Ops(dev, func(o store.Op) error { last = o; return nil })
	})
	return d.LastFence, last
}

// Invariants 3 and 4: killed after the pending record and before the device
// write, then after the write and before the outcome: on restart last_fence
// is intact, the write is resolved with the device, the journal holds it
// exactly once, and a Result is published.
func TestCrashPoints(t *testing.T) {
	for _, point := range []string{"after_pending", "after_write"} {
		t.Run(point, func(t *testing.T) {
			forEachBroker(t, func(t *testing.T, b brokerKind) {
				e := newEnvOn(t, b, pump("pump-7"))
				e.startProc("EDGE_AGENT_CRASH=" + point + ":op-1")
				e.send("pump-7", cmd("op-1", 7, "set", `{"rpm":700}`))
				if code := e.waitExit(20 * time.Second); code != -1 {
					t.Fatalf("agent exited %d, want killed by SIGKILL", code)
				}
				if !strings.Contains(e.log(), "SIGKILL at crash point") {
					t.Fatalf("the crash point was not reached:\n%s", e.log())
				}
				lf, rec := e.lastFence("pump-7")
				if lf != 7 || rec.Status != store.OpPending {
					t.Fatalf("after the crash: last_fence %d, op %s; want 7, pending", lf, rec.Status)
				}
				wantJournal := 0
				if point == "after_write" {
					wantJournal = 1
				}
				if n := len(e.journal()); n != wantJournal {
					t.Fatalf("journal has %d entries at the crash, want %d", n, wantJournal)
				}
				if e.res.count("op-1") != 0 {
					t.Fatal("a Result was published before the outcome was recorded")
				}
				e.startProc()
				r := e.final("op-1")
				want(t, r, wire.StatusApplied, wire.CodeOK)
				if r.LastFence != 7 {
					t.Fatalf("last_fence %d after restart", r.LastFence)
				}
				j := e.journal()
				if len(j) != 1 || j[0].OpID != "op-1" {
					t.Fatalf("journal after recovery: %+v", j)
				}
				if point == "after_pending" && !strings.HasPrefix(j[0].Key, "op-1.2.") {
					t.Fatalf("after_pending: applied under key %s; the first key must have been tombstoned and a new one issued", j[0].Key)
				}
				// The agent keeps serving, and a resend gets the recorded outcome.
				e.send("pump-7", cmd("op-1", 7, "set", `{"rpm":700}`))
				if r := e.result("op-1", 2); !r.Duplicate || r.Code != wire.CodeOK {
					t.Fatalf("resend after recovery: %+v", r)
				}
			})
		})
	}
}

// Invariant 2 across a crash: the agent is killed after the Result went out
// but before it acknowledged the command; the broker redelivers it, and the
// redelivery gets the recorded outcome, duplicate.
func TestRedeliveryAfterKillBeforeAck(t *testing.T) {
	forEachBroker(t, testRedeliveryAfterKillBeforeAck)
}

func testRedeliveryAfterKillBeforeAck(t *testing.T, b brokerKind) {
	e := newEnvOn(t, b, pump("pump-7"))
	e.startProc("EDGE_AGENT_CRASH=before_ack:op-1")
	e.send("pump-7", cmd("op-1", 3, "set", `{"rpm":300}`))
	first := e.result("op-1", 1)
	want(t, first, wire.StatusApplied, wire.CodeOK)
	if code := e.waitExit(20 * time.Second); code != -1 {
		t.Fatalf("agent exited %d, want SIGKILL", code)
	}
	e.startProc()
	dup := e.result("op-1", 2)
	want(t, dup, wire.StatusApplied, wire.CodeOK)
	if !dup.Duplicate {
		t.Fatalf("the redelivery was not answered as a duplicate: %+v", dup)
	}
	if n := len(e.journal()); n != 1 {
		t.Fatalf("journal has %d entries, want 1", n)
	}
}

// Invariant 5: a failed commit sends nothing, acknowledges nothing and
// stops the agent non-zero; the command is redelivered to the next run.
func TestStoreCommitFailureStopsTheAgent(t *testing.T) {
	e := newEnv(t, pump("pump-7"))
	// The first commit of a new store is its identity (internal/fencemem,
	// before the broker connects); the second is the command's admission.
	e.startProc("EDGE_AGENT_FAULT_FAIL_COMMIT=2")
	e.send("pump-7", cmd("op-1", 3, "set", `{"rpm":300}`))
	if code := e.waitExit(20 * time.Second); code != 1 {
		t.Fatalf("agent exited %d, want 1", code)
	}
	if !strings.Contains(e.log(), "injected failure at commit") {
		t.Fatalf("the fault did not happen:\n%s", e.log())
	}
	if n := len(e.journal()); n != 0 {
		t.Fatalf("the device was written: %d entries", n)
	}
	if e.res.count("op-1") != 0 {
		t.Fatal("a Result was published")
	}
	// Not acknowledged: the broker still has it for the agent's session.
	e.startProc()
	want(t, e.final("op-1"), wire.StatusApplied, wire.CodeOK)
	if n := len(e.journal()); n != 1 {
		t.Fatalf("journal has %d entries, want 1", n)
	}
}

// SIGTERM drains: the write in hand finishes and is recorded; exit 0.
func TestGracefulStopDrains(t *testing.T) {
	e := newEnv(t, pump("pump-7"))
	if err := e.sim.SetFaults(sim.Faults{Device: "pump-7", LatencyMS: 400}); err != nil {
		t.Fatal(err)
	}
	e.startProc() // waits for the agent's "online" status
	e.send("pump-7", cmd("op-1", 3, "set", `{"rpm":300}`))
	testkit.Eventually(t, 10*time.Second, "write under way", func() bool { return e.sim.Injected().Delayed > 0 })
	e.proc.Signal(syscall.SIGTERM)
	if code := e.waitExit(15 * time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0", code)
	}
	r := e.final("op-1")
	want(t, r, wire.StatusApplied, wire.CodeOK)
	_, rec := e.lastFence("pump-7")
	if rec.Status != store.OpFinal {
		t.Fatalf("op left %s after the drain", rec.Status)
	}
}

// Found by the review of store.Later: a published Result's outbox deletion
// waits for the next commit, which at a stop is the store's final commit
// in Close. That commit failing was logged but Stop returned nil, so the
// agent exited 0 after a failed fsync (invariant 5: a failed commit never
// ends in a clean stop). Now it is Stop's error, and `run` exits 1.
func TestStopAfterAFailedFinalCommitIsAnError(t *testing.T) {
	// The deletion waits at most store.LaterWithin (1s) for a commit: a
	// test stalled that long between the Result and Stop commits it before
	// the stop, and the final commit has nothing to fail. Try again then.
	for attempt := 1; ; attempt++ {
		e := newEnv(t, pump("pump-7"))
		var arm atomic.Bool
		var injected atomic.Int64
		e.failCommit = func() error {
			if arm.Load() {
				injected.Add(1)
				return errors.New("injected fsync failure at the final commit")
			}
			return nil
		}
		a := e.start()
		e.send("pump-7", cmd("op-1", 3, "set", `{"rpm":300}`))
		want(t, e.final("op-1"), wire.StatusApplied, wire.CodeOK)
		// The Result's outbox deletion is now queued for the next commit:
		// stop before it is due.
		arm.Store(true)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := a.Stop(ctx)
		cancel()
		e.app = nil
		if injected.Load() == 0 {
			if attempt < 3 {
				t.Logf("attempt %d: the deletion was committed before the stop; again", attempt)
				continue
			}
			t.Fatal("no commit was attempted during the stop in 3 attempts: the fault did not happen")
		}
		if !errors.Is(err, store.ErrFailed) {
			t.Fatalf("Stop = %v after a failed final commit, want store.ErrFailed", err)
		}
		return
	}
}
