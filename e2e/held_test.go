package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// edge_agent_writes_held_unknown counts a write while it is recorded
// unknown and not after: also when it leaves unknown by a resend (the
// device confirmed it unapplied) rather than by its final outcome.
func TestHeldGaugeFollowsAResend(t *testing.T) {
	e := newEnv(t, pump("p"))
	e.start()
	if err := e.sim.SetFaults(sim.Faults{Device: "p", ErrorRate: 1}); err != nil {
		t.Fatal(err)
	}
	e.send("p", cmd("r-1", 3, "set", `{"rpm":10}`))
	want(t, e.result("r-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	if e.sim.Injected().Errors == 0 {
		t.Fatal("the simulator answered no 503")
	}
	held := func() string {
		_, b := e.admin("/metrics")
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "edge_agent_writes_held_unknown ") {
				return strings.TrimPrefix(l, "edge_agent_writes_held_unknown ")
			}
		}
		return "absent"
	}
	e.sim.SetFaults(sim.Faults{}) // the resend under a new key is applied
	want(t, e.final("r-1"), wire.StatusApplied, wire.CodeOK)
	testkit.Eventually(t, 10*time.Second, "no write held after the resend", func() bool { return held() == "0" })
}
