package schema_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/app"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// The fence_unconfirmed Result of a gateway whose fence memory cannot be
// confirmed (docs/protocol.md §7: a new store, coordination.etcd
// configured and unreachable) validates against the Result schema.
// (TestAgentMessagesValidate's gateway does not coordinate.)
func TestFenceUnconfirmedResultValidates(t *testing.T) {
	s := schemas(t)
	broker := mqtttest.StartMosquitto(t)
	fw := sim.StartForTest(t, map[string]string{"pump-1": "pump"})
	dir := t.TempDir()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`gateway_id: %s
data_dir: %s
mqtt: {broker: %s, client_id: schema-unconfirmed}
admin: {listen: ""}
coordination:
  etcd: {endpoints: [%s], dial_timeout: 200ms, session_ttl: 2s}
devices:
  - {id: pump-1, type: pump, driver: {url: %s, idempotent: true, queryable: true}}
`, gw, filepath.Join(dir, "data"), broker.URL(), closedPortURL(t), fw.URL())))
	if err != nil {
		t.Fatal(err)
	}
	results := mqtttest.Subscribe(t, broker.URL(), wire.ResultFilter(wire.DefaultPrefix, gw))
	a := app.New(cfg, app.Options{Logger: slog.New(slog.DiscardHandler)})
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.Stop(ctx)
	}()
	waitFor(t, 20*time.Second, "agent subscribed", func() bool { return a.Ready() == nil })
	mqtttest.Publish(t, broker.URL(), wire.CmdTopic(wire.DefaultPrefix, gw, "pump-1"), []byte(`{"op_id":"fu-1","fence":7,"action":"set","params":{"rpm":100}}`), false)
	m := mqtttest.Await(t, results, 20*time.Second, func(mqtttest.Received) bool { return true })
	var r wire.Result
	if err := json.Unmarshal(m.Payload, &r); err != nil || r.Code != wire.CodeFenceUnconfirmed || r.OpID != "fu-1" {
		t.Fatalf("Result %s (%v), want fence_unconfirmed for fu-1", m.Payload, err)
	}
	if err := check(s["result"], m.Payload); err != nil {
		t.Fatalf("fence_unconfirmed Result %s does not validate: %v", m.Payload, err)
	}
	if got := fw.Journal(); len(got) != 0 {
		t.Fatalf("the firmware was written while the fences were unconfirmed: %v", got)
	}
}
