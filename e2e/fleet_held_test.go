package e2e

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/etcdtest"
)

// `edgectl fleet` (the CLI process) on a fleet of real agent processes,
// mosquitto, etcd and firmware-sim: an ha pair (gw-1, two agents) whose
// valve-1 cannot be asked, and a single gateway gw-s. A write whose
// response the firmware drops is held unknown: the fleet shows 1 held
// write on valve-1 and on gw-1 (the DeviceState's held_writes), 0 once the
// operator resolved it (edgectl resolve); gw-1's role is active with its
// host and pid and the standby's, gw-s's single. Once the active stops,
// the former standby shows active, with no standby left. The held write
// was applied once and never resent (invariant 6).
func TestFleetShowsHeldWritesAndRoles(t *testing.T) {
	valve := pump("valve-1")
	valve.queryable = false
	f := &fmEnv{env: newEnv(t, valve), etcd: etcdtest.Start(t, 1)}
	f.cli = f.etcd.Client(t)
	f.adminAt = testkit.FreeAddr(t)
	f.coordinate(f.etcd.Endpoints())
	f.agent = testkit.Build(t, "../cmd/edge-agent", "failpoints")
	f.extra += "ha:\n  enabled: true\n  safety_margin: 1s\n"
	f.run()
	b := f.peer()
	single := sim.StartForTest(t, map[string]string{"pump-s": "pump"})
	startFleetGateway(t, "gw-s", f.broker, f.etcd.Endpoints(), single.URL(), "pump-s")

	eps := strings.Join(f.etcd.Endpoints(), ",")
	fleet := func() map[string]fleetRow {
		t.Helper()
		code, out := runEdgectl(t, "fleet", "--etcd", eps, "--broker", f.broker, "--json")
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
	heldOn := func(r fleetRow) int {
		if len(r.Devices) != 1 || r.Devices[0].Device != "valve-1" {
			return -1
		}
		return r.Devices[0].HeldWrites
	}
	activePID, standbyPID := f.proc.PID(), b.proc.PID()

	// The fault: valve-1's firmware applies v-1 and drops the response.
	if err := f.sim.SetFaults(sim.Faults{Device: "valve-1", DropResponseRate: 1}); err != nil {
		t.Fatal(err)
	}
	fence := f.lock()
	f.send("valve-1", cmd("v-1", fence, "set", `{"rpm":30}`))
	want(t, f.result("v-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	f.sim.SetFaults(sim.Faults{})
	if n := f.sim.Injected().Dropped; n != 1 {
		t.Fatalf("the firmware dropped %d responses, want 1", n)
	}

	var rows map[string]fleetRow
	testkit.Eventually(t, 15*time.Second, "edgectl fleet: 1 held write on valve-1 and gw-1", func() bool {
		rows = fleet()
		return heldOn(rows[gw]) == 1 && rows[gw].HeldWrites == 1
	})
	g := rows[gw]
	if !g.Registered || !g.Online || g.Role != "active" || g.Host == "" || g.PID != activePID ||
		len(g.Standbys) != 1 || g.Standbys[0].PID != standbyPID || g.Standbys[0].Host == "" {
		t.Fatalf("the pair in edgectl fleet (active pid %d, standby pid %d): %+v", activePID, standbyPID, g)
	}
	if s := rows["gw-s"]; !s.Registered || !s.Online || s.Role != "single" || s.HeldWrites != 0 || len(s.Standbys) != 0 {
		t.Fatalf("gw-s in edgectl fleet: %+v", s)
	}
	// The series the dashboard's fleet row joins (deploy/prometheus's
	// promtool test takes them as given): the active counts the held
	// write; the standby names its gateway, has no broker session and,
	// with no agent yet, no held-write series.
	metrics := func(addr string) map[string]string {
		_, b := haGet(addr, "/metrics")
		m := map[string]string{}
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, " "); ok && !strings.HasPrefix(l, "#") {
				m[k] = v
			}
		}
		return m
	}
	if m := metrics(f.adminAt); m["edge_agent_writes_held_unknown"] != "1" || m[`edge_agent_gateway_info{gateway="gw-1"}`] != "1" {
		t.Fatalf("the active's metrics: held %q, gateway_info %q", m["edge_agent_writes_held_unknown"], m[`edge_agent_gateway_info{gateway="gw-1"}`])
	}
	if m := metrics(b.adminAt); m[`edge_agent_gateway_info{gateway="gw-1"}`] != "1" || m["edge_agent_mqtt_connected"] != "0" || m["edge_agent_writes_held_unknown"] != "" {
		t.Fatalf("the standby's metrics: gateway_info %q, mqtt_connected %q, held %q", m[`edge_agent_gateway_info{gateway="gw-1"}`], m["edge_agent_mqtt_connected"], m["edge_agent_writes_held_unknown"])
	}

	code, out := runEdgectl(t, "fleet", "--etcd", eps, "--broker", f.broker)
	t.Logf("edgectl fleet, v-1 held:\n%s", out)
	for _, re := range []string{
		fmt.Sprintf(`(?m)^%s\s+online\s+active\s+\S+ \(pid %d\)\s+\S+ \(pid %d\)\s+\S+\s+\S+\s+1\s+1$`, gw, activePID, standbyPID),
		`(?m)^gw-s\s+online\s+single\s+\S+\s+-\s+\S+\s+\S+\s+1\s+0$`,
		fmt.Sprintf(`(?m)^\s+valve-1\s+true\s+%d\s+1\s+`, fence),
	} {
		if code != 0 || !regexp.MustCompile(re).MatchString(out) {
			t.Fatalf("edgectl fleet's table: exit %d, no line matching %s\n%s", code, re, out)
		}
	}

	// The operator resolves it: the firmware did apply it.
	code, out = runEdgectl(t, "resolve", "--admin", "http://"+f.adminAt, "--device", "valve-1", "--op-id", "v-1", "--applied=true")
	if code != 0 {
		t.Fatalf("edgectl resolve: exit %d\n%s", code, out)
	}
	want(t, f.final("v-1"), wire.StatusApplied, wire.CodeOK)
	testkit.Eventually(t, 15*time.Second, "edgectl fleet: no held write once resolved", func() bool {
		rows = fleet()
		return heldOn(rows[gw]) == 0 && rows[gw].HeldWrites == 0 && rows[gw].Devices[0].LastOpID == "v-1"
	})
	code, out = runEdgectl(t, "fleet", "--etcd", eps, "--broker", f.broker)
	if re := fmt.Sprintf(`(?m)^\s+valve-1\s+true\s+%d\s+0\s+v-1\s`, fence); code != 0 || !regexp.MustCompile(re).MatchString(out) {
		t.Fatalf("edgectl fleet's table once resolved: exit %d, no line matching %s\n%s", code, re, out)
	}
	if ops := f.journalOps(); len(ops) != 1 || ops[0] != "v-1" {
		t.Fatalf("firmware journal %v, want v-1 once (never resent)", ops)
	}

	// The active stops: the standby takes over, and the fleet says so.
	f.proc.Signal(syscall.SIGTERM)
	if code := f.waitExit(20 * time.Second); code != 0 {
		t.Fatalf("the active's exit %d", code)
	}
	testkit.Eventually(t, haTTL+10*time.Second, "edgectl fleet: the former standby active, no standby", func() bool {
		g := fleet()[gw]
		return g.Registered && g.Online && g.Role == "active" && g.PID == standbyPID && len(g.Standbys) == 0
	})
}
