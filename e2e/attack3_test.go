package e2e

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// Invariant 4 and liveness with ha (docs/protocol.md §8): a delivery the
// agent refuses while its session is not proven (left unacknowledged, so
// that the broker gives it to the session's next holder) must not be lost
// when the session is proven again without a stand-down, nor stall the
// PUBACKs of every later delivery.
//
// The sequence: the active is paused (SIGSTOP) for longer than session_ttl
// - safety_margin but shorter than its lease (so no standby could take
// over, and its first keepalive after waking succeeds: no stand-down, its
// MQTT connection stays). A command published during the pause sits in
// its socket; woken, paho hands it over before the keepalive's answer, so
// it is refused unacknowledged. The broker never sends it again on that
// connection, and the client's in-order acker holds every later PUBACK
// behind it: once max_inflight_messages (256 in configs/mosquitto.conf)
// later deliveries wait, the broker sends nothing more and the gateway
// takes no command until it restarts.
func TestHARefusedDeliveryIsTakenOnceProvenAgain(t *testing.T) {
	f := newFM(t)
	// Lease 8s, proof 5s (8s - 3s), own keepalives every 5s/3: a pause of
	// 5.7s is past the proof whenever it starts, and within the lease
	// (renewed at most 5s/3 before the pause).
	f.extra = strings.Replace(f.extra, "session_ttl: 3s", "session_ttl: 8s", 1) +
		"ha:\n  enabled: true\n  safety_margin: 3s\n"
	f.run()
	g := f.lock()
	want(t, f.cmdOp("op-1", g, "set", `{"rpm":100}`), wire.StatusApplied, wire.CodeOK)

	const refused = "a command is not taken while the session is not proven alive"
	var held string
	for attempt := 1; ; attempt++ {
		before := f.log()
		held = fmt.Sprintf("during-pause-%d", attempt)
		f.proc.Signal(syscall.SIGSTOP)
		f.send("pump-7", cmd(held, g, "set", `{"rpm":200}`))
		time.Sleep(5700 * time.Millisecond) // the fault itself: a pause of this length
		f.proc.Signal(syscall.SIGCONT)
		// The agent logs the refusal right after waking (its paho
		// client reads the command before the keepalive is answered).
		var after string
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if after = strings.TrimPrefix(f.log(), before); strings.Contains(after, refused) {
				break
			}
		}
		if strings.Contains(after, refused) {
			t.Logf("attempt %d: the delivery of %s was refused (stood down: %v)", attempt, held, strings.Contains(after, "stands down as standby"))
			break
		}
		if attempt == 3 {
			t.Fatalf("the fault did not happen in 3 pauses (no delivery refused):\n%s", after)
		}
		t.Logf("attempt %d: no delivery refused; again", attempt)
		f.final(held)
	}
	// The refused command, published once, is answered: its delivery was
	// not acknowledged, so the broker sends it again once the agent that
	// stood down is active again (the connection it came on closed).
	if r := f.final(held); r.Status != wire.StatusApplied {
		t.Fatalf("%s: %+v", held, r)
	}
	// And the PUBACKs flow: more commands than the broker's in-flight
	// window, each sent after the previous one's Result, are all taken.
	for i := range 300 {
		op := fmt.Sprintf("after-%d", i)
		f.send("pump-7", cmd(op, g, "set", fmt.Sprintf(`{"rpm":%d}`, 300+i)))
		if r := f.res.wait(op, 1, 10*time.Second); r.Status != wire.StatusApplied {
			t.Fatalf("%s: %+v", op, r)
		}
	}
	f.checkJournal()
}

// Invariant 8 across a pair (docs/protocol.md §8; found reviewing
// ff954e8): a deposed active whose worker waits, before asking about an
// unresolved write, until it is active again keeps the commands queued
// behind that write in its inbox through the other agent's reign. Their
// controller, with no Result, resends one of them under its new lock
// generation (the same op_id with another fence: the same operation,
// docs/protocol.md §1) and the new active applies it. When the old
// active is active again (the new one killed), it answers its stale
// inbox copy of the same op_id stale_fence: a final Result followed by a
// different one.
//
// The deposed worker asks about q-1 at once and answers q-2
// fence_unconfirmed (not final); with ff954e8's gate in ask (since
// reverted) it failed: q-2 applied/ok by the new active, then
// rejected/stale_fence by the old one.
func TestHADeposedInboxDoesNotContradictTheOtherActive(t *testing.T) {
	t.Setenv("MQTTTEST_VERBOSE", "1") // mosquitto logs every PUBACK
	f := newHA(t)
	b := f.peer()
	g1 := f.lock()
	want(t, f.cmdOp("op-1", g1, "set", `{"rpm":100}`), wire.StatusApplied, wire.CodeOK)
	setFaults(t, f.sim, sim.Faults{Device: "pump-7", LatencyMS: 700})
	pubacks := func() int { return strings.Count(f.mosq.Log(), "Received PUBACK from edge-agent-e2e") }
	acked := pubacks()
	f.send("pump-7", cmd("q-1", g1, "set", `{"rpm":150}`))
	f.send("pump-7", cmd("q-2", g1, "set", `{"rpm":160}`))
	testkit.Eventually(t, 10*time.Second, "q-1 in flight, q-2 queued", func() bool {
		d := f.device()
		return d.Pending == 1 && d.QueueDepth >= 1
	})
	// Both taken by the active: the broker will not give them to the
	// other agent.
	testkit.Eventually(t, 5*time.Second, "q-1 and q-2 acknowledged", func() bool { return pubacks() >= acked+2 })
	f.proc.Signal(syscall.SIGSTOP)
	waitActive(t, b.adminAt, time.Now())
	setFaults(t, f.sim, sim.Faults{Device: "pump-7"})
	// The holder, without a Result for q-2, takes a new generation and
	// resends q-2 under it: the new active applies it.
	g2 := f.lock()
	want(t, f.cmdOp("g2-barrier", g2, wire.ActionFence, ""), wire.StatusApplied, wire.CodeOK)
	want(t, f.cmdOp("q-2", g2, "set", `{"rpm":160}`), wire.StatusApplied, wire.CodeOK)
	f.proc.Signal(syscall.SIGCONT)
	testkit.Eventually(t, 10*time.Second, "the old active standby", func() bool {
		r, _ := haRole(f.adminAt)
		return r == "standby"
	})
	b.proc.Signal(syscall.SIGKILL)
	waitActive(t, f.adminAt, time.Now())
	// The old active works its inbox; q-1 ends first.
	testkit.Eventually(t, 15*time.Second, "q-1 final", func() bool {
		rs := f.res.results("q-1")
		return len(rs) > 0 && rs[len(rs)-1].Final()
	})
	// A barrier after q-2's copy: once it is answered the inbox is worked.
	g3 := f.lock()
	want(t, f.cmdOp("g3-barrier", g3, wire.ActionFence, ""), wire.StatusApplied, wire.CodeOK)
	var first *wire.Result
	for _, r := range f.res.results("q-2") {
		if !r.Final() || r.Code == wire.CodeBusy || r.Code == wire.CodeFenceUnconfirmed {
			continue // not final (invariant 8)
		}
		if first == nil {
			first = &r
			continue
		}
		if r.Status != first.Status || r.Code != first.Code {
			t.Fatalf("q-2 was final %s/%s, then %s/%s (%s)", first.Status, first.Code, r.Status, r.Code, r.Reason)
		}
	}
}
