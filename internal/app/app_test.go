package app

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// Every goroutine the App starts (admin server, embedded broker, MQTT
// session, agent, store, plugin watcher, device driver) has ended when
// Stop returns. The agent runs on its defaults' shape: the
// embedded broker, a device with a policy plugin built from source, the
// admin API; one command goes through it first.
func TestStopLeavesNoGoroutine(t *testing.T) {
	plugins := t.TempDir()
	build := exec.Command("go", "build", "-buildmode=c-shared", "-o", filepath.Join(plugins, "range-limit.wasm"), "../../plugins/range-limit")
	build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the plugin: %v\n%s", err, out)
	}
	s := sim.StartForTest(t, map[string]string{"pump-7": "pump"})
	cfg, err := config.Parse([]byte(fmt.Sprintf(`gateway_id: gw-1
data_dir: %s
mqtt: {broker: embedded, embedded_listen: "127.0.0.1:%d"}
admin: {listen: "127.0.0.1:0"}
plugins: {dir: %s}
devices:
  - id: pump-7
    type: pump
    driver: {url: %s, queryable: true, idempotent: true}
    policy: {plugin: range-limit, config: {param: rpm, min: 0, max: 3000}}
`, t.TempDir(), testkit.FreePort(t), plugins, s.URL())))
	if err != nil {
		t.Fatal(err)
	}
	// Everything that runs now (the simulator, the test's own) is not the
	// App's.
	before := goleak.IgnoreCurrent()

	a := New(cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "subscribed", func() bool { return a.Ready() == nil })
	// The test's MQTT clients are its own: in a subtest, they are gone
	// when it ends.
	t.Run("a command", func(t *testing.T) {
		results := mqtttest.Subscribe(t, a.BrokerURL(), wire.ResultFilter(wire.DefaultPrefix, "gw-1"))
		b, _ := json.Marshal(wire.Command{OpID: "op-1", Fence: 1, Action: "set", Params: json.RawMessage(`{"rpm":100}`)})
		mqtttest.Publish(t, a.BrokerURL(), wire.CmdTopic(wire.DefaultPrefix, "gw-1", "pump-7"), b, false)
		mqtttest.Await(t, results, 10*time.Second, func(m mqtttest.Received) bool {
			var r wire.Result
			return json.Unmarshal(m.Payload, &r) == nil && r.OpID == "op-1" && r.Code == wire.CodeOK
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// At once, with no grace: nothing of the App's may still be running
	// (Stop waits for what it started, it does not merely signal it).
	for _, g := range strings.Split(string(allStacks()), "\n\n") {
		if strings.Contains(g, "TestStopLeavesNoGoroutine") || strings.Contains(g, "firmware-sim/sim") {
			continue // the test itself, the simulator
		}
		// A goroutine that signalled its end and is returning (running or
		// runnable) has been waited for; one left behind is blocked.
		if head, _, _ := strings.Cut(g, "\n"); strings.Contains(head, "[running") || strings.Contains(head, "[runnable") {
			continue
		}
		for _, mark := range []string{"edge-agent/internal/", "mochi-mqtt", "net/http.(*Server).Serve", "tetratelabs/wazero", "eclipse/paho"} {
			if strings.Contains(g, mark) {
				t.Errorf("a goroutine of the App still runs after Stop returned:\n%s", g)
				break
			}
		}
	}
	// And eventually nothing at all is left (goleak retries a while).
	goleak.VerifyNone(t, before)
}

func allStacks() []byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}
