package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/chromedp/chromedp"
)

// chromiumPath resolves -browser: "off", "page" (no browser: the page's
// requests made from Go), a path, or "auto" (an installed Chromium, else
// "page").
func chromiumPath(flag string) string {
	switch flag {
	case "off", "":
		return ""
	case pageClient:
		return pageClient
	case "auto":
		for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
			if p, err := exec.LookPath(name); err == nil {
				return p
			}
		}
		return pageClient
	}
	return flag
}

// pageClient is -browser page: what the status page asks of the agent
// (its SSE stream, ?max_rate=10, read to the end; the tables every 3 s;
// the charts every 5 s) made from this process, without a browser's CPU on the same
// cores: the agent's own cost of serving one open page.
const pageClient = "page"

// openPageClient makes the status page's requests to admin until the
// returned func is called.
func openPageClient(admin string) (func(), error) {
	ctx, cancel := context.WithCancel(context.Background())
	base := "http://" + admin
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/events?max_rate=10", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
	}()
	go func() {
		defer wg.Done()
		get := func(path string) {
			r, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
			if resp, err := http.DefaultClient.Do(r); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
		// As the page does under load: the tables every 3 s (a debounced
		// refresh after events), the charts every 5 s.
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if i%3 == 0 {
				get("/v1/status")
				get("/v1/ops?status=unknown")
				get("/v1/devices")
			}
			if i%5 == 0 {
				get("/v1/stats?seconds=300")
			}
		}
	}()
	return func() { cancel(); wg.Wait() }, nil
}

// openBrowser starts a headless Chromium of its own on the agent's status
// page (admin is its admin address) and returns once the page's live feed
// (GET /v1/events) is connected; the returned func closes the browser.
func openBrowser(path, admin string) (func(), error) {
	// Its profile goes to memory when it can (/dev/shm), and it keeps no
	// disk cache: a browser writing its profile to the store's disk would
	// measure the disk, not the page.
	base := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		base = "/dev/shm"
	}
	dir, err := os.MkdirTemp(base, "edge-bench-chromium")
	if err != nil {
		return nil, err
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path), chromedp.UserDataDir(dir),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-extensions", true),
		chromedp.Flag("incognito", true), chromedp.Flag("disk-cache-size", "1"),
		chromedp.WindowSize(1280, 1000))
	ctx, cancelTab := chromedp.NewContext(actx)
	stop := func() { cancelTab(); cancelAlloc(); os.RemoveAll(dir) }
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		stop()
		return nil, fmt.Errorf("starting %s: %w", path, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	err = chromedp.Do(wctx, chromedp.Navigate("http://"+admin+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#devices tbody tr`)),
		func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
			_, err := chromedp.Poll[bool](`document.querySelector("#live-state").textContent === "live"`)(ctx, t)
			return chromedp.Void{}, err
		})
	if err != nil {
		stop()
		return nil, fmt.Errorf("the status page on %s: %w", admin, err)
	}
	return stop, nil
}

// browserCost measures the agent at n devices without and with one browser
// open on its status page, alternating rounds times, and returns a table
// row and the ratio of the medians.
func browserCost(broker string, n int, dur time.Duration, bins, dir, chromium string, rounds int) (string, error) {
	var without, with, cpuWithout, cpuWith []float64
	agentCPU := func(st stats) float64 {
		for i, name := range st.cpuNames {
			if name == "edge-agent" {
				return float64(st.cpuParts[i].Microseconds())
			}
		}
		return 0
	}
	for r := 0; r < rounds; r++ {
		for _, b := range []bool{false, true} {
			st, err := measure(broker, n, dur, target{bins: bins, kind: agentKind, dir: fmt.Sprintf("%s-b%d-%v", dir, r, b), browser: chromium, withBrowser: b})
			if err != nil {
				return "", fmt.Errorf("browser %v, round %d: %w", b, r, err)
			}
			fmt.Printf("%-8d %-12s %10.0f %9s %9s   browser open: %v\n         %s\n", n, "edge-agent", st.perSec, st.p50.Round(time.Microsecond), st.p99.Round(time.Microsecond), b, st.cpu)
			if b {
				with, cpuWith = append(with, st.perSec), append(cpuWith, agentCPU(st))
			} else {
				without, cpuWithout = append(without, st.perSec), append(cpuWithout, agentCPU(st))
			}
		}
	}
	mw, mb := median(without), median(with)
	ratio := mb / mw
	what := "one headless Chromium on the status page"
	if chromium == pageClient {
		what = "the status page's requests (no browser)"
	}
	cw, cb := median(cpuWithout), median(cpuWith)
	fmt.Printf("%s: %.0f cmds/s against %.0f without (median of %d): %.3f (%+.1f%%); agent CPU per command %.0f µs against %.0f\n",
		what, mb, mw, rounds, ratio, (ratio-1)*100, cb, cw)
	return fmt.Sprintf("| %s | %d | %s | %s | %.0f | %.0f | **%.3f** | %.0f / %.0f µs |", what, n, fmtRuns(without), fmtRuns(with), mw, mb, ratio, cw, cb), nil
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func fmtRuns(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%.0f", x)
	}
	return strings.Join(parts, ", ")
}

// openBrowser opens t.browser on the agent's status page at admin; the
// returned func closes it, then stops the agent (stop).
func (t target) openBrowser(admin string, stop func()) (func(), error) {
	open := func() (func(), error) { return openBrowser(t.browser, admin) }
	if t.browser == pageClient {
		open = func() (func(), error) { return openPageClient(admin) }
	}
	closeBrowser, err := open()
	if err != nil {
		stop()
		return nil, err
	}
	return func() { closeBrowser(); stop() }, nil
}
