package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

var (
	pluginsOnce sync.Once
	pluginsDir  string
	pluginsErr  error
)

// plugins builds the example policy plugins from source (Go guests and the
// C one) once per test binary, into a temp dir.
func plugins(t testing.TB) string {
	t.Helper()
	pluginsOnce.Do(func() {
		pluginsDir = filepath.Join(binDir, "plugins")
		os.MkdirAll(pluginsDir, 0o755)
		for _, name := range []string{"range-limit", "ramp-limit", "interlock", "allowlist", "time-window"} {
			cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", filepath.Join(pluginsDir, name+".wasm"), "../plugins/"+name)
			cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
			if out, err := cmd.CombinedOutput(); err != nil {
				pluginsErr = fmt.Errorf("building plugin %s: %v\n%s", name, err, out)
				return
			}
		}
		cmd := exec.Command("clang", "--target=wasm32", "-O2", "-nostdlib", "-fno-builtin", "-Wl,--no-entry", "-Wl,--export-dynamic",
			"-o", filepath.Join(pluginsDir, "range-limit-c.wasm"), "../plugins/range-limit-c/range_limit.c")
		if out, err := cmd.CombinedOutput(); err != nil {
			pluginsErr = fmt.Errorf("building the C plugin: %v\n%s", err, out)
		}
	})
	if pluginsErr != nil {
		t.Fatal(pluginsErr)
	}
	return pluginsDir
}

func withPolicy(d devSpec, plugin, config string) devSpec {
	d.policy = fmt.Sprintf("      plugin: %s\n      config: %s\n", plugin, config)
	if raceEnabled {
		// The race detector slows the host side of every call by an
		// order of magnitude; the deadlines are tested in policy/.
		d.policy += "      limits: {timeout: 2s, init_timeout: 20s}\n"
	}
	return d
}

func dev(id, typ string) devSpec {
	return devSpec{id: id, typ: typ, timeout: "1s", idempotent: true, queryable: true}
}

// Each example plugin allows, denies with its reason and, where it
// applies, rewrites, end to end through the agent with a real broker and
// firmware: denied commands never reach the journal.
func TestPoliciesEndToEnd(t *testing.T) {
	dir := plugins(t)
	now := time.Now().UTC()
	winStart := now.Add(2 * time.Hour).Format("15:04")
	winEnd := now.Add(3 * time.Hour).Format("15:04")
	pump1, valve2 := dev("pump-1", "pump"), dev("valve-2", "valve")
	pump1.group, valve2.group = "station", "station"
	e := newEnv(t,
		withPolicy(dev("pump-7", "pump"), "range-limit", `{param: rpm, min: 0, max: 3000}`),
		withPolicy(dev("valve-1", "valve"), "range-limit", `{param: open, min: 0, max: 80, clamp: true}`),
		withPolicy(dev("relay-1", "relay"), "allowlist", `{actions: [toggle]}`),
		withPolicy(dev("pump-2", "pump"), "ramp-limit", `{param: rpm, max_step: 200}`),
		pump1,
		withPolicy(valve2, "interlock", `{pump: pump-1, valve: valve-2}`),
		withPolicy(dev("mixer", "generic"), "time-window", fmt.Sprintf(`{actions: [flush], start: "%s", end: "%s"}`, winStart, winEnd)),
		withPolicy(dev("pump-c", "pump"), "range-limit-c", `{param: rpm, min: 0, max: 3000}`),
	)
	e.extra = "plugins:\n  dir: " + dir + "\n"
	e.start()

	type step struct {
		dev, op, action, params string
		code                    wire.Code
		reason                  string // substring, for denials
	}
	steps := []step{
		{"pump-7", "r1", "set", `{"rpm":1200}`, wire.CodeOK, ""},
		{"pump-7", "r2", "set", `{"rpm":4000}`, wire.CodePolicyDenied, "rpm 4000 above max 3000"},
		{"valve-1", "c1", "set", `{"open":95}`, wire.CodeOK, ""}, // clamped to 80
		{"relay-1", "a1", "toggle", ``, wire.CodeOK, ""},
		{"relay-1", "a2", "set", `{"on":true}`, wire.CodePolicyDenied, "action set is not allowed"},
		{"pump-2", "m1", "set", `{"rpm":100}`, wire.CodeOK, ""},
		{"pump-2", "m2", "set", `{"rpm":250}`, wire.CodeOK, ""},
		{"pump-2", "m3", "set", `{"rpm":600}`, wire.CodePolicyDenied, "change"},
		{"pump-1", "i1", "set", `{"rpm":500}`, wire.CodeOK, ""},
		{"valve-2", "i2", "set", `{"open":50}`, wire.CodePolicyDenied, "may not open while pump-1 runs"},
		{"pump-1", "i3", "stop", ``, wire.CodeOK, ""},
		{"valve-2", "i4", "set", `{"open":50}`, wire.CodeOK, ""},
		{"mixer", "w1", "flush", ``, wire.CodePolicyDenied, "allowed only between"},
		{"mixer", "w2", "stir", `{"speed":3}`, wire.CodeOK, ""},
		{"pump-c", "x1", "set", `{"rpm":4000}`, wire.CodePolicyDenied, "4000"},
		{"pump-c", "x2", "set", `{"rpm":100}`, wire.CodeOK, ""},
	}
	var applied []string
	for _, s := range steps {
		e.send(s.dev, cmd(s.op, 10, s.action, s.params))
		r := e.final(s.op)
		if r.Code != s.code || !strings.Contains(r.Reason, s.reason) {
			t.Fatalf("%s %s %s: got %s (%s), want %s (%q)", s.dev, s.action, s.params, r.Code, r.Reason, s.code, s.reason)
		}
		if s.code == wire.CodePolicyDenied && r.LastFence != 10 {
			t.Fatalf("%s: a denial raises last_fence: %d", s.op, r.LastFence)
		}
		if s.code == wire.CodeOK {
			applied = append(applied, s.op)
		}
	}
	if got, want := strings.Join(e.journalOps(), ","), strings.Join(applied, ","); got != want {
		t.Fatalf("journal %s, want only the allowed %s", got, want)
	}
	for _, j := range e.journal() {
		if j.OpID == "c1" && string(j.Params) != `{"open":80}` {
			t.Fatalf("clamped write sent %s, want {\"open\":80}", j.Params)
		}
	}
}

// Hot reload while commands flow: no command fails because of the reload,
// and a broken replacement is refused while the old plugin keeps working.
func TestPolicyHotReloadWhileCommandsFlow(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(plugins(t), "range-limit.wasm")
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	plugin := filepath.Join(dir, "range-limit.wasm")
	os.WriteFile(plugin, b, 0o644)
	e := newEnv(t, withPolicy(dev("pump-7", "pump"), "range-limit", `{param: rpm, min: 0, max: 3000}`), dev("pump-8", "pump"))
	e.extra = "plugins:\n  dir: " + dir + "\n"
	a := e.start()

	var sent atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			e.send("pump-7", cmd(fmt.Sprintf("flow-%d", i), 1, "set", fmt.Sprintf(`{"rpm":%d}`, i%3000)))
			sent.Add(1)
			e.final(fmt.Sprintf("flow-%d", i))
		}
	}()
	testkit.Eventually(t, 10*time.Second, "commands flowing", func() bool { return sent.Load() > 5 })
	for i := 0; i < 3; i++ {
		if err := a.Reload(context.Background()); err != nil {
			t.Fatalf("reload %d: %v", i, err)
		}
	}
	// A broken replacement: refused, the old module keeps serving.
	os.WriteFile(plugin, []byte("\x00asm garbage"), 0o644)
	if err := a.Reload(context.Background()); err == nil {
		t.Fatal("a broken plugin was accepted")
	}
	n := sent.Load()
	testkit.Eventually(t, 10*time.Second, "commands still flowing", func() bool { return sent.Load() > n+5 })
	close(stop)
	<-done
	for i := 0; i < int(sent.Load()); i++ {
		want(t, e.final(fmt.Sprintf("flow-%d", i)), wire.StatusApplied, wire.CodeOK)
	}
	e.send("pump-7", cmd("deny", 1, "set", `{"rpm":4000}`))
	want(t, e.final("deny"), wire.StatusRejected, wire.CodePolicyDenied)
}
