package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/app"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// edgectl against a real agent (in-process, embedded broker, firmware-sim):
// send prints the interim unknown Result and keeps waiting; history lists
// the device's operations newest first; resolve answers for the held write,
// and send then ends with the final Result.
func TestSendHistoryResolveAgainstTheAgent(t *testing.T) {
	s := sim.StartForTest(t, map[string]string{"valve-1": "valve"})
	brokerAddr := testkit.FreeAddr(t)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`gateway_id: gw-c
data_dir: %s
mqtt: {broker: embedded, embedded_listen: "%s"}
admin: {listen: "127.0.0.1:0"}
devices:
  - id: valve-1
    type: valve
    driver: {url: "%s", timeout: 1s, queryable: false, resolve_settle: 0s}
`, filepath.Join(t.TempDir(), "data"), brokerAddr, s.URL())))
	if err != nil {
		t.Fatal(err)
	}
	a := app.New(cfg, app.Options{Logger: slog.New(slog.DiscardHandler), Version: "test"})
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.Stop(ctx)
	})
	testkit.Eventually(t, 10*time.Second, "agent subscribed", func() bool { return a.Ready() == nil })
	admin := "http://" + a.AdminAddr()
	broker := "tcp://" + brokerAddr

	if code, _, stderr := runCLI("send", "--broker", broker, "--gateway", "gw-c", "--device", "valve-1",
		"--action", "set", "--param", "open=40", "--fence", "7", "--op-id", "v-ok", "--json"); code != 0 {
		t.Fatalf("send: exit %d %s", code, stderr)
	}
	if err := s.SetFaults(sim.Faults{Device: "valve-1", DropResponseRate: 1}); err != nil {
		t.Fatal(err)
	}
	var out lockedWriter
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"send", "--broker", broker, "--gateway", "gw-c", "--device", "valve-1",
			"--action", "set", "--param", "open=90", "--fence", "7", "--op-id", "v-held", "--timeout", "60s"}, &out, &out)
	}()
	testkit.Eventually(t, 20*time.Second, "send prints the interim unknown", func() bool {
		return strings.Contains(out.String(), "interim: unknown/outcome_unknown")
	})
	if s.Injected().Dropped == 0 {
		t.Fatal("the simulator dropped no answer")
	}
	select {
	case code := <-done:
		t.Fatalf("send returned (exit %d) on an unknown Result:\n%s", code, out.String())
	default:
	}

	code, hist, stderr := runCLI("history", "--admin", admin, "--device", "valve-1", "--limit", "10")
	if code != 0 {
		t.Fatalf("history: exit %d %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(hist), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "RECEIVED") || !strings.Contains(lines[1], "v-held") ||
		!strings.Contains(lines[1], "unknown/outcome_unknown") || !strings.Contains(lines[2], "v-ok") || !strings.Contains(lines[2], "applied/ok") {
		t.Fatalf("history:\n%s", hist)
	}
	if code, _, stderr := runCLI("history", "--admin", admin, "--device", "nope"); code != 1 || !strings.Contains(stderr, "404") {
		t.Fatalf("history of an unknown device: exit %d %s", code, stderr)
	}

	code, res, stderr := runCLI("resolve", "--admin", admin, "--device", "valve-1", "--op-id", "v-held", "--applied=false")
	var resolved wire.Result
	if code != 0 || json.Unmarshal([]byte(res), &resolved) != nil || resolved.Code != wire.CodeNotApplied {
		t.Fatalf("resolve: exit %d %s %s", code, res, stderr)
	}
	select {
	case code := <-done:
		if code != 1 || !strings.Contains(out.String(), `"not_applied"`) {
			t.Fatalf("send after the resolve: exit %d\n%s", code, out.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("send did not end after the resolve:\n%s", out.String())
	}
	if code, _, stderr := runCLI("resolve", "--admin", admin, "--device", "valve-1", "--op-id", "v-held", "--applied=true"); code != 1 || !strings.Contains(stderr, "409") {
		t.Fatalf("second resolve: exit %d %s", code, stderr)
	}
	if code, _, _ := runCLI("resolve", "--admin", admin, "--device", "valve-1", "--op-id", "v-held"); code != 2 {
		t.Fatalf("resolve without --applied: exit %d, want 2", code)
	}
}

// startAgent runs an agent in-process on an embedded broker with the
// devices YAML given, and returns its admin and broker URLs.
func startAgent(t *testing.T, gateway, devices string) (admin, broker string) {
	t.Helper()
	brokerAddr := testkit.FreeAddr(t)
	cfg, err := config.Parse([]byte(fmt.Sprintf("gateway_id: %s\ndata_dir: %s\nmqtt: {broker: embedded, embedded_listen: %q}\nadmin: {listen: \"127.0.0.1:0\"}\ndevices:\n%s",
		gateway, filepath.Join(t.TempDir(), "data"), brokerAddr, devices)))
	if err != nil {
		t.Fatal(err)
	}
	a := app.New(cfg, app.Options{Logger: slog.New(slog.DiscardHandler), Version: "test"})
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.Stop(ctx)
	})
	testkit.Eventually(t, 10*time.Second, "agent subscribed", func() bool { return a.Ready() == nil })
	return "http://" + a.AdminAddr(), "tcp://" + brokerAddr
}

// "Gave up" means it will not run later (docs/protocol.md §1, final means
// final): a send that times out while its command is queued behind a held
// write says the outcome is unknown, and the command, reached after its
// expires_at (now + --timeout), ends expired without moving the valve. A
// send that gives up on busy says outcome unknown too, not a rejection.
func TestGaveUpMeansItWillNotRunLater(t *testing.T) {
	s := sim.StartForTest(t, map[string]string{"valve-1": "valve"})
	admin, broker := startAgent(t, "gw-g", fmt.Sprintf("  - id: valve-1\n    type: valve\n    queue: 1\n    driver: {url: %q, timeout: 1s, queryable: false, resolve_settle: 0s}\n", s.URL()))
	send := func(op, open, timeout string) (int, string) {
		code, out, stderr := runCLI("send", "--broker", broker, "--gateway", "gw-g", "--device", "valve-1",
			"--action", "set", "--param", "open="+open, "--fence", "7", "--op-id", op, "--timeout", timeout)
		return code, out + stderr
	}
	if code, out := send("v-ok", "40", "10s"); code != 0 {
		t.Fatalf("send: exit %d %s", code, out)
	}
	// The history names who sent it, not a random client ID.
	var hist struct {
		Ops []struct {
			OpID   string `json:"op_id"`
			Holder string `json:"holder"`
		} `json:"ops"`
	}
	resp, err := http.Get(admin + "/v1/devices/valve-1/ops?limit=1")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&hist)
	resp.Body.Close()
	host, _ := os.Hostname()
	if err != nil || len(hist.Ops) != 1 || hist.Ops[0].Holder != holderName() || !strings.HasSuffix(hist.Ops[0].Holder, "@"+host) {
		t.Fatalf("v-ok's history entry: %+v (%v); want holder %q", hist.Ops, err, holderName())
	}
	if err := s.SetFaults(sim.Faults{Device: "valve-1", DropResponseRate: 1}); err != nil {
		t.Fatal(err)
	}
	if code, out := send("v-held", "90", "2s"); code != 1 || !strings.Contains(out, "interim: unknown/outcome_unknown") {
		t.Fatalf("send of the write to hold: exit %d\n%s", code, out)
	}
	if err := s.SetFaults(sim.Faults{}); err != nil {
		t.Fatal(err)
	}
	// Queued behind the held write (queue: 1), until the deadline.
	if code, out := send("v-late", "10", "3s"); code != 1 || !strings.Contains(out, "outcome unknown") {
		t.Fatalf("send behind the held write: exit %d\n%s", code, out)
	}
	// The queue is full: busy until the deadline, which is no rejection.
	if code, out := send("v-busy", "20", "2s"); code != 1 || !strings.Contains(out, "outcome unknown") || !strings.Contains(out, "busy") {
		t.Fatalf("send to a full queue: exit %d\n%s", code, out)
	}
	if code, res, stderr := runCLI("resolve", "--admin", admin, "--device", "valve-1", "--op-id", "v-held", "--applied=false"); code != 0 {
		t.Fatalf("resolve: exit %d %s %s", code, res, stderr)
	}
	var late wire.Result
	testkit.Eventually(t, 20*time.Second, "v-late ends", func() bool {
		resp, err := http.Get(admin + "/v1/devices/valve-1/ops/v-late")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&late) == nil && late.Final()
	})
	if late.Code != wire.CodeExpired {
		t.Fatalf("v-late, reached after its sender gave up: %s/%s (%s), want rejected/expired", late.Status, late.Code, late.Reason)
	}
	for _, j := range s.Journal() {
		if j.OpID == "v-late" || j.OpID == "v-busy" {
			t.Fatalf("%s moved the valve after its sender gave up: %+v", j.OpID, j)
		}
	}
}
