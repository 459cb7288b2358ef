package e2e

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// A cold start: with an empty compilation cache the Go plugins
// take seconds to compile. Meanwhile the agent process answers /healthz,
// /readyz says what it waits for ("compiling plugins N/M"), and commands
// wait, undecided, in the broker: they are decided afterwards by their
// loaded plugins (allowed, denied), never rejected policy_error for a
// plugin that was not there yet (invariant 5).
func TestColdStartAnswersHealthAndHoldsCommands(t *testing.T) {
	dir := plugins(t)
	e := newEnv(t,
		withPolicy(dev("pump-7", "pump"), "range-limit", `{param: rpm, min: 0, max: 3000}`),
		withPolicy(dev("pump-2", "pump"), "ramp-limit", `{param: rpm, max_step: 5000}`),
		withPolicy(dev("relay-1", "relay"), "allowlist", `{actions: [toggle]}`),
	)
	e.extra = "plugins:\n  dir: " + dir + "\n"
	e.adminAt = testkit.FreeAddr(t)
	// The first start makes the agent's broker session, so what is
	// published while it is down waits there.
	e.startProc()
	e.proc.Stop(syscall.SIGTERM, 30*time.Second)
	if err := os.RemoveAll(filepath.Join(e.dataDir, "wazero-cache")); err != nil {
		t.Fatal(err)
	}
	e.send("pump-7", cmd("before-ok", 1, "set", `{"rpm":1200}`))
	e.send("pump-7", cmd("before-deny", 1, "set", `{"rpm":4000}`))

	hc := &http.Client{Timeout: 5 * time.Second}
	get := func(path string) (int, string) {
		resp, err := hc.Get("http://" + e.adminAt + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	e.startProc()
	var compiling string
	testkit.Eventually(t, 60*time.Second, "/readyz saying that plugins compile", func() bool {
		code, body := get("/readyz")
		if code == http.StatusOK {
			t.Fatalf("ready before /readyz was seen saying that plugins compile (the cold compile was too fast to see?)")
		}
		if code == http.StatusServiceUnavailable && strings.HasPrefix(body, "not ready: compiling plugins ") {
			compiling = body
			return true
		}
		return false
	})
	// Still compiling: the process is healthy, the rest of the API is not
	// up yet, and nothing has been decided.
	if code, body := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz while compiling: %d %s", code, body)
	}
	for _, path := range []string{"/v1/devices", "/metrics"} {
		if code, body := get(path); code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "starting: ") {
			t.Fatalf("%s while compiling: %d %s", path, code, body)
		}
	}
	code, body := get("/readyz")
	if code != http.StatusServiceUnavailable {
		t.Fatalf("ready too soon to check that nothing was decided meanwhile: %d %s", code, body)
	}
	if n := e.res.count("before-ok") + e.res.count("before-deny"); n != 0 {
		t.Fatalf("%d Results while %q", n, body)
	}
	t.Logf("while compiling: %q, then %q", compiling, body)
	// One more arrives while the plugins compile.
	e.send("relay-1", cmd("during-deny", 1, "set", `{"on":true}`))

	testkit.Eventually(t, 60*time.Second, "/readyz 200", func() bool {
		code, _ := get("/readyz")
		return code == http.StatusOK
	})
	for op, want := range map[string]wire.Code{"before-ok": wire.CodeOK, "before-deny": wire.CodePolicyDenied, "during-deny": wire.CodePolicyDenied} {
		if r := e.final(op); r.Code != want {
			t.Errorf("%s: %s/%s (%s), want %s", op, r.Status, r.Code, r.Reason, want)
		}
	}
	if ops := e.journalOps(); len(ops) != 1 || ops[0] != "before-ok" {
		t.Fatalf("journal %v, want [before-ok]", ops)
	}
}
