package e2e

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/agent"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// The retained DeviceState of a device that changes faster than
// agent.StateInterval is paced: at most one publish per interval, and the
// latest state is always the one that ends up published (also when the
// agent stops while one is held).
func TestDeviceStateIsPacedAndEndsOnTheLatest(t *testing.T) {
	e := newEnv(t, pump("p1"))
	e.start()
	topic := wire.StateTopic(wire.DefaultPrefix, gw, "p1")
	states := mqtttest.Subscribe(t, e.broker, topic)
	start := time.Now()
	const n = 40
	for i := 1; i <= n; i++ {
		op := fmt.Sprintf("st-%d", i)
		e.send("p1", cmd(op, 3, "set", fmt.Sprintf(`{"rpm":%d}`, 100+i)))
		if r := e.final(op); r.Status != wire.StatusApplied {
			t.Fatalf("%s: %+v", op, r)
		}
	}
	elapsed := time.Since(start)
	e.stop() // a state held for the interval is published on the way out
	var got []wire.DeviceState
	var last wire.DeviceState
	for last.LastOpID != fmt.Sprintf("st-%d", n) {
		m := mqtttest.Await(t, states, 10*time.Second, nil)
		if err := json.Unmarshal(m.Payload, &last); err != nil {
			t.Fatal(err)
		}
		got = append(got, last)
	}
	if string(last.State) != fmt.Sprintf(`{"rpm":%d}`, 100+n) {
		t.Errorf("last state %s, want rpm %d", last.State, 100+n)
	}
	// One publish per interval, plus the first one and the one held at the
	// end; the commands took far less than n intervals.
	if most := int(elapsed/agent.StateInterval) + 3; len(got) > most {
		t.Errorf("%d states published for %d changes in %s, want at most %d", len(got), n, elapsed, most)
	}
	if elapsed > n*agent.StateInterval/2 {
		t.Logf("the commands took %s: too slow for the pacing to show", elapsed)
	}
	// What the broker retains is the latest.
	fresh := mqtttest.Subscribe(t, e.broker, topic)
	m := mqtttest.Await(t, fresh, 5*time.Second, nil)
	var ret wire.DeviceState
	json.Unmarshal(m.Payload, &ret)
	if !m.Retained || ret.LastOpID != fmt.Sprintf("st-%d", n) {
		t.Errorf("retained state: %s (retained %v), want the last op's", m.Payload, m.Retained)
	}
}
