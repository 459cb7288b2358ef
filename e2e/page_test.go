package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
)

// chromium returns the path of an installed Chromium, or skips the test
// (.ci/run installs Debian's chromium, so CI never skips).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no Chromium installed (apt-get install chromium)")
	return ""
}

// browser starts a headless Chromium of its own (fresh profile, nothing
// fetched from the network) and returns a tab's context, and the console
// errors and uncaught exceptions the page has produced so far. extra adds
// command-line options (such as a host-resolver rule).
func browser(t *testing.T, extra ...chromedp.ExecAllocatorOption) (context.Context, func() []string) {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 1000),
	}
	opts = append(opts, extra...)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() }) // ends the browser it started
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	var mu sync.Mutex
	var errs []string
	cctx, stop := context.WithCancel(ctx)
	msgs := chromedp.Console(cctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				mu.Lock()
				errs = append(errs, m.String()+" at "+m.URL)
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { stop(); <-done })
	return ctx, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), errs...)
	}
}

// do runs chromedp actions with a deadline.
func do(t *testing.T, ctx context.Context, within time.Duration, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	if err := chromedp.Do(c, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// value runs one chromedp action that returns a value, with a deadline.
func value[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(c, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// until polls a JavaScript condition until it is true.
//
// When the page's execution context is replaced while it polls (Chromium
// answers "Cannot find context with specified id"; seen once in CI right
// after a navigation), it polls again in the new one until within.
func until(expr string, within time.Duration) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		deadline := time.Now().Add(within)
		for {
			_, err := chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(time.Until(deadline)))(ctx, tg)
			if err != nil && strings.Contains(err.Error(), "Cannot find context with specified id") && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			return chromedp.Void{}, err
		}
	}
}

// The status page in a real browser (headless Chromium driven over the
// DevTools protocol) against a running agent: it loads with no console
// error, shows a device's fence after a command, adds a new Result without
// a reload, resolves a held write on a device that cannot be asked through
// its confirm dialog, fits a phone-width screen, and is photographed.
func TestStatusPageInABrowser(t *testing.T) {
	held := pump("valve-1")
	held.queryable = false
	e := newEnv(t, pump("pump-7"), held)
	e.start()
	base := "http://" + e.app.AdminAddr()
	ctx, consoleErrors := browser(t)
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }

	do(t, ctx, 30*time.Second, "load the page",
		chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(css(`#devices tbody tr[data-device="pump-7"]`)),
		chromedp.WaitVisible(css(`#gw-state.good`)))
	value(t, ctx, "mark the page", chromedp.Evaluate[string](`window.__loadedOnce = "yes"`))

	// A command: the device's row shows its fence and holder, and the
	// Result appears in the live list, without a reload.
	c := cmd("op-1", 42, "set", `{"rpm":1200}`)
	c.Holder = "ctl-a"
	e.send("pump-7", c)
	want(t, e.final("op-1"), wire.StatusApplied, wire.CodeOK)
	do(t, ctx, 20*time.Second, "the device row after a command",
		chromedp.WaitVisible(css(`#live li[data-op="op-1"]`)),
		until(`document.querySelector('#devices tr[data-device="pump-7"] td:nth-child(2)').textContent === "42"`, 15*time.Second))
	holder := value(t, ctx, "holder", chromedp.Text(css(`#devices tr[data-device="pump-7"] td:nth-child(3)`)))
	if holder != "ctl-a" {
		t.Fatalf("pump-7's row: holder %q", holder)
	}
	e.send("pump-7", cmd("op-2", 42, "set", `{"rpm":900}`))
	want(t, e.final("op-2"), wire.StatusApplied, wire.CodeOK)
	do(t, ctx, 20*time.Second, "a new Result without a reload", chromedp.WaitVisible(css(`#live li[data-op="op-2"]`)))
	if same := value(t, ctx, "the mark", chromedp.Evaluate[string](`window.__loadedOnce || "reloaded"`)); same != "yes" {
		t.Fatal("the page was reloaded to show the new Result")
	}

	// A write whose answer is lost on valve-1 (queryable: false) is held
	// unknown; the operator resolves it "not applied" from the page.
	if err := e.sim.SetFaults(sim.Faults{Device: "valve-1", DropResponseRate: 1}); err != nil {
		t.Fatal(err)
	}
	e.send("valve-1", cmd("v-1", 5, "set", `{"rpm":30}`))
	want(t, e.result("v-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	if e.sim.Injected().Dropped == 0 {
		t.Fatal("the simulator dropped no answer")
	}
	e.sim.SetFaults(sim.Faults{})
	do(t, ctx, 30*time.Second, "resolve the held write",
		chromedp.WaitVisible(css(`#held tr[data-op="v-1"] button.resolve`)),
		chromedp.Click(css(`#held tr[data-op="v-1"] button.resolve`)),
		chromedp.WaitVisible(css(`#resolve-dialog[open] #resolve-not-applied`)),
		chromedp.Click(css(`#resolve-not-applied`)),
		chromedp.WaitNotPresent(css(`#held tr[data-op="v-1"]`)),
		chromedp.WaitVisible(css(`#held-none`)))
	want(t, e.final("v-1"), wire.StatusFailed, wire.CodeNotApplied)

	// The charts redraw from /v1/stats without a reload: the commands
	// above show up in commands/s.
	do(t, ctx, 20*time.Second, "the charts after the commands",
		chromedp.WaitVisible(css(`#live li[data-op="v-1"]`)),
		until(`document.querySelector("#chart-rate text").textContent !== "max 0 /s"`, 15*time.Second))

	keep := os.Getenv("EDGE_AGENT_SCREENSHOTS")
	if keep != "" {
		// For docs/: some traffic over a few seconds, a stale controller,
		// and a write left held for an operator.
		for i := 0; i < 60; i++ {
			op := fmt.Sprintf("load-%d", i)
			e.send("pump-7", cmd(op, 43, "set", fmt.Sprintf(`{"rpm":%d}`, 1000+i*10)))
			e.final(op)
			time.Sleep(80 * time.Millisecond) // traffic spread over time for the chart, not synchronisation
		}
		e.send("pump-7", cmd("late", 41, "set", `{"rpm":5}`))
		e.final("late")
		e.sim.SetFaults(sim.Faults{Device: "valve-1", DropResponseRate: 1})
		e.send("valve-1", cmd("v-2", 6, "set", `{"rpm":60}`))
		e.result("v-2", 1)
		do(t, ctx, 20*time.Second, "the held write and the charts",
			chromedp.WaitVisible(css(`#held tr[data-op="v-2"] button.resolve`)),
			chromedp.Sleep(2500*time.Millisecond)) // one more chart refresh, for the picture only
	}

	// Pictures: wide, then phone width (which must not scroll sideways).
	dir := t.TempDir()
	wide := value(t, ctx, "screenshot", chromedp.FullScreenshot(100))
	do(t, ctx, 10*time.Second, "phone width", chromedp.EmulateViewport(390, 844))
	if value(t, ctx, "overflow", chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth + 1`)) {
		t.Error("at 390 px wide the page scrolls sideways")
	}
	narrow := value(t, ctx, "screenshot", chromedp.FullScreenshot(100))
	for name, b := range map[string][]byte{"status-page.png": wide, "status-page-phone.png": narrow} {
		if len(b) < 10_000 || string(b[1:4]) != "PNG" {
			t.Fatalf("%s: %d bytes, not a PNG", name, len(b))
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		// EDGE_AGENT_SCREENSHOTS=DIR keeps them (docs/ is updated from it).
		if keep != "" {
			os.WriteFile(filepath.Join(keep, name), b, 0o644)
		}
	}
	t.Logf("screenshots in %s", dir)
	if errs := consoleErrors(); len(errs) > 0 {
		t.Fatalf("console errors:\n%s", strings.Join(errs, "\n"))
	}
}
