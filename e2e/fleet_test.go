package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// A fleet (docs/protocol.md §9), with the agent as a process, real
// mosquitto, etcd and firmware-sim.

// With mqtt.brokers, the agent connects to the first node; when that node
// is killed it moves to the next one and serves new commands there, and a
// controller given both nodes (ConnOptions.Brokers) reaches it there too.
// Each node is its own mosquitto (no bridge): the broker session does not
// move with the agent, which a real cluster adds (docs/operations.md).
func TestAgentMovesToTheNextBroker(t *testing.T) {
	e := newEnv(t, pump("pump-7"))
	n2 := mqtttest.StartMosquitto(t)
	e.brokers = fmt.Sprintf("[%s, %s]", e.broker, n2.URL())
	status2 := mqtttest.Subscribe(t, n2.URL(), wire.StatusTopic(wire.DefaultPrefix, gw))
	e.startProc() // online on node 1

	e.send("pump-7", cmd("on-node-1", 5, "set", `{"rpm":100}`))
	if r := e.final("on-node-1"); r.Code != wire.CodeOK {
		t.Fatalf("on node 1: %+v", r)
	}

	e.mosq.Kill()
	mqtttest.Await(t, status2, 30*time.Second, func(m mqtttest.Received) bool {
		var s wire.GatewayStatus
		return json.Unmarshal(m.Payload, &s) == nil && s.State == "online"
	})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := controller.Dial(ctx, controller.ConnOptions{Brokers: []string{e.broker, n2.URL()}, Gateway: gw})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	s := controller.NewSender(conn, &controller.FixedFence{Fence: 6, Holder: "fleet-test"}, nil)
	r, err := s.Send(ctx, "pump-7", "set", map[string]int{"rpm": 200}, controller.WithOpID("on-node-2"))
	if err != nil || r.Code != wire.CodeOK || r.LastFence != 6 {
		t.Fatalf("on node 2: %+v %v\n%s", r, err, e.log())
	}
	if ops := e.journalOps(); !slices.Equal(ops, []string{"on-node-1", "on-node-2"}) {
		t.Fatalf("firmware journal %v, want on-node-1 then on-node-2", ops)
	}
}
