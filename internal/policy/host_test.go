package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/testkit"
)

// TestManyDevicesShareOnePlugin: 24 devices bind one file (two configs),
// evaluated from 8 goroutines at once (run with -race). The file is
// compiled once, devices with the same config share one pool, and every
// decision is right.
func TestManyDevicesShareOnePlugin(t *testing.T) {
	h := newTestHost(t, HostOptions{CacheDir: sharedCache(t)})
	for i := 0; i < 24; i++ {
		max := 3000
		if i%2 == 1 {
			max = 1000
		}
		h.bind(t, fmt.Sprintf("pump-%d", i), "range-limit", fmt.Sprintf(`{"param":"rpm","max":%d}`, max))
	}
	h.start(t)
	if n := len(h.plugins); n != 1 {
		t.Fatalf("%d compiled plugins, want 1", n)
	}
	pools := map[*pool]bool{}
	for _, p := range h.table.Load().pools {
		pools[p] = true
	}
	if len(pools) != 2 {
		t.Fatalf("%d pools, want 2 (one per config)", len(pools))
	}
	var wg sync.WaitGroup
	var calls atomic.Int64
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 60; i++ {
				n := (g*7 + i) % 24
				dev := fmt.Sprintf("pump-%d", n)
				rpm := 500 + 200*(i%15) // 500 .. 3300
				d, err := h.Evaluate(context.Background(), dev, cmd(dev, "set", fmt.Sprintf(`{"rpm":%d}`, rpm)))
				if err != nil {
					t.Errorf("%s: %v", dev, err)
					return
				}
				max := 3000
				if n%2 == 1 {
					max = 1000
				}
				if d.Allow != (rpm <= max) {
					t.Errorf("%s rpm %d: allow=%v (%s)", dev, rpm, d.Allow, d.Reason)
				}
				calls.Add(1)
			}
		}()
	}
	wg.Wait()
	for p := range pools {
		if n := len(p.sem); n > p.lim.Instances {
			t.Fatalf("pool has %d instances, limit %d", n, p.lim.Instances)
		}
	}
	t.Logf("%d calls", calls.Load())
}

// TestUnboundAndLifecycle: an unbound device is allowed unchanged; calls
// before Start and after Close fail; Close is idempotent.
func TestUnboundAndLifecycle(t *testing.T) {
	h := NewHost(HostOptions{Logger: quiet})
	ctx := context.Background()
	if _, err := h.Evaluate(ctx, "x", cmd("x", "set", "")); !errors.Is(err, ErrNotStarted) {
		t.Fatalf("before Start: %v", err)
	}
	if err := h.Reload(ctx); !errors.Is(err, ErrNotStarted) {
		t.Fatalf("Reload before Start: %v", err)
	}
	if err := h.Bind("", Binding{Path: "x"}); !errors.Is(err, ErrBinding) {
		t.Fatalf("Bind empty device: %v", err)
	}
	if err := h.Bind("d", Binding{Path: "x", Config: json.RawMessage(`{`)}); !errors.Is(err, ErrBinding) {
		t.Fatalf("Bind bad config: %v", err)
	}
	if err := h.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.Start(ctx); !errors.Is(err, ErrStarted) {
		t.Fatalf("second Start: %v", err)
	}
	d, err := h.Evaluate(ctx, "unbound", cmd("unbound", "set", `{"rpm":99999}`))
	if err != nil || !d.Allow || d.Params != nil {
		t.Fatalf("unbound device: %+v %v", d, err)
	}
	if err := h.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := h.Evaluate(ctx, "unbound", cmd("unbound", "set", "")); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	if err := h.Reload(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Reload after Close: %v", err)
	}
}

func copyFile(t testing.TB, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// currentDigest returns the digest of the plugin version devices of path use.
func (h *testHost) currentFile(path string) [32]byte {
	h.reloadMu.Lock()
	defer h.reloadMu.Unlock()
	for k, p := range h.plugins {
		if k.path == path {
			return p.digest
		}
	}
	return [32]byte{}
}

func digestOf(t testing.TB, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256Sum(b)
}

// TestReloadWhileCallsFlow: the plugin file is replaced (Go <-> C
// range-limit, same config) and reloaded several times while 4 goroutines
// evaluate without pause. No call fails because of a reload, every
// decision is right, and the old versions are released.
func TestReloadWhileCallsFlow(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "range-limit.wasm")
	versions := []string{pluginPath(t, "range-limit"), pluginPath(t, "range-limit-c")}
	copyFile(t, versions[0], path)
	h := newTestHost(t, HostOptions{CacheDir: sharedCache(t)})
	for i := 0; i < 4; i++ {
		if err := h.Bind(fmt.Sprintf("pump-%d", i), Binding{Path: path, Config: json.RawMessage(`{"param":"rpm","max":3000}`)}); err != nil {
			t.Fatal(err)
		}
	}
	h.start(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var calls, failures atomic.Int64
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dev := fmt.Sprintf("pump-%d", g)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				rpm := 2000 + 1000*(i%3) // 2000, 3000, 4000
				d, err := h.Evaluate(context.Background(), dev, cmd(dev, "set", fmt.Sprintf(`{"rpm":%d}`, rpm)))
				calls.Add(1)
				if err != nil || d.Allow != (rpm <= 3000) {
					failures.Add(1)
					t.Errorf("%s rpm %d: %+v %v", dev, rpm, d, err)
				}
			}
		}()
	}
	var old []*plugin
	for i := 1; i <= 6; i++ {
		time.Sleep(20 * time.Millisecond)
		h.reloadMu.Lock()
		for _, p := range h.plugins {
			old = append(old, p)
		}
		h.reloadMu.Unlock()
		copyFile(t, versions[i%2], path)
		if err := h.Reload(context.Background()); err != nil {
			t.Fatalf("Reload %d: %v", i, err)
		}
		if h.currentFile(path) != digestOf(t, versions[i%2]) {
			t.Fatalf("Reload %d did not switch versions", i)
		}
	}
	time.Sleep(20 * time.Millisecond)
	close(stop)
	wg.Wait()
	if failures.Load() > 0 || calls.Load() < 100 {
		t.Fatalf("%d calls, %d failures", calls.Load(), failures.Load())
	}
	for i, p := range old {
		p.mu.Lock()
		refs := p.refs
		p.mu.Unlock()
		if refs != 0 {
			t.Errorf("replaced version %d still has %d references", i, refs)
		}
	}
	if got := h.counter(t, h.m.reloads, "range-limit", "ok"); got != 6 {
		t.Errorf("reloads counted: %v", got)
	}
	t.Logf("%d calls during 6 reloads", calls.Load())
}

// TestBrokenReplacementRefused: a broken file, or one whose policy_init
// rejects a device's config, is refused at Reload (error returned and
// logged); the devices keep the old version, which keeps working.
func TestBrokenReplacementRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "p.wasm")
	copyFile(t, pluginPath(t, "range-limit-c"), path)
	h := newTestHost(t, HostOptions{CacheDir: sharedCache(t)})
	if err := h.Bind("pump-1", Binding{Plugin: "p", Path: path, Config: json.RawMessage(`{"param":"rpm","max":3000}`)}); err != nil {
		t.Fatal(err)
	}
	h.start(t)
	good := h.currentFile(path)
	ctx := context.Background()
	works := func() {
		t.Helper()
		d, err := h.Evaluate(ctx, "pump-1", cmd("pump-1", "set", `{"rpm":4000}`))
		if err != nil || d.Allow || d.Reason != "rpm 4000 above max 3000" {
			t.Fatalf("old version: %+v %v", d, err)
		}
	}
	for _, c := range []struct {
		name    string
		content func()
		want    error
	}{
		{"truncated", func() {
			b, _ := os.ReadFile(pluginPath(t, "range-limit-c"))
			os.WriteFile(path, b[:len(b)/2], 0o644)
		}, ErrInvalidModule},
		{"missing export", func() { copyFile(t, pluginPath(t, "no_eval"), path) }, ErrMissingExport},
		{"rejects the config", func() { copyFile(t, pluginPath(t, "init_reject"), path) }, ErrConfigRejected},
		{"deleted", func() { os.Remove(path) }, ErrRead},
	} {
		c.content()
		err := h.Reload(ctx)
		var le *LoadError
		if !errors.As(err, &le) || !errors.Is(err, c.want) {
			t.Fatalf("%s: Reload = %v, want a *LoadError wrapping %v", c.name, err, c.want)
		}
		if h.currentFile(path) != good {
			t.Fatalf("%s: the broken version was swapped in", c.name)
		}
		works()
	}
	mustContain(t, h.logs.String(), "reload failed; keeping the previous version")
	if got := h.counter(t, h.m.reloads, "p", "error"); got != 4 {
		t.Errorf("failed reloads counted: %v", got)
	}
	// A good file is taken again.
	copyFile(t, pluginPath(t, "range-limit"), path)
	if err := h.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if h.currentFile(path) == good {
		t.Fatal("the good replacement was not taken")
	}
	works()
}

// TestNewBindingThatFailsFailsClosed: a device bound after Start to a
// plugin that does not load gets errors, not a free pass.
func TestNewBindingThatFailsFailsClosed(t *testing.T) {
	h := newTestHost(t, HostOptions{CacheDir: sharedCache(t)})
	h.bind(t, "a", "allowlist", `{"actions":["set"]}`)
	h.start(t)
	h.bind(t, "b", "init_reject", "")
	if err := h.Reload(context.Background()); !errors.Is(err, ErrConfigRejected) {
		t.Fatalf("Reload = %v", err)
	}
	if _, err := h.Evaluate(context.Background(), "b", cmd("b", "set", "")); !errors.Is(err, ErrNotLoaded) {
		t.Fatalf("Evaluate on a device whose plugin failed to load = %v, want ErrNotLoaded", err)
	}
	if d, err := h.Evaluate(context.Background(), "a", cmd("a", "set", "")); err != nil || !d.Allow {
		t.Fatalf("the other device: %+v %v", d, err)
	}
	// Unbinding it makes it an unbound device again.
	h.Unbind("b")
	if err := h.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d, err := h.Evaluate(context.Background(), "b", cmd("b", "set", "")); err != nil || !d.Allow {
		t.Fatalf("unbound: %+v %v", d, err)
	}
}

// TestWatchReloads: Watch notices a changed file and reloads it.
func TestWatchReloads(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "p.wasm")
	copyFile(t, pluginPath(t, "range-limit-c"), path)
	h := newTestHost(t, HostOptions{CacheDir: sharedCache(t), WatchInterval: 20 * time.Millisecond})
	if err := h.Bind("pump-1", Binding{Path: path, Config: json.RawMessage(`{"param":"rpm","max":3000}`)}); err != nil {
		t.Fatal(err)
	}
	h.start(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Watch(ctx) }()
	copyFile(t, pluginPath(t, "range-limit"), path)
	want := digestOf(t, path)
	testkit.Eventually(t, 20*time.Second, "Watch reloads the changed file", func() bool { return h.currentFile(path) == want })
	// A broken file is reported once and kept out (written atomically, so
	// that Watch sees one change).
	os.WriteFile(path+".tmp", []byte("broken"), 0o644)
	os.Rename(path+".tmp", path)
	testkit.Eventually(t, 20*time.Second, "Watch tries the broken file", func() bool {
		return h.counter(t, h.m.reloads, "p", "error") >= 1
	})
	if h.currentFile(path) != want {
		t.Fatal("the broken file was swapped in")
	}
	time.Sleep(100 * time.Millisecond)
	if got := h.counter(t, h.m.reloads, "p", "error"); got != 1 {
		t.Fatalf("the unchanged broken file was retried: %v failures", got)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch = %v", err)
	}
}

// TestWarmCacheStart: a second start with the same cache directory does
// not recompile: nothing new is written to the cache, and loading takes a
// fraction of the cold compile. (Two plugins, Go and C, to keep the cold
// compile short under -race; BenchmarkStartup measures all six.)
func TestWarmCacheStart(t *testing.T) {
	cache := t.TempDir()
	start := func() (time.Duration, map[string]time.Duration) {
		h := newTestHost(t, HostOptions{CacheDir: cache})
		h.bind(t, "pump-1", "range-limit", `{"param":"rpm","min":0,"max":3000}`)
		h.bind(t, "pump-5", "range-limit-c", `{"param":"rpm","min":0,"max":3000}`)
		t0 := time.Now()
		h.start(t)
		took := time.Since(t0)
		per := map[string]time.Duration{}
		for k, p := range h.plugins {
			per[filepath.Base(k.path)] = p.took
		}
		if err := h.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		return took, per
	}
	cold, coldPer := start()
	before := cacheFiles(t, cache)
	warm, warmPer := start()
	after := cacheFiles(t, cache)
	if len(before) == 0 {
		t.Fatal("nothing was written to the cache")
	}
	for f, mod := range after {
		if m0, ok := before[f]; !ok || !m0.Equal(mod) {
			t.Errorf("cache file %s written by the warm start: recompiled", f)
		}
	}
	for f, c := range coldPer {
		t.Logf("%s: cold %v, warm %v", f, c, warmPer[f])
	}
	t.Logf("start-up: cold %v, warm %v", cold, warm)
	if warm > cold/2 {
		t.Errorf("warm start %v is not much faster than cold %v", warm, cold)
	}
}

func bindExamples(t testing.TB, h *testHost) {
	h.bind(t, "pump-1", "range-limit", `{"param":"rpm","min":0,"max":3000}`)
	h.bind(t, "pump-2", "ramp-limit", `{"param":"rpm","max_step":200}`)
	h.bind(t, "valve-1", "interlock", `{"pump":"pump-1","valve":"valve-1"}`)
	h.bind(t, "pump-3", "allowlist", `{"actions":["set","stop"]}`)
	h.bind(t, "pump-4", "time-window", `{"actions":["flush"],"start":"22:00","end":"06:00"}`)
	h.bind(t, "pump-5", "range-limit-c", `{"param":"rpm","min":0,"max":3000}`)
}

func cacheFiles(t testing.TB, dir string) map[string]time.Time {
	out := map[string]time.Time{}
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			out[p] = fi.ModTime()
		}
		return nil
	})
	return out
}

// TestTestOnce: the function behind `edge-agent policy test` (through
// testOnce, to share the tests' compilation cache).
func TestTestOnce(t *testing.T) {
	ctx := context.Background()
	plugin := pluginPath(t, "range-limit")
	cfg := []byte(`{"param":"rpm","max":3000,"clamp":true}`)
	d, took, err := testOnce(ctx, plugin, []byte(`{"op_id":"a","fence":3,"action":"set","params":{"rpm":4000},"reply_to":"x/y"}`), nil, cfg, sharedCache(t), nil)
	if err != nil || !d.Allow || string(d.Params) != `{"rpm":3000}` || took <= 0 {
		t.Fatalf("command: %+v %v %v", d, took, err)
	}
	// A whole input document, with a group view.
	doc := `{"device":{"id":"valve-1","type":"valve"},"command":{"op_id":"a","fence":3,"action":"set","params":{"open":1}},
	         "state":{},"group":{"pump-1":{"rpm":1200}},"last_fence":2,"now":"2026-11-30T10:00:00Z"}`
	d, _, err = testOnce(ctx, pluginPath(t, "interlock"), []byte(doc), nil, []byte(`{"pump":"pump-1","valve":"valve-1"}`), sharedCache(t), nil)
	if err != nil || d.Allow || d.Reason != "valve-1 may not open while pump-1 runs (rpm 1200)" {
		t.Fatalf("document: %+v %v", d, err)
	}
	// State from its own file.
	d, _, err = testOnce(ctx, pluginPath(t, "ramp-limit"), []byte(`{"op_id":"a","fence":3,"action":"set","params":{"rpm":2000}}`),
		[]byte(`{"rpm":1000}`), []byte(`{"param":"rpm","max_step":200}`), sharedCache(t), nil)
	if err != nil || d.Allow {
		t.Fatalf("state: %+v %v", d, err)
	}
	var le *LoadError
	if _, _, err := testOnce(ctx, plugin, []byte(`{"action":"set"}`), nil, []byte(`{"param":"rpm"}`), sharedCache(t), nil); !errors.As(err, &le) {
		t.Fatalf("bad config: %v, want *LoadError", err)
	}
	var ee *EvalError
	if _, _, err := testOnce(ctx, pluginPath(t, "trap"), []byte(`{"action":"set"}`), nil, nil, sharedCache(t), nil); !errors.As(err, &ee) {
		t.Fatalf("trap: %v, want *EvalError", err)
	}
	if _, _, err := testOnce(ctx, plugin, []byte(`{"action":`), nil, cfg, sharedCache(t), nil); err == nil || errors.As(err, &le) || errors.As(err, &ee) {
		t.Fatalf("bad command JSON: %v", err)
	}
}

// TestStartProgress: Progress counts the plugin files Start compiles (once
// per file, however many devices and configs bind it), says Ready once
// Start has succeeded, and no longer after Close; a failed Start is not
// Ready. (The agent's /readyz reports it while plugins compile:
// e2e.TestColdStartAnswersHealthAndHoldsCommands.)
func TestStartProgress(t *testing.T) {
	h := newTestHost(t, HostOptions{CacheDir: sharedCache(t)})
	if p := h.Progress(); p != (Progress{}) {
		t.Fatalf("before Start: %+v", p)
	}
	h.bind(t, "pump-1", "range-limit", `{"param":"rpm","max":3000}`)
	h.bind(t, "pump-2", "range-limit", `{"param":"rpm","max":1000}`)
	h.bind(t, "pump-5", "range-limit-c", `{"param":"rpm","max":3000}`)
	h.start(t)
	if p := h.Progress(); p != (Progress{Compiled: 2, Total: 2, Ready: true}) {
		t.Fatalf("after Start: %+v", p)
	}
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if p := h.Progress(); p.Ready {
		t.Fatalf("after Close: %+v", p)
	}

	bad := newTestHost(t, HostOptions{CacheDir: sharedCache(t)})
	bad.bind(t, "pump-1", "range-limit", `{"param":"rpm","max":3000}`)
	if err := bad.Bind("pump-9", Binding{Path: filepath.Join(t.TempDir(), "missing.wasm")}); err != nil {
		t.Fatal(err)
	}
	if err := bad.Start(context.Background()); err == nil {
		t.Fatal("Start with a missing plugin succeeded")
	}
	if p := bad.Progress(); p.Ready || p.Total != 2 || p.Compiled != 2 {
		t.Fatalf("after a failed Start: %+v, want 2/2 looked at, not ready", p)
	}
}
