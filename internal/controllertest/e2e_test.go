package controllertest

// End-to-end tests: the real edge-agent and firmware-sim, built from this
// repository and run as processes, with a real mosquitto and real etcd.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/etcdtest"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

const e2eGateway = "gw-ctl"

// e2eBinaries builds cmd/edge-agent and firmware-sim once per test binary.
func e2eBinaries(t *testing.T) (agent, simBin string) {
	t.Helper()
	return testkit.Build(t, "../../cmd/edge-agent"), testkit.Build(t, "../../firmware-sim")
}

// startProc runs a process until t.Cleanup (SIGTERM, then SIGKILL after
// 10s), with its output kept for failures.
func startProc(t *testing.T, name string, args ...string) *testkit.Proc {
	t.Helper()
	return testkit.StartProc(t, testkit.ProcOptions{}, name, args...)
}

// gateway is a running agent with its firmware simulator.
type gateway struct {
	broker, simURL, admin string
}

func startGateway(t *testing.T, lock string) *gateway {
	t.Helper()
	agentBin, simBin := e2eBinaries(t)
	g := &gateway{broker: mqtttest.StartMosquitto(t).URL()}
	dir := t.TempDir()
	simAddr := testkit.FreeAddr(t)
	sp := startProc(t, simBin, "--listen", simAddr, "--devices", "pump-7:pump,valve-1:valve", "--journal", filepath.Join(dir, "journal.jsonl"))
	g.simURL = "http://" + simAddr
	testkit.Eventually(t, 15*time.Second, "firmware-sim up", func() bool {
		select {
		case <-sp.Done():
			t.Fatalf("firmware-sim exited: %s", sp.Log())
		default:
		}
		resp, err := http.Get(g.simURL + "/v1/journal")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	adminAddr := testkit.FreeAddr(t)
	g.admin = "http://" + adminAddr
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "gateway_id: %s\ndata_dir: %s\nmqtt:\n  broker: %s\n  client_id: edge-agent-%s\n  topic_prefix: edge\n",
		e2eGateway, filepath.Join(dir, "data"), g.broker, e2eGateway)
	fmt.Fprintf(&cfg, "admin:\n  listen: %s\nshutdown_timeout: 5s\ndevices:\n", adminAddr)
	for _, d := range []string{"pump-7:pump", "valve-1:valve"} {
		id, typ, _ := strings.Cut(d, ":")
		fmt.Fprintf(&cfg, "  - id: %s\n    type: %s\n", id, typ)
		if lock != "" && id == "pump-7" {
			fmt.Fprintf(&cfg, "    lock: %s\n", lock)
		}
		fmt.Fprintf(&cfg, "    driver:\n      kind: http\n      url: %s\n      timeout: 1s\n      idempotent: true\n      queryable: true\n", g.simURL)
	}
	cfgPath := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	ap := startProc(t, agentBin, "run", "--config", cfgPath)
	testkit.Eventually(t, 20*time.Second, "edge-agent ready", func() bool {
		select {
		case <-ap.Done():
			t.Fatalf("edge-agent exited: %s", ap.Log())
		default:
		}
		resp, err := http.Get(g.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return g
}

type journalEntry struct {
	Seq    int64           `json:"seq"`
	Device string          `json:"device"`
	OpID   string          `json:"op_id"`
	Fence  int64           `json:"fence"`
	Action string          `json:"action"`
	Params json.RawMessage `json:"params"`
}

func (g *gateway) journal(t *testing.T) []journalEntry {
	t.Helper()
	resp, err := http.Get(g.simURL + "/v1/journal")
	if err != nil {
		t.Fatalf("journal: %v", err)
	}
	defer resp.Body.Close()
	var out []journalEntry
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var e journalEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("journal line %q: %v", sc.Text(), err)
		}
		out = append(out, e)
	}
	return out
}

// recorded returns the agent's recorded outcome of an op, or false.
func (g *gateway) recorded(t *testing.T, dev, opID string) (wire.Result, bool) {
	t.Helper()
	resp, err := http.Get(g.admin + "/v1/devices/" + dev + "/ops/" + opID)
	if err != nil {
		t.Fatalf("admin: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, resp.Body)
		return wire.Result{}, false
	}
	var r wire.Result
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("admin op %s: %v", opID, err)
	}
	return r, true
}

func dialGW(t *testing.T, broker string) *controller.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := controller.Dial(ctx, controller.ConnOptions{Broker: broker, Gateway: e2eGateway})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// pausingOwner is a Holder whose ownership check, once armed, stops after
// it passed: Send checks ownership right before each publish, so this is
// the place between checking and writing where a GC pause or a frozen VM
// stops a controller.
type pausingOwner struct {
	*controller.Holder
	pause atomic.Pointer[func()]
}

func (o *pausingOwner) pauseAfterNextCheck(f func()) { o.pause.Store(&f) }

func (o *pausingOwner) Check() error {
	err := o.Holder.Check()
	if f := o.pause.Swap(nil); f != nil && err == nil {
		(*f)()
	}
	return err
}

// A holder frozen between its ownership check and its write, past its
// TTL, while another takes over and writes: when it resumes, the agent
// rejects its command stale_fence, nothing of it reaches the firmware, and
// it reports LOST.
func TestE2EPausedHolderIsFenced(t *testing.T) {
	const lock = "locks/device/pump-7"
	g := startGateway(t, lock)
	c := etcdtest.Start(t, 1)
	proxy := testkit.NewProxy(t, strings.TrimPrefix(c.Members[0].ClientURL, "http://"))
	cliA := newClient(t, "http://"+proxy.Addr())
	cliB := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const ttl = 2 * time.Second

	a, err := controller.Acquire(ctx, cliA, []string{lock}, &controller.LockOptions{TTL: ttl, Name: "A"})
	if err != nil {
		t.Fatal(err)
	}
	pa := &pausingOwner{Holder: a}
	sa := controller.NewSender(dialGW(t, g.broker), pa, &controller.SendOptions{ResultTimeout: 2 * time.Second})
	if err := sa.Barrier(ctx, "pump-7"); err != nil {
		t.Fatalf("A barrier: %v", err)
	}
	if _, err := sa.Send(ctx, "pump-7", "set", map[string]any{"rpm": 1000}); err != nil {
		t.Fatalf("A's first write: %v", err)
	}

	// A's next write stops between its check and its publish.
	const pausedOp = "paused-op-A"
	paused, resume := make(chan struct{}), make(chan struct{})
	pa.pauseAfterNextCheck(func() {
		close(paused)
		<-resume
	})
	aErr := make(chan error, 1)
	go func() {
		_, err := sa.Send(ctx, "pump-7", "set", map[string]any{"rpm": 2000}, controller.WithOpID(pausedOp))
		aErr <- err
	}()
	<-paused
	proxy.Pause() // and its keepalives stop reaching etcd

	b, err := controller.Acquire(ctx, cliB, []string{lock}, &controller.LockOptions{TTL: ttl, AcquireTimeout: 15 * time.Second, Name: "B"})
	if err != nil {
		t.Fatalf("B: %v", err)
	}
	if b.Fence() <= a.Fence() {
		t.Fatalf("B fence %d <= A fence %d", b.Fence(), a.Fence())
	}
	sb := controller.NewSender(dialGW(t, g.broker), b, nil)
	if err := sb.Barrier(ctx, "pump-7"); err != nil {
		t.Fatalf("B barrier: %v", err)
	}
	rb, err := sb.Send(ctx, "pump-7", "set", map[string]any{"rpm": 3000})
	if err != nil {
		t.Fatalf("B's write: %v", err)
	}

	close(resume) // A wakes up and publishes with its old fence
	proxy.Resume()
	var err2 error
	select {
	case err2 = <-aErr:
	case <-ctx.Done():
		t.Fatal("A's send did not return")
	}
	if !errors.Is(err2, controller.ErrLost) {
		t.Fatalf("A's send after the pause: %v, want ErrLost", err2)
	}
	if s := a.State(); s != controller.StateLost {
		t.Fatalf("A is %s, want LOST", s)
	}
	var rec wire.Result
	testkit.Eventually(t, 10*time.Second, "the agent to record A's paused command", func() bool {
		var ok bool
		rec, ok = g.recorded(t, "pump-7", pausedOp)
		return ok
	})
	if rec.Code != wire.CodeStaleFence || rec.Fence != a.Fence() || rec.LastFence < b.Fence() {
		t.Fatalf("agent's outcome of A's paused command: %+v; want stale_fence with last_fence >= %d", rec, b.Fence())
	}
	for _, e := range g.journal(t) {
		if e.OpID == pausedOp {
			t.Fatalf("A's paused command reached the firmware: %+v", e)
		}
	}
	j := g.journal(t)
	if len(j) != 2 || j[0].Fence != a.Fence() || j[1].Fence != b.Fence() || j[1].OpID != rb.OpID {
		t.Fatalf("journal %+v; want A's first write then B's", j)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// The etcd leader is killed while a lock is held and both holders keep
// working: the holder either keeps ownership or goes LOST and stops, and
// the firmware never sees a write of the older holder after one of the
// newer.
func TestE2ELeaderKillNeverTwoAccepted(t *testing.T) {
	const lock = "locks/device/pump-7"
	g := startGateway(t, lock)
	c := etcdtest.Start(t, 3)
	cliA := newClient(t, c.Endpoints()...)
	cliB := newClient(t, c.Endpoints()...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const ttl = 2 * time.Second
	a, err := controller.Acquire(ctx, cliA, []string{lock}, &controller.LockOptions{TTL: ttl, RequestTimeout: 500 * time.Millisecond, Name: "A"})
	if err != nil {
		t.Fatal(err)
	}
	sa := controller.NewSender(dialGW(t, g.broker), a, &controller.SendOptions{ResultTimeout: time.Second})
	if err := sa.Barrier(ctx, "pump-7"); err != nil {
		t.Fatal(err)
	}
	type applied struct {
		who string
		r   wire.Result
	}
	var mu sync.Mutex
	var accepted []applied
	loop := func(who string, h *controller.Holder, s *controller.Sender, stop <-chan struct{}) {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-h.Context().Done():
				return
			default:
			}
			if h.Check() != nil {
				return
			}
			sctx, scancel := context.WithTimeout(h.Context(), 5*time.Second)
			r, err := s.Send(sctx, "pump-7", "set", map[string]any{"rpm": i % 6000})
			scancel()
			if err == nil {
				mu.Lock()
				accepted = append(accepted, applied{who, r})
				mu.Unlock()
			}
		}
	}
	stopA := make(chan struct{})
	aDone := make(chan struct{})
	go func() { defer close(aDone); loop("A", a, sa, stopA) }()
	testkit.Eventually(t, 10*time.Second, "A's writes to be applied", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(accepted) >= 3
	})
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Kill(leader)
	t.Logf("killed etcd leader m%d while A holds fence %d", leader, a.Fence())

	bRes := make(chan error, 1)
	var b *controller.Holder
	go func() {
		var err error
		b, err = controller.Acquire(ctx, cliB, []string{lock}, &controller.LockOptions{TTL: ttl, AcquireTimeout: 20 * time.Second, RequestTimeout: 500 * time.Millisecond, Name: "B"})
		bRes <- err
	}()
	select {
	case <-a.Context().Done():
	case <-time.After(2 * time.Second):
	}
	close(stopA)
	<-aDone
	aEnd := a.State()
	_ = a.Release(ctx)
	if err := <-bRes; err != nil {
		t.Fatalf("B: %v", err)
	}
	sb := controller.NewSender(dialGW(t, g.broker), b, nil)
	if err := sb.Barrier(ctx, "pump-7"); err != nil {
		t.Fatal(err)
	}
	stopB := make(chan struct{})
	bDone := make(chan struct{})
	go func() { defer close(bDone); loop("B", b, sb, stopB) }()
	testkit.Eventually(t, 10*time.Second, "B's writes", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return accepted[len(accepted)-1].who == "B"
	})
	close(stopB)
	<-bDone
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("A ended %s (%v); fences A=%d B=%d", aEnd, context.Cause(a.Context()), a.Fence(), b.Fence())
	if aEnd != controller.StateActive && aEnd != controller.StateLost {
		t.Fatalf("A ended %s", aEnd)
	}
	j := g.journal(t)
	seenB := false
	var last int64
	for _, e := range j {
		if e.Fence < last {
			t.Fatalf("journal fence went backwards at %+v", e)
		}
		last = e.Fence
		switch e.Fence {
		case b.Fence():
			seenB = true
		case a.Fence():
			if seenB {
				t.Fatalf("a write of A (%+v) reached the firmware after B's", e)
			}
		default:
			t.Fatalf("journal entry with unexpected fence: %+v", e)
		}
	}
	if !seenB {
		t.Fatalf("no write of B in the journal: %+v", j)
	}
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for _, x := range accepted {
		if x.who == "A" {
			n++
		}
	}
	nj := 0
	for _, e := range j {
		if e.Fence == a.Fence() {
			nj++
		}
	}
	// A Result A never saw (its context ended first) may still be
	// applied, never the other way round.
	if n > nj || n == 0 {
		t.Fatalf("A had %d writes applied, the journal has %d with its fence", n, nj)
	}
}

// A real controller process is frozen (SIGSTOP) past its TTL while another
// takes over and writes; the command it was told to send meanwhile is
// never sent after it resumes (its ownership check fails first), so
// nothing of it reaches the firmware, and it reports LOST.
func TestE2EStoppedProcessSendsNothing(t *testing.T) {
	const lock = "locks/device/pump-7"
	g := startGateway(t, lock)
	c := etcdtest.Start(t, 1)
	const ttl = 2 * time.Second
	p := startHolderProc(t, c.Endpoints(), lock, ttl, "HELPER_BROKER="+g.broker, "HELPER_GATEWAY="+e2eGateway)
	fa := p.fence()
	p.send("send op-before-stop")
	if l := p.waitLine(15*time.Second, "SENT op-before-stop"); !strings.Contains(l, " ok <nil>") {
		t.Fatalf("A's first send: %q", l)
	}
	p.stop()
	// Queued for when it wakes up.
	p.send("send op-after-stop")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := controller.Acquire(ctx, c.Client(t), []string{lock}, &controller.LockOptions{TTL: ttl, AcquireTimeout: 15 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sb := controller.NewSender(dialGW(t, g.broker), b, nil)
	if err := sb.Barrier(ctx, "pump-7"); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Send(ctx, "pump-7", "set", map[string]any{"rpm": 3000}); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	l := p.waitLine(15*time.Second, "SENT op-after-stop")
	if !strings.Contains(l, controller.ErrLost.Error()) || !strings.Contains(l, "not sent") {
		t.Fatalf("A after resuming: %q, want not sent, ownership lost", l)
	}
	p.waitLine(5*time.Second, "STATE LOST")
	if _, ok := g.recorded(t, "pump-7", "op-after-stop"); ok {
		t.Fatal("the agent received A's command after it resumed")
	}
	for _, e := range g.journal(t) {
		if e.OpID == "op-after-stop" || (e.Fence == fa && e.OpID != "op-before-stop") {
			t.Fatalf("journal has %+v from the stopped holder", e)
		}
	}
}

// edgectl against the real agent: send with a lock from etcd (applied,
// exit 0), send with an older fence (stale_fence, exit 1), and status.
func TestE2EEdgectl(t *testing.T) {
	const lock = "locks/device/pump-7"
	g := startGateway(t, lock)
	c := etcdtest.Start(t, 1)
	edgectl := testkit.Build(t, "../../cmd/edgectl")
	runCtl := func(args ...string) (int, string) {
		out, err := exec.Command(edgectl, args...).CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("edgectl: %v", err)
		}
		return code, string(out)
	}
	common := []string{"send", "--broker", g.broker, "--gateway", e2eGateway, "--device", "pump-7", "--timeout", "20s"}
	code, out := runCtl(append(common, "--action", "set", "--param", "rpm=1200", "--lock", lock, "--etcd", c.Endpoints()[0], "--op-id", "ctl-op-1")...)
	if code != 0 || !strings.Contains(out, `"status": "applied"`) {
		t.Fatalf("edgectl send --lock: exit %d\n%s", code, out)
	}
	var r wire.Result
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &r); err != nil {
		t.Fatalf("edgectl output %q: %v", out, err)
	}
	j := g.journal(t)
	if len(j) != 1 || j[0].OpID != "ctl-op-1" || j[0].Fence != r.Fence || string(j[0].Params) != `{"rpm":1200}` {
		t.Fatalf("journal %+v, result %+v", j, r)
	}
	code, out = runCtl(append(common, "--action", "stop", "--fence", "1", "--lock", lock)...)
	if code != 1 || !strings.Contains(out, `"code": "stale_fence"`) {
		t.Fatalf("edgectl send --fence 1: exit %d\n%s", code, out)
	}
	code, out = runCtl("status", "--admin", g.admin)
	if code != 0 || !strings.Contains(out, "pump-7") || !strings.Contains(out, fmt.Sprint(r.Fence)) {
		t.Fatalf("edgectl status: exit %d\n%s", code, out)
	}
	if len(g.journal(t)) != 1 {
		t.Fatalf("the stale command reached the firmware: %+v", g.journal(t))
	}
}

// The runnable example of docs/controller.md does its holder loop against
// the real agent: barrier, five fenced writes, release.
func TestE2EExampleController(t *testing.T) {
	const lock = "locks/device/pump-7"
	g := startGateway(t, lock)
	c := etcdtest.Start(t, 1)
	cmd := exec.Command(testkit.Build(t, "../../examples/controller"), "--etcd", c.Endpoints()[0],
		"--broker", g.broker, "--gateway", e2eGateway, "--device", "pump-7", "--lock", lock, "--steps", "5")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("example: %v\n%s", err, out)
	}
	j := g.journal(t)
	if len(j) != 5 {
		t.Fatalf("journal has %d writes, want 5:\n%s", len(j), out)
	}
	for i, e := range j {
		if e.Fence != j[0].Fence || string(e.Params) != fmt.Sprintf(`{"rpm":%d}`, 1000+100*i) {
			t.Fatalf("journal entry %d: %+v", i, e)
		}
	}
	if k := keysUnder(t, c.Client(t), lock); len(k) != 0 {
		t.Fatalf("the example did not release its lock: %+v", k)
	}
}
