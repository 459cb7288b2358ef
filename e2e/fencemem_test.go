package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/etcdtest"
)

// Fence memory beyond one disk (docs/protocol.md §7, invariant 7), with a
// real etcd, mosquitto, firmware-sim and the agent as a process. Fences
// are real lock revisions (a key put in etcd), as a controller's are. Each
// test makes its fault happen, shows the agent noticed (a fence-floor audit
// entry with its reason, or an exit naming the problem), and checks the
// firmware's journal: no write with a fence below one applied before it,
// and no op_id applied twice.

// fmEnv is a gateway with coordination.
type fmEnv struct {
	*env
	etcd  *etcdtest.Cluster
	cli   *clientv3.Client
	gen   int
	agent string // the agent binary
}

func newFM(t *testing.T) *fmEnv {
	t.Helper()
	f := &fmEnv{env: newEnv(t, pump("pump-7")), etcd: etcdtest.Start(t, 1)}
	f.cli = f.etcd.Client(t)
	f.adminAt = testkit.FreeAddr(t)
	f.coordinate(f.etcd.Endpoints())
	f.agent = testkit.Build(t, "../cmd/edge-agent", "failpoints")
	return f
}

// coordinate points the gateway's coordination block at eps.
func (f *fmEnv) coordinate(eps []string) {
	f.extra = fmt.Sprintf("coordination:\n  etcd:\n    endpoints: [%s]\n    dial_timeout: 1s\n    session_ttl: 3s\n", strings.Join(eps, ", "))
}

// lock takes a new lock generation: a key created in etcd, whose revision
// is the fence.
func (f *fmEnv) lock() int64 {
	f.t.Helper()
	f.gen++
	resp, err := f.cli.Put(context.Background(), fmt.Sprintf("locks/pump-7/gen-%d", f.gen), "")
	if err != nil {
		f.t.Fatal(err)
	}
	return resp.Header.Revision
}

// run starts the agent process and waits until it is ready.
func (f *fmEnv) run() {
	f.t.Helper()
	f.startProc()
	testkit.Eventually(f.t, 20*time.Second, "agent ready", func() bool {
		if f.proc == nil || !f.proc.Running() {
			return false
		}
		code, _, err := f.get("/readyz")
		return err == nil && code == 200
	})
}

// halt stops the agent process cleanly.
func (f *fmEnv) halt() {
	f.t.Helper()
	f.proc.Signal(syscall.SIGTERM)
	if code := f.waitExit(20 * time.Second); code != 0 {
		f.t.Fatalf("agent exit %d\n%s", code, f.plog)
	}
}

func (f *fmEnv) get(path string) (int, []byte, error) {
	resp, err := http.Get("http://" + f.adminAt + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, nil
}

func (f *fmEnv) device() wire.DeviceInfo {
	f.t.Helper()
	_, b, err := f.get("/v1/devices/pump-7")
	var d wire.DeviceInfo
	if err != nil || json.Unmarshal(b, &d) != nil {
		f.t.Fatalf("device: %v %s", err, b)
	}
	return d
}

func (f *fmEnv) status() map[string]any {
	f.t.Helper()
	_, b, err := f.get("/v1/status")
	var s map[string]any
	if err != nil || json.Unmarshal(b, &s) != nil {
		f.t.Fatalf("status: %v %s", err, b)
	}
	return s
}

// floors returns pump-7's fence-floor audit entries' reasons, newest first.
func (f *fmEnv) floors() []string {
	f.t.Helper()
	_, b, err := f.get("/v1/devices/pump-7/ops?limit=1000")
	var page struct {
		Ops []struct {
			OpID   string `json:"op_id"`
			Reason string `json:"reason"`
		} `json:"ops"`
	}
	if err != nil || json.Unmarshal(b, &page) != nil {
		f.t.Fatalf("history: %v %s", err, b)
	}
	var out []string
	for _, o := range page.Ops {
		if strings.HasPrefix(o.OpID, "fence-floor:") {
			out = append(out, o.Reason)
		}
	}
	return out
}

// wantFloor checks that the newest floor was taken for reason, and that
// last_fence is at least the floor.
func (f *fmEnv) wantFloor(n int, reason string) {
	f.t.Helper()
	fl := f.floors()
	d := f.device()
	if len(fl) != n || !strings.Contains(fl[0], reason) || !d.FenceConfirmed || d.FenceFloor == 0 || d.LastFence < d.FenceFloor {
		f.t.Fatalf("want %d floors, the newest for %q: %q; device %+v", n, reason, fl, d)
	}
}

// cmdOp sends one command and returns its first Result.
func (f *fmEnv) cmdOp(op string, fence int64, action, params string) wire.Result {
	f.t.Helper()
	c := cmd(op, fence, action, params)
	f.send("pump-7", c)
	return f.result(op, f.res.count(op)+1)
}

// checkJournal: no write with a fence below one applied before it, and no
// op_id applied twice.
func (f *fmEnv) checkJournal() {
	f.t.Helper()
	var high int64
	seen := map[string]bool{}
	for _, j := range f.journal() {
		if j.Fence < high {
			f.t.Errorf("stale fence reached the firmware: %s with fence %d after %d", j.OpID, j.Fence, high)
		}
		high = max(high, j.Fence)
		if seen[j.OpID] {
			f.t.Errorf("op %s ran twice", j.OpID)
		}
		seen[j.OpID] = true
	}
}

// newGeneration is what a holder does after stale_fence: a new lock, a
// barrier, then its command, which applies.
func (f *fmEnv) newGeneration(op string) {
	f.t.Helper()
	g := f.lock()
	want(f.t, f.cmdOp(op+"-barrier", g, wire.ActionFence, ""), wire.StatusApplied, wire.CodeOK)
	want(f.t, f.cmdOp(op, g, "set", `{"rpm":300}`), wire.StatusApplied, wire.CodeOK)
}

// The issue as a new user met it: wiping data/ made fence 41 applied after
// fence 42 had been. Now the restart on an empty store takes the floor:
// the older generation and the current holder's are stale, the op whose
// record was lost does not run again, and a new generation applies.
func TestFenceMemoryWipedDataDir(t *testing.T) {
	f := newFM(t)
	f.run()
	f.wantFloor(1, "new store")
	g41, g42 := f.lock(), f.lock()
	want(t, f.cmdOp("op-42", g42, "set", `{"rpm":100}`), wire.StatusApplied, wire.CodeOK)
	f.halt()
	if err := os.RemoveAll(f.dataDir); err != nil {
		t.Fatal(err)
	}
	f.run()
	f.wantFloor(1, "new store")
	want(t, f.cmdOp("op-41", g41, "set", `{"rpm":200}`), wire.StatusRejected, wire.CodeStaleFence)
	want(t, f.cmdOp("op-42", g42, "set", `{"rpm":100}`), wire.StatusRejected, wire.CodeStaleFence)
	f.newGeneration("op-43")
	if got := f.journalOps(); len(got) != 2 || got[0] != "op-42" || got[1] != "op-43" {
		t.Fatalf("journal %v", got)
	}
	f.checkJournal()
}

// A store restored from an online backup forgot what came after the
// backup: the floor is taken, and the op applied after the backup is not
// run again.
func TestFenceMemoryRestoredOnlineBackup(t *testing.T) {
	f := newFM(t)
	f.run()
	g1 := f.lock()
	want(t, f.cmdOp("op-a", g1, "set", `{"rpm":100}`), wire.StatusApplied, wire.CodeOK)
	bak := filepath.Join(t.TempDir(), "agent.db.bak")
	if out, err := exec.Command(f.agent, "backup", "--admin", "http://"+f.adminAt, "--out", bak).CombinedOutput(); err != nil {
		t.Fatalf("backup: %v\n%s", err, out)
	}
	g2 := f.lock()
	want(t, f.cmdOp("op-b", g2, "set", `{"rpm":200}`), wire.StatusApplied, wire.CodeOK)
	f.halt()
	copyTo(t, bak, filepath.Join(f.dataDir, "agent.db"))
	f.run()
	f.wantFloor(2, "online backup")
	want(t, f.cmdOp("op-b", g2, "set", `{"rpm":200}`), wire.StatusRejected, wire.CodeStaleFence)
	want(t, f.cmdOp("op-c", g1, "set", `{"rpm":1}`), wire.StatusRejected, wire.CodeStaleFence)
	f.newGeneration("op-d")
	if got := f.journalOps(); strings.Join(got, ",") != "op-a,op-b,op-d" {
		t.Fatalf("journal %v", got)
	}
	f.checkJournal()
}

// A copy of the stopped store, put back after the agent ran on, has an
// older epoch than etcd's record.
func TestFenceMemoryRestoredCopyOfAStoppedStore(t *testing.T) {
	f := newFM(t)
	f.run()
	f.halt()
	old := filepath.Join(t.TempDir(), "agent.db.copy")
	copyTo(t, filepath.Join(f.dataDir, "agent.db"), old)
	f.run()
	f.wantFloor(1, "new store")
	g := f.lock()
	want(t, f.cmdOp("op-a", g, "set", `{"rpm":100}`), wire.StatusApplied, wire.CodeOK)
	f.halt()
	copyTo(t, old, filepath.Join(f.dataDir, "agent.db"))
	f.run()
	f.wantFloor(2, "an older copy")
	want(t, f.cmdOp("op-a", g, "set", `{"rpm":100}`), wire.StatusRejected, wire.CodeStaleFence)
	f.newGeneration("op-b")
	f.checkJournal()
	if got := f.journalOps(); strings.Join(got, ",") != "op-a,op-b" {
		t.Fatalf("journal %v", got)
	}
}

// A cloned gateway (same gateway_id, a copy of the store, another data
// dir) exits 1 within session_ttl + 5 s naming the gateway and the other's
// pid, before it connects to the broker: the first one keeps serving.
func TestFenceMemoryClonedGatewayRefused(t *testing.T) {
	f := newFM(t)
	f.run()
	g := f.lock()
	want(t, f.cmdOp("op-a", g, "set", `{"rpm":100}`), wire.StatusApplied, wire.CodeOK)
	firstPID := f.proc.PID()
	cloneDir := filepath.Join(t.TempDir(), "data")
	os.MkdirAll(cloneDir, 0o750)
	var bak bytes.Buffer
	code, b, err := f.get("/v1/backup")
	if err != nil || code != 200 {
		t.Fatalf("backup: %d %v", code, err)
	}
	bak.Write(b)
	os.WriteFile(filepath.Join(cloneDir, "agent.db"), bak.Bytes(), 0o600)
	cfg, _ := os.ReadFile(f.cfgPath)
	cloneCfg := strings.Replace(strings.Replace(string(cfg), f.dataDir, cloneDir, 1), f.adminAt, testkit.FreeAddr(t), 1)
	path := filepath.Join(t.TempDir(), "clone.yaml")
	os.WriteFile(path, []byte(cloneCfg), 0o600)
	start := time.Now()
	clone := testkit.StartProc(t, testkit.ProcOptions{}, f.agent, "run", "--config", path, "--log-level", "warn")
	code, ok := clone.Wait(3*time.Second + 5*time.Second + 5*time.Second)
	if !ok || code != 1 || time.Since(start) > 3*time.Second+5*time.Second+3*time.Second ||
		!strings.Contains(clone.Log(), "gateway gw-1 is registered") || !strings.Contains(clone.Log(), fmt.Sprintf("pid %d", firstPID)) {
		t.Fatalf("clone: exit %d (%v) after %s\n%s", code, ok, time.Since(start), clone.Log())
	}
	if strings.Contains(clone.Log(), "mqtt") {
		t.Fatalf("the clone talked to the broker:\n%s", clone.Log())
	}
	if s := f.status(); s["mqtt_connected"] != true || s["coordination"].(map[string]any)["state"] != "connected" {
		t.Fatalf("the first gateway was disturbed: %v", s)
	}
	want(t, f.cmdOp("op-b", g, "set", `{"rpm":200}`), wire.StatusApplied, wire.CodeOK)
	f.checkJournal()
}

// A device moved to another gateway while the old one still claims it:
// the new gateway exits 2 naming both. Once the old one lets it go, the
// new one takes the floor for it.
func TestFenceMemoryDeviceMoved(t *testing.T) {
	f := newFM(t)
	f.run()
	g := f.lock()
	want(t, f.cmdOp("op-a", g, "set", `{"rpm":100}`), wire.StatusApplied, wire.CodeOK)
	gw2Admin, gw2Data := testkit.FreeAddr(t), filepath.Join(t.TempDir(), "data2")
	// gw2 writes gw-2's configuration with devs (the harness's writer,
	// renamed).
	gw2 := func(devs ...devSpec) string {
		saveDevs, savePath := f.devs, f.cfgPath
		f.devs, f.cfgPath = devs, filepath.Join(t.TempDir(), "gw2.yaml")
		path := f.writeConfig()
		f.devs, f.cfgPath = saveDevs, savePath
		b, _ := os.ReadFile(path)
		os.WriteFile(path, []byte(strings.NewReplacer("gateway_id: gw-1", "gateway_id: gw-2", "client_id: edge-agent-e2e", "client_id: edge-agent-e2e-2",
			f.dataDir, gw2Data, f.adminAt, gw2Admin).Replace(string(b))), 0o600)
		return path
	}
	// gw-2 has run before, with another device: its store is not new.
	p := testkit.StartProc(t, testkit.ProcOptions{}, f.agent, "run", "--config", gw2(pump("pump-9")), "--log-level", "warn")
	testkit.Eventually(t, 20*time.Second, "gw-2 ready", func() bool {
		resp, err := http.Get("http://" + gw2Admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	p.Signal(syscall.SIGTERM)
	if code, ok := p.Wait(20 * time.Second); !ok || code != 0 {
		t.Fatalf("gw-2 stop: %d\n%s", code, p.Log())
	}
	path := gw2(pump("pump-9"), pump("pump-7"))
	p = testkit.StartProc(t, testkit.ProcOptions{}, f.agent, "run", "--config", path, "--log-level", "warn")
	code, ok := p.Wait(15 * time.Second)
	if !ok || code != 2 || !strings.Contains(p.Log(), "device pump-7 is fronted by live gateway gw-1") || !strings.Contains(p.Log(), "gateway gw-2") {
		t.Fatalf("gw-2 while gw-1 claims pump-7: exit %d (%v)\n%s", code, ok, p.Log())
	}
	// gw-1 lets it go: it now fronts another device only.
	f.halt()
	f.devs = []devSpec{pump("pump-8")}
	f.run()
	p = testkit.StartProc(t, testkit.ProcOptions{}, f.agent, "run", "--config", path, "--log-level", "warn")
	testkit.Eventually(t, 20*time.Second, "gw-2 ready", func() bool {
		resp, err := http.Get("http://" + gw2Admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	resp, err := http.Get("http://" + gw2Admin + "/v1/devices/pump-7/ops")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "fence-floor:") || !strings.Contains(string(b), "device new to this gateway") {
		t.Fatalf("gw-2's history of pump-7: %s", b)
	}
	f.checkJournal()
}

// A corrupt store is refused with a message naming the file and what to
// do; moved aside, the next start takes the floor.
func TestFenceMemoryCorruptStore(t *testing.T) {
	f := newFM(t)
	f.run()
	g := f.lock()
	want(t, f.cmdOp("op-a", g, "set", `{"rpm":100}`), wire.StatusApplied, wire.CodeOK)
	f.halt()
	db := filepath.Join(f.dataDir, "agent.db")
	fh, err := os.OpenFile(db, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fh.WriteAt(bytes.Repeat([]byte{0x5a}, 16<<10), 0)
	fh.Close()
	f.startProc()
	if code := f.waitExit(15 * time.Second); code != 1 || !strings.Contains(f.plog, db+" cannot be read") || !strings.Contains(f.plog, "Move it aside") || strings.Contains(f.plog, "panic") {
		t.Fatalf("corrupt store: exit %d\n%s", code, f.plog)
	}
	if err := os.Rename(db, db+".corrupt"); err != nil {
		t.Fatal(err)
	}
	f.run()
	f.wantFloor(1, "new store")
	want(t, f.cmdOp("op-a", g, "set", `{"rpm":100}`), wire.StatusRejected, wire.CodeStaleFence)
	f.newGeneration("op-b")
	f.checkJournal()
}

// etcd down when a wiped store starts: nothing is applied, commands are
// fence_unconfirmed (not recorded: the same op_id is handled afresh). When
// etcd is back, the floor is taken; the old generation is stale and a new
// one applies.
func TestFenceMemoryEtcdDownThenBack(t *testing.T) {
	f := newFM(t)
	f.run()
	g := f.lock()
	want(t, f.cmdOp("op-a", g, "set", `{"rpm":100}`), wire.StatusApplied, wire.CodeOK)
	f.halt()
	os.RemoveAll(f.dataDir)
	f.etcd.Kill(0)
	f.run()
	s := f.status()["coordination"].(map[string]any)
	if s["state"] != "unreachable" || f.device().FenceConfirmed {
		t.Fatalf("status while etcd is down: %v %+v", s, f.device())
	}
	r := f.cmdOp("op-b", g, "set", `{"rpm":200}`)
	want(t, r, wire.StatusRejected, wire.CodeFenceUnconfirmed)
	want(t, f.cmdOp("op-b", g, "set", `{"rpm":200}`), wire.StatusRejected, wire.CodeFenceUnconfirmed)
	if r.Duplicate {
		t.Fatal("fence_unconfirmed was recorded")
	}
	if err := f.etcd.Restart(0); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 30*time.Second, "floor taken after etcd is back", func() bool { return f.device().FenceConfirmed })
	f.wantFloor(1, "new store")
	if s := f.status()["coordination"].(map[string]any); s["state"] != "connected" {
		t.Fatalf("status after etcd is back: %v", s)
	}
	want(t, f.cmdOp("op-b", g, "set", `{"rpm":200}`), wire.StatusRejected, wire.CodeStaleFence)
	f.newGeneration("op-c")
	if got := f.journalOps(); strings.Join(got, ",") != "op-a,op-c" {
		t.Fatalf("journal %v", got)
	}
	f.checkJournal()
}

// A rebuilt etcd (its revision below the fences the store holds) is named
// at start and on /v1/status, with the way out.
func TestFenceMemoryRebuiltEtcdNamed(t *testing.T) {
	f := newFM(t)
	f.run()
	for i := 0; i < 30; i++ {
		f.lock()
	}
	g := f.lock()
	want(t, f.cmdOp("op-a", g, "set", `{"rpm":100}`), wire.StatusApplied, wire.CodeOK)
	f.halt()
	fresh := etcdtest.Start(t, 1)
	f.coordinate(fresh.Endpoints())
	f.run()
	s := f.status()["coordination"].(map[string]any)
	rb, _ := s["rebuilt"].(map[string]any)
	if rb == nil || rb["highest_fence"].(float64) != float64(g) || !strings.Contains(rb["action"].(string), "--bump-revision") {
		t.Fatalf("status after a rebuilt etcd: %v", s)
	}
	if !strings.Contains(f.log(), "the cluster was rebuilt") {
		t.Fatalf("the log does not name it:\n%s", f.log())
	}
	f.checkJournal()
}

func copyTo(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
