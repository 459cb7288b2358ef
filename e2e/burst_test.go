package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/app"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// The embedded broker, configured not to drop QoS 1 messages, carries a
// burst of 20,000 commands to the agent and 20,000 Results back.
func TestEmbeddedBrokerBurst(t *testing.T) {
	n := 20000
	if v := os.Getenv("BURST_N"); v != "" {
		fmt.Sscanf(v, "%d", &n)
	}
	if testing.Short() {
		n = 2000
	}
	const devices = 16
	types := map[string]string{}
	yaml := ""
	for i := 0; i < devices; i++ {
		id := fmt.Sprintf("g%d", i)
		types[id] = "generic"
	}
	s := sim.StartForTest(t, types)
	for i := 0; i < devices; i++ {
		yaml += fmt.Sprintf("  - id: g%d\n    type: generic\n    queue: %d\n    driver: {url: %s, idempotent: true, queryable: true}\n", i, n, s.URL())
	}
	listen := testkit.FreeAddr(t)
	dir := t.TempDir()
	cfgText := fmt.Sprintf("gateway_id: %s\ndata_dir: %s\nmqtt:\n  broker: embedded\n  embedded_listen: %s\nadmin:\n  listen: \"\"\ndevices:\n%s",
		gw, filepath.Join(dir, "data"), listen, yaml)
	cfgPath := filepath.Join(dir, "agent.yaml")
	os.WriteFile(cfgPath, []byte(cfgText), 0o600)
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	a := app.New(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		a.Stop(ctx)
		cancel()
	}()
	testkit.Eventually(t, 10*time.Second, "agent subscribed", func() bool { return a.Ready() == nil })

	url := "tcp://" + listen
	var got atomic.Int64
	seen := make([]atomic.Bool, n)
	var dups atomic.Int64
	sub := paho.NewClient(paho.NewClientOptions().AddBroker(url).SetClientID("burst-sub").SetCleanSession(true).
		SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) {
			var r wire.Result
			if json.Unmarshal(m.Payload(), &r) != nil || r.Code != wire.CodeOK {
				return
			}
			var i int
			fmt.Sscanf(r.OpID, "b-%d", &i)
			if seen[i].Swap(true) {
				dups.Add(1)
				return
			}
			got.Add(1)
		}))
	if tok := sub.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	defer sub.Disconnect(100)
	if tok := sub.Subscribe(wire.ResultFilter(wire.DefaultPrefix, gw), 1, nil); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	pub := connect(t, url, "burst-pub")
	start := time.Now()
	toks := make([]paho.Token, 0, n)
	for i := 0; i < n; i++ {
		dev := fmt.Sprintf("g%d", i%devices)
		b, _ := json.Marshal(wire.Command{OpID: fmt.Sprintf("b-%d", i), Fence: 1, Action: "set", Params: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
		toks = append(toks, pub.Publish(wire.CmdTopic(wire.DefaultPrefix, gw, dev), 1, false, b))
	}
	for i, tok := range toks {
		if !tok.WaitTimeout(60*time.Second) || tok.Error() != nil {
			t.Fatalf("publish #%d not acknowledged after %s: %v (Results so far: %d)", i, time.Since(start), tok.Error(), got.Load())
		}
	}
	testkit.Eventually(t, 120*time.Second, fmt.Sprintf("%d Results", n), func() bool { return got.Load() == int64(n) })
	t.Logf("%d commands -> %d Results in %s (%d duplicate deliveries)", n, got.Load(), time.Since(start), dups.Load())
	if j := len(s.Journal()); j != n {
		t.Fatalf("journal has %d entries, want %d", j, n)
	}
}
