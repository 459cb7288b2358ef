package schema_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/app"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// The unauthorized Results of a gateway that requires signed commands
// (docs/protocol.md §6) validate against the Result schema, with op_id and
// fence echoed and without (a message nothing can be read of); and what a
// gateway with result_key_file publishes is a JWS whose payload validates.
// (TestAgentMessagesValidate's gateway does not require signatures.)
func TestUnauthorizedResultsValidate(t *testing.T) {
	s := schemas(t)
	broker := mqtttest.StartMosquitto(t)
	fw := sim.StartForTest(t, map[string]string{"pump-1": "pump"})
	dir := t.TempDir()
	privPEM, pubPEM, _ := jws.GenerateKey()
	pub, key := filepath.Join(dir, "ctl.pub"), filepath.Join(dir, "gw.key")
	os.WriteFile(pub, pubPEM, 0o644)
	os.WriteFile(key, privPEM, 0o600)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`gateway_id: %s
data_dir: %s
mqtt: {broker: %s, client_id: schema-signed}
admin: {listen: ""}
security: {keys: [{id: ctl, public_key_file: %s}], result_key_file: %s}
devices:
  - {id: pump-1, type: pump, driver: {url: %s, idempotent: true, queryable: true}}
`, gw, filepath.Join(dir, "data"), broker.URL(), pub, key, fw.URL())))
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
	waitFor(t, 10*time.Second, "agent subscribed", func() bool { return a.Ready() == nil })
	for _, payload := range []string{`{"op_id":"u-1","fence":9223372036854775807,"action":"fence"}`, "garbage"} {
		mqtttest.Publish(t, broker.URL(), wire.CmdTopic(wire.DefaultPrefix, gw, "pump-1"), []byte(payload), false)
		m := mqtttest.Await(t, results, 10*time.Second, func(mqtttest.Received) bool { return true })
		tok, err := jws.Parse(m.Payload)
		if err != nil || tok.Header.Kid != gw {
			t.Fatalf("Result %q is not signed by the gateway: %v", m.Payload, err)
		}
		if err := check(s["result"], tok.Payload); err != nil {
			t.Fatalf("unauthorized Result %s does not validate: %v", tok.Payload, err)
		}
	}
}
