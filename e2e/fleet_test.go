package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/etcdtest"
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

// fleetGW is one coordinated gateway of a fleet test, run as a process.
type fleetGW struct {
	id, admin string
	proc      *testkit.Proc
}

// startFleetGateway runs an agent with coordination on etcd, fronting
// devs (pumps on the simulator) under gateway id, and waits until it is
// ready.
func startFleetGateway(t *testing.T, id, broker string, etcd []string, simURL string, devs ...string) *fleetGW {
	t.Helper()
	dir := t.TempDir()
	g := &fleetGW{id: id, admin: testkit.FreeAddr(t)}
	var b strings.Builder
	fmt.Fprintf(&b, "gateway_id: %s\ndata_dir: %s\nmqtt:\n  broker: %s\nadmin:\n  listen: %s\nshutdown_timeout: 5s\n",
		id, filepath.Join(dir, "data"), broker, g.admin)
	fmt.Fprintf(&b, "coordination:\n  etcd:\n    endpoints: [%s]\n    dial_timeout: 1s\n    session_ttl: 3s\ndevices:\n", strings.Join(etcd, ", "))
	for _, d := range devs {
		fmt.Fprintf(&b, "  - id: %s\n    type: pump\n    driver: {url: %s, timeout: 1s, idempotent: true, queryable: true, resolve_settle: 0s}\n", d, simURL)
	}
	cfg := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	g.proc = testkit.StartProc(t, testkit.ProcOptions{StopSignal: syscall.SIGKILL},
		testkit.Build(t, "../cmd/edge-agent", "failpoints"), "run", "--config", cfg, "--log-level", "warn")
	testkit.Eventually(t, 20*time.Second, id+" ready", func() bool {
		resp, err := http.Get("http://" + g.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return g
}

// runEdgectl runs the edgectl binary and returns its exit code and output.
func runEdgectl(t *testing.T, args ...string) (int, string) {
	t.Helper()
	out, err := exec.Command(testkit.Build(t, "../cmd/edgectl"), args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	case err != nil:
		t.Fatalf("edgectl: %v", err)
	}
	return 0, string(out)
}

// Two gateways on one etcd and one broker: the device directory names each
// device's gateway (controller.LookupGateway), a FleetSender commands
// devices on both through it, `edgectl send` without --gateway finds the
// gateway there, and `edgectl fleet` lists both gateways with their
// devices; once one stops, it shows offline and no longer registered.
func TestFleetDirectory(t *testing.T) {
	mosq := mqtttest.StartMosquitto(t)
	etcd := etcdtest.Start(t, 1)
	cli := etcd.Client(t)
	s := sim.StartForTest(t, map[string]string{"pump-a": "pump", "pump-b": "pump"})
	startFleetGateway(t, "gw-a", mosq.URL(), etcd.Endpoints(), s.URL(), "pump-a")
	gb := startFleetGateway(t, "gw-b", mosq.URL(), etcd.Endpoints(), s.URL(), "pump-b")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	for dev, want := range map[string]string{"pump-a": "gw-a", "pump-b": "gw-b"} {
		if got, err := controller.LookupGateway(ctx, cli, "", dev); err != nil || got != want {
			t.Fatalf("LookupGateway(%s) = %q, %v; want %s", dev, got, err, want)
		}
	}
	if _, err := controller.LookupGateway(ctx, cli, "", "pump-z"); !errors.Is(err, controller.ErrNoGateway) {
		t.Fatalf("LookupGateway of a device nobody has: %v, want ErrNoGateway", err)
	}

	// A fence above both gateways' floors: a lock key created now.
	put, err := cli.Put(ctx, "locks/fleet/gen-1", "")
	if err != nil {
		t.Fatal(err)
	}
	fence := put.Header.Revision
	fs := controller.NewFleetSender(cli, "", controller.ConnOptions{Broker: mosq.URL()},
		&controller.FixedFence{Fence: fence, Holder: "fleet-test"}, nil)
	defer fs.Close()
	for _, dev := range []string{"pump-a", "pump-b"} {
		r, err := fs.Send(ctx, dev, "set", map[string]int{"rpm": 300}, controller.WithOpID("fleet-"+dev))
		if err != nil || r.Code != wire.CodeOK || r.Device != dev {
			t.Fatalf("FleetSender to %s: %+v %v", dev, r, err)
		}
	}
	if _, err := fs.Send(ctx, "pump-z", "set", nil); !errors.Is(err, controller.ErrNoGateway) {
		t.Fatalf("FleetSender to a device nobody has: %v, want ErrNoGateway", err)
	}

	code, out := runEdgectl(t, "send", "--broker", mosq.URL(), "--etcd", strings.Join(etcd.Endpoints(), ","),
		"--device", "pump-b", "--action", "set", "--param", "rpm=400", "--fence", fmt.Sprint(fence), "--op-id", "ctl-b", "--json")
	if code != 0 || !strings.Contains(out, `"status":"applied"`) {
		t.Fatalf("edgectl send without --gateway: exit %d\n%s", code, out)
	}
	want := map[string][]string{"pump-a": {"fleet-pump-a"}, "pump-b": {"fleet-pump-b", "ctl-b"}}
	got := map[string][]string{}
	for _, j := range s.Journal() {
		got[j.Device] = append(got[j.Device], j.OpID)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("firmware journal %v, want %v", got, want)
	}

	fleet := func() map[string]fleetRow {
		t.Helper()
		code, out := runEdgectl(t, "fleet", "--etcd", strings.Join(etcd.Endpoints(), ","), "--broker", mosq.URL(), "--json")
		var rows []fleetRow
		if code != 0 || json.Unmarshal([]byte(out), &rows) != nil {
			t.Fatalf("edgectl fleet: exit %d\n%s", code, out)
		}
		m := map[string]fleetRow{}
		for _, r := range rows {
			m[r.Gateway] = r
		}
		return m
	}
	// A device's retained state is published after its Result, and at
	// most so often: poll until each shows its last command.
	var rows map[string]fleetRow
	testkit.Eventually(t, 15*time.Second, "the retained states after fleet-pump-a and ctl-b", func() bool {
		rows = fleet()
		a, b := rows["gw-a"].Devices, rows["gw-b"].Devices
		return len(a) == 1 && a[0].LastOpID == "fleet-pump-a" && len(b) == 1 && b[0].LastOpID == "ctl-b"
	})
	for _, g := range []struct{ id, dev string }{{"gw-a", "pump-a"}, {"gw-b", "pump-b"}} {
		r := rows[g.id]
		if !r.Registered || !r.Online || r.Role != "single" || r.Host == "" || r.Version == "" || r.StartedAt.IsZero() ||
			len(r.Devices) != 1 || r.Devices[0].Device != g.dev || !r.Devices[0].Claimed || r.Devices[0].LastFence != fence {
			t.Fatalf("edgectl fleet, %s: %+v", g.id, r)
		}
	}
	if d := rows["gw-b"].Devices[0]; d.LastOpID != "ctl-b" || !strings.Contains(string(d.State), `"rpm":400`) {
		t.Fatalf("edgectl fleet, pump-b's state: %+v", d)
	}
	code, out = runEdgectl(t, "fleet", "--etcd", strings.Join(etcd.Endpoints(), ","), "--broker", mosq.URL())
	t.Logf("edgectl fleet:\n%s", out)
	for _, re := range []string{`(?m)^gw-a\s+online\s+single\s`, `(?m)^gw-b\s+online\s+single\s`,
		fmt.Sprintf(`(?m)^\s+pump-b\s+true\s+%d\s+0\s+ctl-b\s+\{`, fence)} {
		if code != 0 || !regexp.MustCompile(re).MatchString(out) {
			t.Fatalf("edgectl fleet's table: exit %d, no line matching %s\n%s", code, re, out)
		}
	}

	gb.proc.Signal(syscall.SIGTERM)
	if code, ok := gb.proc.Wait(20 * time.Second); !ok || code != 0 {
		t.Fatalf("gw-b exit %d (exited %v)", code, ok)
	}
	testkit.Eventually(t, 15*time.Second, "gw-b offline in edgectl fleet", func() bool {
		r := fleet()["gw-b"]
		return !r.Registered && !r.Online && r.Status == "offline" && r.Role == "" &&
			len(r.Devices) == 1 && !r.Devices[0].Claimed && r.Devices[0].LastFence == fence
	})
	if r := fleet()["gw-a"]; !r.Registered || !r.Online {
		t.Fatalf("gw-a after gw-b stopped: %+v", r)
	}
	if _, err := controller.LookupGateway(ctx, cli, "", "pump-b"); !errors.Is(err, controller.ErrNoGateway) {
		t.Fatalf("LookupGateway of a stopped gateway's device: %v, want ErrNoGateway", err)
	}
}

// fleetRow is one gateway of `edgectl fleet --json`.
type fleetRow struct {
	Gateway    string    `json:"gateway"`
	Registered bool      `json:"registered"`
	Host       string    `json:"host"`
	PID        int       `json:"pid"`
	Version    string    `json:"version"`
	StartedAt  time.Time `json:"started_at"`
	Role       string    `json:"role"`
	Standbys   []struct {
		Host string `json:"host"`
		PID  int    `json:"pid"`
	} `json:"standbys"`
	Status     string `json:"status"`
	Online     bool   `json:"online"`
	HeldWrites int    `json:"held_writes"`
	Devices    []struct {
		Device     string          `json:"device"`
		Claimed    bool            `json:"claimed"`
		LastFence  int64           `json:"last_fence"`
		LastOpID   string          `json:"last_op_id"`
		State      json.RawMessage `json:"state"`
		HeldWrites int             `json:"held_writes"`
	} `json:"devices"`
}

// edgectl fleet reads a gateway's signed DeviceStates (security.result_key_file):
// without --gateway-key as watch does (unverified), with the gateway's key
// taking them, and with another key dropping them (the gateway is still
// listed, online, from its status topic, which is never signed).
func TestFleetReadsSignedStates(t *testing.T) {
	dir := t.TempDir()
	privPEM, pubPEM, _ := jws.GenerateKey()
	_, otherPEM, _ := jws.GenerateKey()
	keyFile, pubFile, otherFile := filepath.Join(dir, "gw.key"), filepath.Join(dir, "gw.pub"), filepath.Join(dir, "other.pub")
	for f, b := range map[string][]byte{keyFile: privPEM, pubFile: pubPEM, otherFile: otherPEM} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	e := newEnv(t, pump("pump-7"))
	e.extra = "security:\n  result_key_file: " + keyFile + "\n"
	e.start()
	e.send("pump-7", cmd("signed-1", 3, "set", `{"rpm":500}`)) // its Result is signed: the state below shows it applied
	etcd := etcdtest.Start(t, 1)

	fleet := func(extra ...string) fleetRow {
		t.Helper()
		args := append([]string{"fleet", "--etcd", strings.Join(etcd.Endpoints(), ","), "--broker", e.broker, "--json"}, extra...)
		code, out := runEdgectl(t, args...)
		var rows []fleetRow
		if code != 0 || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 1 || rows[0].Gateway != gw || !rows[0].Online {
			t.Fatalf("edgectl fleet %v: exit %d\n%s", extra, code, out)
		}
		return rows[0]
	}
	testkit.Eventually(t, 15*time.Second, "pump-7's signed state, verified", func() bool {
		d := fleet("--gateway-key", pubFile).Devices
		return len(d) == 1 && d[0].LastOpID == "signed-1" && strings.Contains(string(d[0].State), `"rpm":500`)
	})
	if d := fleet().Devices; len(d) != 1 || d[0].LastOpID != "signed-1" {
		t.Fatalf("without --gateway-key: %+v", d)
	}
	if d := fleet("--gateway-key", otherFile).Devices; len(d) != 0 {
		t.Fatalf("with another gateway's key, the state was taken: %+v", d)
	}
}
