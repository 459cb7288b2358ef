package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// A standby that takes over (docs/protocol.md §8, invariants 1, 2 and 7):
// two agent processes with one gateway_id and one MQTT client ID, two
// data dirs, a real etcd, mosquitto and firmware-sim. session_ttl is 3s.

const haTTL = 3 * time.Second

// haPeer is the second agent of the pair.
type haPeer struct {
	proc    *testkit.Proc
	adminAt string
}

func haGet(addr, path string) (int, []byte) {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// haRole is the agent's role at addr and, on a standby, the active's host.
func haRole(addr string) (role, active string) {
	_, b := haGet(addr, "/v1/status")
	var s struct {
		Role       string `json:"role"`
		ActiveHost string `json:"active_host"`
	}
	json.Unmarshal(b, &s)
	return s.Role, s.ActiveHost
}

func newHA(t *testing.T) *fmEnv {
	f := newFM(t)
	f.extra += "ha:\n  enabled: true\n  safety_margin: 1s\n"
	f.run()
	if r, _ := haRole(f.adminAt); r != "active" {
		t.Fatalf("the first agent's role: %q", r)
	}
	return f
}

// peer starts the second agent: the same configuration but data_dir (and
// the admin address, both on this host).
// repl are more old, new pairs for its configuration (e.g. its own etcd
// endpoints).
func (f *fmEnv) peer(repl ...string) *haPeer {
	f.t.Helper()
	p := &haPeer{adminAt: testkit.FreeAddr(f.t)}
	cfg, _ := os.ReadFile(f.cfgPath)
	b := strings.NewReplacer(append([]string{f.dataDir, filepath.Join(f.t.TempDir(), "data-b"), f.adminAt, p.adminAt}, repl...)...).Replace(string(cfg))
	path := filepath.Join(f.t.TempDir(), "b.yaml")
	os.WriteFile(path, []byte(b), 0o600)
	p.proc = testkit.StartProc(f.t, testkit.ProcOptions{StopSignal: syscall.SIGKILL}, f.agent, "run", "--config", path, "--log-level", "info")
	testkit.Eventually(f.t, 20*time.Second, "the second agent standby", func() bool {
		r, host := haRole(p.adminAt)
		code, _ := haGet(p.adminAt, "/readyz")
		return r == "standby" && host != "" && code == http.StatusServiceUnavailable
	})
	return p
}

// waitActive waits until the agent at addr serves, within session_ttl + 5s
// of since.
func waitActive(t *testing.T, addr string, since time.Time) {
	t.Helper()
	testkit.Eventually(t, haTTL+5*time.Second+2*time.Second, "takeover", func() bool {
		code, _ := haGet(addr, "/readyz")
		r, _ := haRole(addr)
		return code == 200 && r == "active"
	})
	d := time.Since(since)
	if d > haTTL+5*time.Second {
		t.Fatalf("took over after %s, want within session_ttl + 5s", d)
	}
	t.Logf("took over %s after the active stopped (session_ttl %s)", d.Round(10*time.Millisecond), haTTL)
}

// haFloors is pump-7's fence-floor reasons at addr.
func haFloors(t *testing.T, addr string) []string {
	_, b := haGet(addr, "/v1/devices/pump-7/ops?limit=1000")
	var page struct {
		Ops []struct {
			OpID   string `json:"op_id"`
			Reason string `json:"reason"`
		} `json:"ops"`
	}
	json.Unmarshal(b, &page)
	var out []string
	for _, o := range page.Ops {
		if strings.HasPrefix(o.OpID, "fence-floor:") {
			out = append(out, o.Reason)
		}
	}
	return out
}

// (a) The active is paused (SIGSTOP) with writes queued behind a slow
// device; the standby takes over within session_ttl + 5 s, takes the floor
// (takeover): an older generation's command is stale_fence, a new one
// applies. Woken, the old active reports standby and none of its queued
// writes reaches the firmware. (b) The new active is killed: the old one
// takes over again (the floor again), its queued writes are stale, and no
// op runs twice.
func TestHATakeover(t *testing.T) {
	f := newHA(t)
	b := f.peer()
	if r, _ := haRole(f.adminAt); r != "active" {
		t.Fatalf("the first agent is %q once the second is standby", r)
	}
	g1 := f.lock()
	want(t, f.cmdOp("op-1", g1, "set", `{"rpm":100}`), wire.StatusApplied, wire.CodeOK)

	// Writes queued behind a slow device, the first in flight.
	setFaults(t, f.sim, sim.Faults{Device: "pump-7", LatencyMS: 700})
	queued := []string{"q-1", "q-2", "q-3"}
	for _, op := range queued {
		f.send("pump-7", cmd(op, g1, "set", `{"rpm":150}`))
	}
	testkit.Eventually(t, 10*time.Second, "q-1 in flight, the rest queued", func() bool {
		d := f.device()
		return d.Pending == 1 && d.QueueDepth >= 2
	})
	f.proc.Signal(syscall.SIGSTOP)
	stopped := time.Now()
	waitActive(t, b.adminAt, stopped)
	if fl := haFloors(t, b.adminAt); len(fl) == 0 || !strings.Contains(fl[0], "takeover") {
		t.Fatalf("the new active's floors: %q", fl)
	}
	setFaults(t, f.sim, sim.Faults{Device: "pump-7"})
	atTakeover := len(f.journal())

	// On the new active: the old generation is stale, a new one applies.
	want(t, f.cmdOp("op-old", g1, "set", `{"rpm":1}`), wire.StatusRejected, wire.CodeStaleFence)
	f.newGeneration("op-new")

	// The old active wakes: it stands down without writing.
	f.proc.Signal(syscall.SIGCONT)
	testkit.Eventually(t, 10*time.Second, "the old active standby", func() bool {
		r, host := haRole(f.adminAt)
		code, _ := haGet(f.adminAt, "/readyz")
		return r == "standby" && host != "" && code == http.StatusServiceUnavailable
	})
	g3 := f.lock()
	want(t, f.cmdOp("op-new2-barrier", g3, wire.ActionFence, ""), wire.StatusApplied, wire.CodeOK)
	want(t, f.cmdOp("op-new2", g3, "set", `{"rpm":400}`), wire.StatusApplied, wire.CodeOK)
	if got := f.journalOps()[atTakeover:]; !slices.Equal(got, []string{"op-new", "op-new2"}) {
		t.Fatalf("the firmware's journal after the takeover: %v (the old active's queued writes must never reach it)", got)
	}
	// The deposed active's stand-down did not mark the gateway offline.
	st := mqtttest.Await(t, mqtttest.Subscribe(t, f.broker, wire.StatusTopic(wire.DefaultPrefix, gw)), 10*time.Second,
		func(mqtttest.Received) bool { return true })
	if !strings.Contains(string(st.Payload), `"online"`) {
		t.Fatalf("the gateway's retained status once the old active stood down: %s", st.Payload)
	}

	// (b) The new active is killed: the old one takes over again.
	b.proc.Signal(syscall.SIGKILL)
	killed := time.Now()
	waitActive(t, f.adminAt, killed)
	if fl := haFloors(t, f.adminAt); len(fl) < 2 || !strings.Contains(fl[0], "takeover") {
		t.Fatalf("the old active's floors once active again: %q", fl)
	}
	want(t, f.cmdOp("op-stale", g3, "set", `{"rpm":2}`), wire.StatusRejected, wire.CodeStaleFence)
	f.newGeneration("op-last")
	for _, op := range queued[1:] {
		testkit.Eventually(t, 10*time.Second, op+" final", func() bool {
			rs := f.res.results(op)
			return len(rs) > 0 && rs[len(rs)-1].Final()
		})
	}
	got := f.journalOps()
	for _, op := range queued[1:] {
		if slices.Contains(got, op) {
			t.Fatalf("%s, queued on the paused active, reached the firmware: %v", op, got)
		}
	}
	f.checkJournal()
}

// A partition between the active and etcd (toxiproxy holding every byte,
// as a cut link does) behaves like the pause: the active's gate closes
// before its session can expire, it stands down while it still runs and
// reaches the broker and the device, the standby takes over within
// session_ttl + 5 s with the floor, and none of the writes queued on the
// cut-off agent reaches the firmware after the takeover. When the link is
// back it stays standby (the other holds the registration). No op runs
// twice.
func TestHATakeoverOnEtcdPartition(t *testing.T) {
	f := newFM(t)
	direct := strings.Join(f.etcd.Endpoints(), ", ")
	px := testkit.NewProxy(t, f.etcd.Endpoints()[0])
	f.coordinate([]string{"http://" + px.Addr()})
	f.extra += "ha:\n  enabled: true\n  safety_margin: 1s\n"
	f.run()
	b := f.peer("http://"+px.Addr(), direct)
	if r, _ := haRole(f.adminAt); r != "active" {
		t.Fatalf("the first agent is %q once the second is standby", r)
	}
	g1 := f.lock()
	want(t, f.cmdOp("op-1", g1, "set", `{"rpm":100}`), wire.StatusApplied, wire.CodeOK)

	setFaults(t, f.sim, sim.Faults{Device: "pump-7", LatencyMS: 700})
	queued := []string{"q-1", "q-2", "q-3", "q-4", "q-5", "q-6", "q-7", "q-8"}
	for _, op := range queued {
		f.send("pump-7", cmd(op, g1, "set", `{"rpm":150}`))
	}
	testkit.Eventually(t, 10*time.Second, "q-1 in flight, the rest queued", func() bool {
		d := f.device()
		return d.Pending == 1 && d.QueueDepth >= 2
	})
	px.Pause()
	cut := time.Now()
	waitActive(t, b.adminAt, cut)
	if held := px.Held(); held == 0 {
		t.Fatal("the proxy held nothing: the active's etcd link was not cut")
	}
	if fl := haFloors(t, b.adminAt); len(fl) == 0 || !strings.Contains(fl[0], "takeover") {
		t.Fatalf("the new active's floors: %q", fl)
	}
	// The cut-off agent runs on and still answers: it stood down.
	if r, _ := haRole(f.adminAt); r != "standby" {
		t.Fatalf("the cut-off agent's role once the other took over: %q", r)
	}
	if code, _ := haGet(f.adminAt, "/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("the cut-off agent's /readyz: %d", code)
	}
	setFaults(t, f.sim, sim.Faults{Device: "pump-7"})
	atTakeover := len(f.journal())
	wrote := f.journalOps()
	var leftOver []string // queued writes the cut-off agent never sent
	for _, op := range queued {
		if !slices.Contains(wrote, op) {
			leftOver = append(leftOver, op)
		}
	}
	if len(leftOver) == 0 {
		t.Fatalf("every queued write reached the firmware before the takeover (%v): nothing shows the gate", wrote)
	}

	want(t, f.cmdOp("op-old", g1, "set", `{"rpm":1}`), wire.StatusRejected, wire.CodeStaleFence)
	f.newGeneration("op-new")

	px.Resume()
	testkit.Eventually(t, 15*time.Second, "the cut-off agent standby of the new active once the link is back", func() bool {
		r, host := haRole(f.adminAt)
		return r == "standby" && host != ""
	})
	g3 := f.lock()
	want(t, f.cmdOp("op-new2-barrier", g3, wire.ActionFence, ""), wire.StatusApplied, wire.CodeOK)
	want(t, f.cmdOp("op-new2", g3, "set", `{"rpm":400}`), wire.StatusApplied, wire.CodeOK)
	if got := f.journalOps()[atTakeover:]; !slices.Equal(got, []string{"op-new", "op-new2"}) {
		t.Fatalf("the firmware's journal after the takeover: %v (%v were queued on the cut-off agent and must never reach it)", got, leftOver)
	}
	if r, _ := haRole(b.adminAt); r != "active" {
		t.Fatalf("the new active's role at the end: %q", r)
	}
	f.checkJournal()
}

// A stand-down during start-up (review): the active's proof lapses after
// its fence memory started and before the app follows its role (a slow
// start: plugins compiling, here the startup failpoint's sleep, while the
// etcd link is cut). When the link is back and it is active again, one
// MQTT client serves: the one made at start is closed, never connected,
// so no two clients with the gateway's client ID take the broker session
// from each other.
func TestHAStandDownDuringStartUp(t *testing.T) {
	f := newFM(t)
	px := testkit.NewProxy(t, f.etcd.Endpoints()[0])
	f.coordinate([]string{"http://" + px.Addr()})
	f.extra += "ha:\n  enabled: true\n  safety_margin: 1s\n"
	f.started = true // not waiting for the agent's online status: start-up is the window
	f.startProc("EDGE_AGENT_FAILPOINTS=startup=sleep(5s)")
	testkit.Eventually(t, 20*time.Second, "the agent active (its fence memory started) and in the start-up's sleep", func() bool {
		return strings.Contains(f.log(), "failpoint: sleeping 5s at startup")
	})
	px.Pause()
	testkit.Eventually(t, 10*time.Second, "the agent stood down while starting", func() bool {
		return strings.Contains(f.log(), "stands down as standby")
	})
	testkit.Eventually(t, 15*time.Second, "the start-up's sleep over", func() bool {
		return strings.Contains(f.log(), "failpoint: slept 5s at startup")
	})
	if strings.Contains(f.log(), "ha: active again") {
		t.Fatal("active again before start-up finished: the window was not hit")
	}
	px.Resume()
	testkit.Eventually(t, 20*time.Second, "active and ready once etcd is back", func() bool {
		code, _, err := f.get("/readyz")
		r, _ := haRole(f.adminAt)
		return err == nil && code == 200 && r == "active"
	})
	mark := len(f.log())
	g := f.lock()
	want(t, f.cmdOp("after-start", g, "set", `{"rpm":100}`), wire.StatusApplied, wire.CodeOK)
	// Two clients with one client ID would take the session from each
	// other over and over (paho reconnects within a second or two): a
	// window of a few of those is watched, in the agent's log.
	time.Sleep(4 * time.Second)
	if later := f.log()[mark:]; strings.Contains(later, "connection lost") {
		t.Fatalf("the agent's broker connection was lost once it served (two clients with its client ID?):\n%s", testkit.Tail(later, 2000))
	}
	want(t, f.cmdOp("after-start-2", g, "set", `{"rpm":200}`), wire.StatusApplied, wire.CodeOK)
}
