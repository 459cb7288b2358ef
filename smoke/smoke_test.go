// Package smoke runs the shipped programs end to end, as processes, the way
// an operator would: firmware-sim, `edge-agent run` on the embedded broker
// with a policy plugin bound, and edgectl sending commands. By default the
// binaries are built for this machine; with SMOKE_BIN and SMOKE_EMULATOR
// (make test-arm64) edge-agent and firmware-sim are another platform's
// builds run under qemu-user, while edgectl and the plugin stay the host's.
package smoke

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/testkit"
)

// Under emulation everything is 5-20 times slower: generous deadlines.
const within = 3 * time.Minute

// proc is a process this test started; it is stopped by its PID only.
type proc struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan struct{}
}

type syncBuffer struct {
	mu chan struct{}
	b  bytes.Buffer
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{mu: make(chan struct{}, 1)} }

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu <- struct{}{}
	defer func() { <-s.mu }()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu <- struct{}{}
	defer func() { <-s.mu }()
	return s.b.String()
}

// start runs bin (under the emulator, if any) and kills it by PID when the
// test ends, if it is still running.
func start(t *testing.T, emulator, bin string, args ...string) *proc {
	t.Helper()
	name := filepath.Base(bin)
	if emulator != "" {
		args = append([]string{bin}, args...)
		bin = emulator
	}
	p := &proc{cmd: exec.Command(bin, args...), out: newSyncBuffer(), exited: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("%s:\n%s", name, p.out.String())
		}
	})
	return p
}

// stop sends SIGTERM and returns the exit status.
func (p *proc) stop(t *testing.T) int {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(within):
		t.Fatalf("%s did not stop on SIGTERM", p.cmd.Path)
	}
	return p.cmd.ProcessState.ExitCode()
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func goBuild(t *testing.T, env []string, out string, args ...string) {
	t.Helper()
	cmd := exec.Command("go", append([]string{"build", "-o", out}, args...)...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v: %v\n%s", args, err, b)
	}
}

// binaries returns the directory holding edge-agent and firmware-sim (and
// the emulator to run them with), edgectl for this machine, and a plugin.
func binaries(t *testing.T) (dir, emulator, edgectl, plugins string) {
	t.Helper()
	tmp := t.TempDir()
	dir, emulator = os.Getenv("SMOKE_BIN"), os.Getenv("SMOKE_EMULATOR")
	if dir == "" {
		dir = filepath.Join(tmp, "bin")
		for _, p := range []struct{ name, pkg string }{{"edge-agent", "./cmd/edge-agent"}, {"firmware-sim", "./firmware-sim"}} {
			goBuild(t, []string{"CGO_ENABLED=0"}, filepath.Join(dir, p.name), "-trimpath", p.pkg)
		}
	} else if emulator != "" {
		if _, err := exec.LookPath(emulator); err != nil {
			t.Fatalf("SMOKE_EMULATOR %s: %v", emulator, err)
		}
	}
	edgectl = filepath.Join(tmp, "edgectl")
	goBuild(t, nil, edgectl, "./cmd/edgectl")
	plugins = filepath.Join(tmp, "plugins")
	goBuild(t, []string{"GOOS=wasip1", "GOARCH=wasm"}, filepath.Join(plugins, "range-limit.wasm"), "-buildmode=c-shared", "./plugins/range-limit")
	return dir, emulator, edgectl, plugins
}

// A command is applied, a stale fence is rejected, a policy denial keeps a
// command from the device; the agent stops cleanly and its store says
// last_fence 5 offline.
func TestSmoke(t *testing.T) {
	bins, emu, edgectl, plugins := binaries(t)
	out, err := emulated(emu, filepath.Join(bins, "edge-agent"), "version").CombinedOutput()
	if err != nil {
		t.Fatalf("edge-agent version: %v\n%s", err, out)
	}
	t.Logf("%s", bytes.TrimSpace(out))
	if want := os.Getenv("SMOKE_PLATFORM"); want != "" && !strings.Contains(string(out), " "+want+"\n") {
		t.Fatalf("edge-agent version %q does not say %s", out, want)
	}

	sim := start(t, emu, filepath.Join(bins, "firmware-sim"), "--listen", "127.0.0.1:0", "--log-level", "warn", "--devices", "pump-7:pump")
	var simURL string
	eventually(t, "firmware-sim says where it listens", func() bool {
		line, _, _ := strings.Cut(sim.out.String(), "\n")
		var ok bool
		simURL, ok = strings.CutPrefix(strings.TrimSpace(line), "firmware-sim listening on ")
		return ok && strings.HasPrefix(simURL, "http://") && strings.Contains(sim.out.String(), "\n")
	})

	dir := t.TempDir()
	broker, admin := testkit.FreeAddr(t), testkit.FreeAddr(t)
	cfg := fmt.Sprintf(`gateway_id: gw-smoke
data_dir: %s
mqtt: {broker: embedded, embedded_listen: %q, client_id: edge-agent-smoke}
admin: {listen: %q}
plugins: {dir: %s}
devices:
  - id: pump-7
    type: pump
    driver: {url: %q, idempotent: true, queryable: true}
    policy: {plugin: range-limit, config: {param: rpm, min: 0, max: 3000}}
`, filepath.Join(dir, "data"), broker, admin, plugins, simURL)
	cfgPath := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// Natively, with strace and systemd-analyze at hand, the agent runs
	// under strace: every system call it makes must pass the unit's
	// SystemCallFilter (checked after the stop).
	var agent *proc
	trace := ""
	if sa, st := tools(emu); sa != "" && st != "" {
		trace = filepath.Join(dir, "strace")
		agent = start(t, "", st, "-f", "-qq", "-o", trace, "--", filepath.Join(bins, "edge-agent"), "run", "--config", cfgPath)
	} else {
		t.Log("not checking the unit's system call filter: needs a native run, strace and systemd-analyze")
		agent = start(t, emu, filepath.Join(bins, "edge-agent"), "run", "--config", cfgPath)
	}
	eventually(t, "/readyz 200", func() bool {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	send := func(fence, rpm int) (int, map[string]any) {
		t.Helper()
		cmd := exec.Command(edgectl, "send", "--broker", "tcp://"+broker, "--gateway", "gw-smoke", "--device", "pump-7",
			"--action", "set", "--param", fmt.Sprintf("rpm=%d", rpm), "--fence", fmt.Sprint(fence), "--timeout", "2m")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if _, ok := err.(*exec.ExitError); err != nil && !ok {
			t.Fatal(err)
		}
		var r map[string]any
		if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
			t.Fatalf("edgectl printed no Result: %v\nstdout %s\nstderr %s", err, stdout.String(), stderr.String())
		}
		return cmd.ProcessState.ExitCode(), r
	}
	for _, tc := range []struct {
		fence, rpm int
		exit       int
		status     string
		code       string
	}{
		{5, 1200, 0, "applied", "ok"},
		{4, 1500, 1, "rejected", "stale_fence"},
		{6, 9000, 1, "rejected", "policy_denied"},
	} {
		code, r := send(tc.fence, tc.rpm)
		if code != tc.exit || r["status"] != tc.status || r["code"] != tc.code {
			t.Fatalf("fence %d rpm %d: exit %d, Result %v; want exit %d, %s/%s", tc.fence, tc.rpm, code, r, tc.exit, tc.status, tc.code)
		}
	}

	// The device saw exactly the applied write.
	resp, err := http.Get(simURL + "/v1/journal")
	if err != nil {
		t.Fatal(err)
	}
	var writes []map[string]any
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var w map[string]any
		if err := json.Unmarshal(sc.Bytes(), &w); err != nil {
			t.Fatalf("journal line %q: %v", sc.Text(), err)
		}
		writes = append(writes, w)
	}
	resp.Body.Close()
	if len(writes) != 1 || writes[0]["fence"] != float64(5) {
		t.Fatalf("device journal: %v, want one write with fence 5", writes)
	}

	// A plugin reload (SIGHUP), then a clean stop.
	agent.signal(t, syscall.SIGHUP, trace != "")
	eventually(t, "the plugins reloaded", func() bool { return strings.Contains(agent.out.String(), "policy plugins reloaded") })
	agent.signal(t, syscall.SIGTERM, trace != "")
	select {
	case <-agent.exited:
	case <-time.After(within):
		t.Fatal("edge-agent did not stop on SIGTERM")
	}
	if code := agent.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("edge-agent exit %d on SIGTERM, want 0", code)
	}
	if trace != "" {
		checkSyscallFilter(t, trace)
		checkAddressFamilies(t, trace)
	}
	out, err = emulated(emu, filepath.Join(bins, "edge-agent"), "inspect", "--data-dir", filepath.Join(dir, "data"), "--json").CombinedOutput()
	if err != nil {
		t.Fatalf("inspect: %v\n%s", err, out)
	}
	var devs []struct {
		Device    string `json:"device"`
		LastFence int64  `json:"last_fence"`
	}
	// The policy denial raised last_fence to 6 before the policy ran
	// (PROTOCOL.md §1: fence, then policy).
	if err := json.Unmarshal(out, &devs); err != nil || len(devs) != 1 || devs[0].LastFence != 6 {
		t.Fatalf("inspect: %v %s", err, out)
	}
	if code := sim.stop(t); code != 0 {
		t.Fatalf("firmware-sim exit %d", code)
	}
}

// emulated is bin args..., run under the emulator if there is one.
func emulated(emulator, bin string, args ...string) *exec.Cmd {
	if emulator == "" {
		return exec.Command(bin, args...)
	}
	return exec.Command(emulator, append([]string{bin}, args...)...)
}

// tools returns systemd-analyze and strace when the run is native and
// both are installed.
func tools(emulator string) (systemdAnalyze, strace string) {
	if emulator != "" {
		return "", ""
	}
	sa, err1 := exec.LookPath("systemd-analyze")
	st, err2 := exec.LookPath("strace")
	if err1 != nil || err2 != nil {
		return "", ""
	}
	return sa, st
}

// signal sends sig to the process, or, when it is strace, to the program
// strace runs (its child: strace does not pass signals on).
func (p *proc) signal(t *testing.T, sig syscall.Signal, traced bool) {
	t.Helper()
	pid := p.cmd.Process.Pid
	if traced {
		var child int
		eventually(t, "strace's child", func() bool {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
			if err != nil {
				return false
			}
			f := strings.Fields(string(b))
			if len(f) == 0 {
				return false
			}
			_, err = fmt.Sscan(f[0], &child)
			return err == nil
		})
		pid = child
	}
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatal(err)
	}
}

var traceLine = regexp.MustCompile(`^\d+\s+(?:<\.\.\. )?([a-z0-9_]+)(?:\(| resumed)`)

// checkSyscallFilter checks every system call in an strace log against
// configs/edge-agent.service's SystemCallFilter= lines, expanded by
// systemd-analyze syscall-filter: the first line is the allow list, each
// later "~" line takes its groups out of it (systemd.exec(5)).
func checkSyscallFilter(t *testing.T, trace string) {
	t.Helper()
	used := map[string]bool{}
	b, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if m := traceLine.FindStringSubmatch(l); m != nil {
			used[m[1]] = true
		}
	}
	if len(used) < 20 {
		t.Fatalf("only %d system calls in %s: not a trace of the agent", len(used), trace)
	}
	unit, err := os.ReadFile("../configs/edge-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	var allowed map[string]bool
	for _, l := range strings.Split(string(unit), "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(l), "SystemCallFilter=")
		if !ok {
			continue
		}
		deny := strings.HasPrefix(v, "~")
		set := map[string]bool{}
		for _, g := range strings.Fields(strings.TrimPrefix(v, "~")) {
			expandFilter(t, g, set)
		}
		switch {
		case allowed == nil && !deny:
			allowed = set
		case deny:
			for c := range set {
				delete(allowed, c)
			}
		default:
			for c := range set {
				allowed[c] = true
			}
		}
	}
	if allowed == nil {
		t.Fatal("the unit has no SystemCallFilter allow list")
	}
	var denied []string
	for c := range used {
		if !allowed[c] {
			denied = append(denied, c)
		}
	}
	sort.Strings(denied)
	t.Logf("%d distinct system calls in the trace", len(used))
	if len(denied) > 0 {
		t.Fatalf("the agent made system calls the unit's SystemCallFilter denies (EPERM under systemd): %v", denied)
	}
}

// expandFilter adds a system call, or a @group with its subgroups, to set.
func expandFilter(t *testing.T, name string, set map[string]bool) {
	t.Helper()
	if !strings.HasPrefix(name, "@") {
		set[name] = true
		return
	}
	out, err := exec.Command("systemd-analyze", "syscall-filter", name).Output()
	if err != nil {
		t.Fatalf("systemd-analyze syscall-filter %s: %v", name, err)
	}
	lines := strings.Split(string(out), "\n")
	for _, l := range lines[1:] { // the first line is the group's name
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		expandFilter(t, l, set)
	}
}

var socketCall = regexp.MustCompile(`\bsocket\((AF_[A-Z0-9]+)`)

// checkAddressFamilies checks the sockets in an strace log against the
// unit's RestrictAddressFamilies= (a socket of another family fails with
// EAFNOSUPPORT under systemd).
func checkAddressFamilies(t *testing.T, trace string) {
	t.Helper()
	b, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	unit, err := os.ReadFile("../configs/edge-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{}
	for _, l := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "RestrictAddressFamilies="); ok {
			for _, f := range strings.Fields(v) {
				allowed[f] = true
			}
		}
	}
	if len(allowed) == 0 {
		t.Fatal("the unit has no RestrictAddressFamilies=")
	}
	used := map[string]bool{}
	for _, m := range socketCall.FindAllStringSubmatch(string(b), -1) {
		used[m[1]] = true
	}
	if len(used) == 0 {
		t.Fatal("no socket() in the trace")
	}
	for f := range used {
		if !allowed[f] {
			t.Errorf("the agent opened an %s socket; the unit allows only %v", f, allowed)
		}
	}
}
