package e2e

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// What an operator opening the status page after some traffic must see,
// in a real browser: the recent outcomes at load (from the history, before
// any new Result), a policy's rewrite, each device's state, whether it is
// reachable and when it last answered, a held write's reason and age,
// times in UTC, and a time axis under the charts. And the same through
// the admin API: GET /v1/devices/{dev}'s state, reachable and
// last_contact_at, the history's rewritten_params.
func TestStatusPageShowsWhatAnOperatorNeeds(t *testing.T) {
	dir := plugins(t)
	held := pump("pump-h")
	held.queryable = false
	gone := pump("pump-gone")
	gone.url = "http://" + testkit.FreeAddr(t) // nothing listens there
	valve := withPolicy(dev("valve-1", "valve"), "range-limit", `{param: open, min: 0, max: 80, clamp: true}`)
	e := newEnv(t, pump("pump-7"), valve, held, gone)
	e.extra = "plugins:\n  dir: " + dir + "\n"
	e.start()

	for i := range 50 {
		op := fmt.Sprintf("p-%d", i)
		e.send("pump-7", cmd(op, 7, "set", fmt.Sprintf(`{"rpm":%d}`, 1000+i)))
		want(t, e.final(op), wire.StatusApplied, wire.CodeOK)
	}
	e.send("valve-1", cmd("c1", 3, "set", `{"open":95}`))
	r := e.final("c1")
	want(t, r, wire.StatusApplied, wire.CodeOK)
	if string(r.RewrittenParams) != `{"open":80}` || string(r.Output) != `{"open":80}` {
		t.Fatalf("clamped write's Result: rewritten_params %s output %s", r.RewrittenParams, r.Output)
	}
	e.send("pump-gone", cmd("g1", 1, "set", `{"rpm":5}`))
	want(t, e.final("g1"), wire.StatusFailed, wire.CodeDeviceUnreachable)
	if err := e.sim.SetFaults(sim.Faults{Device: "pump-h", DropResponseRate: 1}); err != nil {
		t.Fatal(err)
	}
	e.send("pump-h", cmd("h1", 2, "set", `{"rpm":30}`))
	hr := e.result("h1", 1)
	want(t, hr, wire.StatusUnknown, wire.CodeOutcomeUnknown)
	e.sim.SetFaults(sim.Faults{})

	// The API.
	var info struct {
		State         map[string]any `json:"state"`
		Reachable     bool           `json:"reachable"`
		LastContactAt *time.Time     `json:"last_contact_at"`
		LastTryAt     *time.Time     `json:"last_try_at"`
	}
	devInfo := func(dev string) {
		t.Helper()
		info.State, info.Reachable, info.LastContactAt, info.LastTryAt = nil, false, nil, nil
		code, body := e.admin("/v1/devices/" + dev)
		if code != 200 || json.Unmarshal(body, &info) != nil {
			t.Fatalf("GET /v1/devices/%s: %d %s", dev, code, body)
		}
	}
	devInfo("pump-7")
	if info.State["rpm"] != 1049.0 || !info.Reachable || info.LastContactAt == nil || time.Since(*info.LastContactAt) > time.Minute {
		t.Fatalf("pump-7: state %v reachable %v last_contact_at %v", info.State, info.Reachable, info.LastContactAt)
	}
	devInfo("pump-gone")
	if info.Reachable || info.LastContactAt != nil || info.LastTryAt == nil {
		t.Fatalf("pump-gone (nothing listens): reachable %v last_contact_at %v last_try_at %v", info.Reachable, info.LastContactAt, info.LastTryAt)
	}
	var hist struct {
		Ops []struct {
			OpID            string          `json:"op_id"`
			Params          json.RawMessage `json:"params"`
			RewrittenParams json.RawMessage `json:"rewritten_params"`
		} `json:"ops"`
	}
	if code, body := e.admin("/v1/devices/valve-1/ops"); code != 200 || json.Unmarshal(body, &hist) != nil || len(hist.Ops) != 1 ||
		string(hist.Ops[0].Params) != `{"open":95}` || string(hist.Ops[0].RewrittenParams) != `{"open":80}` {
		t.Fatalf("valve-1's history: %d %s", code, body)
	}

	// The page.
	ctx, consoleErrors := browser(t)
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }
	do(t, ctx, 30*time.Second, "load the page",
		chromedp.Navigate("http://"+e.app.AdminAddr()+"/"),
		chromedp.WaitVisible(css(`#devices tbody tr[data-device="pump-7"]`)),
		until(`document.querySelectorAll("#live li").length >= 52`, 15*time.Second),
		chromedp.WaitVisible(css(`#held tr[data-op="h1"]`)),
		until(`document.querySelectorAll("#axis-rate span").length === 3`, 15*time.Second))
	text := func(sel string) string {
		t.Helper()
		return value(t, ctx, sel, chromedp.Text(css(sel)))
	}
	utcTime := regexp.MustCompile(`^\d\d:\d\d:\d\dZ$`)
	if s := text(`#live li[data-op="p-49"] span`); !utcTime.MatchString(s) {
		t.Errorf("a live outcome's time %q is not UTC hh:mm:ssZ", s)
	}
	if s := text(`#live li[data-op="c1"]`); !strings.Contains(s, `sent {"open":80} (policy rewrite)`) {
		t.Errorf("the clamped write in the live list: %q", s)
	}
	if s := text(`#live li[data-op="g1"]`); !strings.Contains(s, "device_unreachable") || !strings.Contains(s, "could not reach") {
		t.Errorf("the unreachable write in the live list: %q", s)
	}
	row := func(dev string, col int) string {
		return text(fmt.Sprintf(`#devices tr[data-device="%s"] td:nth-child(%d)`, dev, col))
	}
	if got := row("pump-7", 8); got != "yes" {
		t.Errorf("pump-7 reachable: %q", got)
	}
	if got := row("pump-7", 9); !strings.Contains(got, " ago (") || !strings.HasSuffix(got, "Z)") {
		t.Errorf("pump-7 last answer: %q", got)
	}
	if got := row("pump-7", 10); got != `{"rpm":1049}` {
		t.Errorf("pump-7 state: %q", got)
	}
	if got := row("pump-gone", 8); got != "no" {
		t.Errorf("pump-gone reachable: %q", got)
	}
	if got := row("valve-1", 10); got != `{"open":80}` {
		t.Errorf("valve-1 state: %q", got)
	}
	if got := text(`#held tr[data-op="h1"] .held-reason`); got != hr.Reason || got == "" {
		t.Errorf("held write's reason on the page %q, the Result's %q", got, hr.Reason)
	}
	if got := text(`#held tr[data-op="h1"] .held-age`); !regexp.MustCompile(`^\d+ s$|^\d+ min \d+ s$`).MatchString(got) {
		t.Errorf("held write's age: %q", got)
	}
	axisTime := regexp.MustCompile(`^\d\d:\d\d:\d\dZ( \(UTC\))?$`)
	for i := 1; i <= 3; i++ {
		if s := text(fmt.Sprintf(`#axis-rate span:nth-child(%d)`, i)); !axisTime.MatchString(s) {
			t.Errorf("chart axis label %d: %q", i, s)
		}
	}
	if errs := consoleErrors(); len(errs) > 0 {
		t.Errorf("console errors: %v", errs)
	}
}
