package e2e

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
)

// heldWrite makes valve-1 (queryable: false) hold its write v-1 unknown
// for an operator, and returns the started env.
func heldWrite(t *testing.T) *env {
	t.Helper()
	held := pump("valve-1")
	held.queryable = false
	e := newEnv(t, held)
	e.start()
	if err := e.sim.SetFaults(sim.Faults{Device: "valve-1", DropResponseRate: 1}); err != nil {
		t.Fatal(err)
	}
	e.send("valve-1", cmd("v-1", 5, "set", `{"rpm":30}`))
	want(t, e.result("v-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	e.sim.SetFaults(sim.Faults{})
	return e
}

// stillHeld fails the test unless v-1 is still unknown (no one resolved it).
func stillHeld(t *testing.T, e *env, after string) {
	t.Helper()
	code, b := e.admin("/v1/devices/valve-1/ops/v-1")
	var r wire.Result
	if code != http.StatusOK || json.Unmarshal(b, &r) != nil || r.Status != wire.StatusUnknown {
		t.Fatalf("after %s, v-1 is %d %s: a page resolved the held write", after, code, b)
	}
}

// A web page in a real browser cannot touch the admin API of an agent on
// the same host (default configuration: loopback, no token). A page of
// another origin (http://localhost:P) POSTs a resolve as a "simple"
// request (fetch with mode "no-cors": text/plain, no preflight), and a
// page whose host name rebinds to 127.0.0.1 (Chromium's host-resolver
// rule stands in for the DNS) reads the held writes and resolves one as
// its own origin: the held write stays held, and the rebound page reads
// nothing.
func TestAdminAPIRefusesOtherPagesInABrowser(t *testing.T) {
	e := heldWrite(t)
	_, port, _ := net.SplitHostPort(e.app.AdminAddr())
	ctx, _ := browser(t, chromedp.Flag("host-resolver-rules", "MAP evil.test 127.0.0.1"))

	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, "<!doctype html><title>a page</title><p>nothing to see</p>")
	}))
	defer evil.Close()
	_, evilPort, _ := net.SplitHostPort(evil.Listener.Addr().String())
	do(t, ctx, 20*time.Second, "open the other page", chromedp.Navigate("http://localhost:"+evilPort+"/"))
	value(t, ctx, "the cross-origin POST", chromedp.Evaluate[string](`window.__csrf = "";
		fetch("http://127.0.0.1:`+port+`/v1/devices/valve-1/ops/v-1/resolve",
			{method: "POST", mode: "no-cors", body: JSON.stringify({applied: true, state: {rpm: 0}})})
		.then(() => window.__csrf = "answered", err => window.__csrf = "error " + err); ""`))
	do(t, ctx, 20*time.Second, "the cross-origin POST answered", until(`window.__csrf !== ""`, 15*time.Second))
	if got := value(t, ctx, "outcome", chromedp.Evaluate[string](`window.__csrf`)); got != "answered" {
		t.Fatalf("the cross-origin POST did not reach the agent: %s", got)
	}
	stillHeld(t, e, "a cross-origin no-cors POST")

	// DNS rebinding: the page's origin is http://evil.test:<admin port>,
	// so its own requests reach the agent as same-origin ones.
	do(t, ctx, 20*time.Second, "open the rebound page", chromedp.Navigate("http://evil.test:"+port+"/"))
	value(t, ctx, "the rebound page's requests", chromedp.Evaluate[string](`window.__rb = "";
		(async () => {
			const r = await fetch("/v1/ops?status=unknown");
			const body = await r.text();
			const p = await fetch("/v1/devices/valve-1/ops/v-1/resolve",
				{method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({applied: true, state: {rpm: 0}})});
			window.__rb = JSON.stringify({read: r.status, body, resolve: p.status});
		})().catch(err => window.__rb = JSON.stringify({error: String(err)})); ""`))
	do(t, ctx, 20*time.Second, "the rebound page's requests answered", until(`window.__rb !== ""`, 15*time.Second))
	var rb struct {
		Read, Resolve int
		Body, Error   string
	}
	if err := json.Unmarshal([]byte(value(t, ctx, "outcome", chromedp.Evaluate[string](`window.__rb`))), &rb); err != nil || rb.Error != "" {
		t.Fatalf("the rebound page's requests: %v %s", err, rb.Error)
	}
	if rb.Read == http.StatusOK || strings.Contains(rb.Body, "v-1") {
		t.Errorf("the rebound page read the held writes: %d %s", rb.Read, rb.Body)
	}
	if rb.Resolve != http.StatusMisdirectedRequest {
		t.Errorf("the rebound page's resolve: %d, want %d", rb.Resolve, http.StatusMisdirectedRequest)
	}
	stillHeld(t, e, "a rebound page's POST")

	// The operator, from the agent's own origin, still can.
	resolve(t, e, "valve-1", "v-1", false)
	want(t, e.final("v-1"), wire.StatusFailed, wire.CodeNotApplied)
}

// The same rules over plain HTTP: a foreign Host is refused (421) on
// every endpoint but the probes and /metrics, a POST needs a JSON
// Content-Type (415) and no foreign Origin (403), and nothing may be
// framed.
func TestAdminAPIHostOriginContentType(t *testing.T) {
	e := heldWrite(t)
	base := "http://" + e.app.AdminAddr()
	// A bounded client: an events stream that is wrongly served never ends.
	hc := &http.Client{Timeout: 5 * time.Second}
	do := func(method, path, host, origin, ctype string) (*http.Response, string) {
		t.Helper()
		r, _ := http.NewRequest(method, base+path, strings.NewReader(`{"applied":true,"state":{"rpm":0}}`))
		if host != "" {
			r.Host = host
		}
		if origin != "" {
			r.Header.Set("Origin", origin)
		}
		if ctype != "" {
			r.Header.Set("Content-Type", ctype)
		}
		resp, err := hc.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		return resp, string(b)
	}
	const res = "/v1/devices/valve-1/ops/v-1/resolve"
	for _, tt := range []struct {
		method, path, host, origin, ctype string
		want                              int
	}{
		{"GET", "/v1/ops?status=unknown", "evil.test", "", "", http.StatusMisdirectedRequest},
		{"GET", "/", "evil.test:1", "", "", http.StatusMisdirectedRequest},
		{"GET", "/v1/events", "evil.test", "", "", http.StatusMisdirectedRequest},
		{"GET", "/healthz", "evil.test", "", "", http.StatusOK},
		{"POST", res, "evil.test", "", "application/json", http.StatusMisdirectedRequest},
		{"POST", res, "", "", "text/plain;charset=UTF-8", http.StatusUnsupportedMediaType},
		{"POST", res, "", "", "", http.StatusUnsupportedMediaType},
		{"POST", res, "", "http://localhost:8000", "application/json", http.StatusForbidden},
		{"POST", res, "", "null", "application/json", http.StatusForbidden},
		{"GET", "/v1/ops?status=unknown", "localhost", "", "", http.StatusOK},
	} {
		resp, body := do(tt.method, tt.path, tt.host, tt.origin, tt.ctype)
		if resp.StatusCode != tt.want {
			t.Errorf("%s %s Host %q Origin %q Content-Type %q: %d %s, want %d", tt.method, tt.path, tt.host, tt.origin, tt.ctype, resp.StatusCode, body, tt.want)
		}
		if resp.Header.Get("X-Frame-Options") != "DENY" || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
			t.Errorf("%s %s: framing allowed: X-Frame-Options %q, Content-Security-Policy %q", tt.method, tt.path,
				resp.Header.Get("X-Frame-Options"), resp.Header.Get("Content-Security-Policy"))
		}
	}
	stillHeld(t, e, "foreign requests")
	resp, body := do("POST", res, "", "http://"+e.app.AdminAddr(), "application/json")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the page's own resolve: %d %s", resp.StatusCode, body)
	}
	want(t, e.final("v-1"), wire.StatusApplied, wire.CodeOK)
}
