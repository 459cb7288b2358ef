package e2e

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
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
