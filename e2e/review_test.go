package e2e

// Regression tests for the defects an outside review reproduced.
// Each failed before its fix; keep them with attack_test.go's record.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/app"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// Defect 1 (invariant 4): a command on a device ID so long that the cmd
// topic is MQTT's largest (65,535 bytes) is answered unknown_device on the
// result topic, 3 bytes over the limit. The publisher took the refusal as
// transient and retried it at the head of its queue for ever: every later
// Result waited behind it. Now it is dropped, logged and counted, and the
// next command's Result arrives.
func TestUnpublishableAnswerDoesNotStallResults(t *testing.T) {
	e := newEnv(t, pump("pump-7"))
	a := e.start()
	head := wire.CmdTopic(wire.DefaultPrefix, gw, "")
	long := strings.Repeat("x", 65535-len(head))
	if n := len(wire.CmdTopic(wire.DefaultPrefix, gw, long)); n != 65535 {
		t.Fatalf("cmd topic is %d bytes", n)
	}
	b, _ := json.Marshal(cmd("lost-1", 1, "set", `{"rpm":1}`))
	tok := e.sender.Publish(wire.CmdTopic(wire.DefaultPrefix, gw, long), 1, false, b)
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish on the longest topic: %v", tok.Error())
	}
	e.send("pump-7", cmd("op-1", 1, "set", `{"rpm":100}`))
	want(t, e.final("op-1"), wire.StatusApplied, wire.CodeOK)
	e.send("pump-7", cmd("op-2", 1, "set", `{"rpm":200}`))
	want(t, e.final("op-2"), wire.StatusApplied, wire.CodeOK)
	// The fault happened: the answer was dropped as unpublishable.
	testkit.Eventually(t, 5*time.Second, "the unpublishable answer counted", func() bool {
		return metric(t, a, "edge_agent_results_unpublishable_total") >= 1
	})
}

// Defect 2: a queryable device that answers every apply 503 (not applied)
// and so every ops query "not applied": the worker resent by recursion,
// one stack frame per resend and no pause (503 resends in 2s were seen).
// Now resends loop with backoff and are bounded: after driver.resends the
// write ends failed/not_applied, which is recorded and never resent.
func TestResendsAreBoundedAndEndNotApplied(t *testing.T) {
	d := pump("pump-7")
	d.driver = "      resends: 3\n"
	e := newEnv(t, d)
	e.start()
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", ErrorRate: 1})
	e.send("pump-7", cmd("op-1", 5, "set", `{"rpm":300}`))
	want(t, e.result("op-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	r := e.final("op-1")
	want(t, r, wire.StatusFailed, wire.CodeNotApplied)
	if !strings.Contains(r.Reason, "driver.resends: 3") {
		t.Fatalf("reason %q does not name the limit", r.Reason)
	}
	if n := e.sim.Injected().Errors; n != 4 {
		t.Fatalf("the device saw %d tries, want 4 (the first and 3 resends)", n)
	}
	if n := len(e.journal()); n != 0 {
		t.Fatalf("journal has %d entries", n)
	}
	if n := e.res.count("op-1"); n != 2 {
		t.Fatalf("%d Results for op-1, want unknown once and the final once", n)
	}
	// Recorded and final: a resend is answered from the record, not sent.
	setFaults(t, e.sim, sim.Faults{})
	e.send("pump-7", cmd("op-1", 5, "set", `{"rpm":300}`))
	if r := e.result("op-1", 3); !r.Duplicate || r.Code != wire.CodeNotApplied {
		t.Fatalf("resend: %+v", r)
	}
	e.send("pump-7", cmd("op-2", 5, "set", `{"rpm":400}`))
	want(t, e.final("op-2"), wire.StatusApplied, wire.CodeOK)
	if got := strings.Join(e.journalOps(), ","); got != "op-2" {
		t.Fatalf("journal %s", got)
	}
}

// Defect 2, the other bound: expires_at. The resends back off, so a
// command that expires in a second ends expired after a few tries, not
// hundreds.
func TestResendsStopAtExpiry(t *testing.T) {
	e := newEnv(t, pump("pump-7"))
	e.start()
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", ErrorRate: 1})
	c := cmd("op-1", 5, "set", `{"rpm":300}`)
	exp := time.Now().Add(time.Second)
	c.ExpiresAt = &exp
	e.send("pump-7", c)
	r := e.final("op-1")
	want(t, r, wire.StatusRejected, wire.CodeExpired)
	// Backoff from 200ms: at most a handful of tries fit in the second.
	if n := e.sim.Injected().Errors; n < 1 || n > 6 {
		t.Fatalf("the device saw %d tries within a second of expiry; want 1..6", n)
	}
}

// Defect 3 (invariant 6): a device moved out of a group (the group kept)
// while it had an unknown write. Recovery routed the write by the worker
// stored in the inbox (the group's), and the device's new lone worker sent
// its next command at once: b-2 applied while b-1 was unknown.
func TestRecoveryRoutesByTheDevicesCurrentWorker(t *testing.T) {
	a, b := pump("a"), pump("b")
	a.group, b.group = "g", "g"
	b.queryable, b.timeout = false, "300ms"
	e := newEnv(t, a, b)
	e.start()
	setFaults(t, e.sim, sim.Faults{Device: "b", Hang: true})
	e.send("b", cmd("b-1", 1, "set", `{"rpm":100}`))
	want(t, e.result("b-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	if e.sim.Injected().Held == 0 {
		t.Fatal("no apply was held: the fault did not happen")
	}
	e.stop()
	setFaults(t, e.sim, sim.Faults{})

	e.devs[1].group = "" // b leaves the group; a stays in it
	e.start()
	e.send("b", cmd("b-2", 2, "set", `{"rpm":200}`))
	// b-2 waits behind the held b-1 in b's own queue.
	testkit.Eventually(t, 10*time.Second, "b-1 and b-2 both in b's queue", func() bool {
		_, body := e.admin("/v1/devices/b")
		var di wire.DeviceInfo
		return json.Unmarshal(body, &di) == nil && di.QueueDepth == 2
	})
	if n := len(e.journal()); n != 0 || e.res.count("b-2") != 0 {
		t.Fatalf("b-2 went on while b-1 was unknown: journal %v", e.journalOps())
	}
	resolve(t, e, "b", "b-1", false)
	want(t, e.final("b-1"), wire.StatusFailed, wire.CodeNotApplied)
	want(t, e.final("b-2"), wire.StatusApplied, wire.CodeOK)
	if got := strings.Join(e.journalOps(), ","); got != "b-2" {
		t.Fatalf("journal %s", got)
	}
}

// Defect 3: a device removed while its group stays. An unresolved write
// of it made every start panic (nil pointer in the worker's checks); now
// the start is refused with a configuration error naming the device, and
// a queued command of a removed device is answered unknown_device.
func TestRecoveryOfARemovedDevice(t *testing.T) {
	a, b := pump("a"), pump("b")
	a.group, b.group = "g", "g"
	a.queryable, a.timeout = false, "300ms"
	e := newEnv(t, a, b)
	e.start()
	// a-1 is held unknown (a cannot be asked); b-1 waits behind it in the
	// group's queue.
	setFaults(t, e.sim, sim.Faults{Device: "a", Hang: true})
	e.send("a", cmd("a-1", 1, "set", `{"rpm":100}`))
	want(t, e.result("a-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	if e.sim.Injected().Held == 0 {
		t.Fatal("no apply was held: the fault did not happen")
	}
	e.send("b", cmd("b-1", 1, "set", `{"rpm":100}`))
	testkit.Eventually(t, 10*time.Second, "b-1 queued in the group", func() bool {
		_, body := e.admin("/v1/devices/b")
		var di wire.DeviceInfo
		return json.Unmarshal(body, &di) == nil && di.QueueDepth == 2
	})
	e.stop()
	setFaults(t, e.sim, sim.Faults{})

	// Without a (its write unresolved): refused, naming a.
	devs := e.devs
	e.devs = devs[1:]
	cfg, err := config.Load(e.writeConfig())
	if err != nil {
		t.Fatal(err)
	}
	ap := app.New(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	err = ap.Start(context.Background())
	if err == nil {
		ap.Stop(context.Background())
		t.Fatal("started although a's unknown write can no longer be resolved")
	}
	if !errors.Is(err, app.ErrConfig) || !strings.Contains(err.Error(), "a (op a-1, unknown)") {
		t.Fatalf("start error %v: want a configuration error naming a and a-1", err)
	}

	// Without b (only queued): b-1 is answered unknown_device; a-1 still held.
	e.devs = devs[:1]
	e.start()
	r := e.final("b-1")
	want(t, r, wire.StatusRejected, wire.CodeUnknownDevice)
	if !strings.Contains(r.Reason, "no longer configured") {
		t.Fatalf("reason %q", r.Reason)
	}
	resolve(t, e, "a", "a-1", false)
	want(t, e.final("a-1"), wire.StatusFailed, wire.CodeNotApplied)
	if n := len(e.journal()); n != 0 {
		t.Fatalf("journal %v", e.journalOps())
	}
}

// Defect 3, devices joined into one group while each had an unresolved
// write: they are resolved before anything else of the group, the held
// one on a device that cannot be asked first, and the other is asked
// about (not resent) while that one is held.
func TestRecoveryOfTwoUnresolvedWritesInANewGroup(t *testing.T) {
	a, b := pump("a"), pump("b")
	b.queryable, b.timeout = false, "300ms"
	e := newEnv(t, a, b)
	e.startProc("EDGE_AGENT_CRASH=after_write:a-1")
	setFaults(t, e.sim, sim.Faults{Device: "b", Hang: true})
	e.send("b", cmd("b-1", 1, "set", `{"rpm":100}`))
	want(t, e.result("b-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	e.send("a", cmd("a-1", 1, "set", `{"rpm":100}`))
	if code := e.waitExit(20 * time.Second); code != -1 || !strings.Contains(e.log(), "SIGKILL at crash point after_write op_id a-1") {
		t.Fatalf("agent exited %d, want killed at the crash point:\n%s", code, e.log())
	}
	if e.sim.Injected().Held == 0 {
		t.Fatal("no apply was held: the fault did not happen")
	}
	setFaults(t, e.sim, sim.Faults{})

	e.devs[0].group, e.devs[1].group = "g", "g"
	e.start()
	// a-1 was applied before the crash: asked about, it ends applied
	// while b-1 is still held.
	want(t, e.final("a-1"), wire.StatusApplied, wire.CodeOK)
	e.send("a", cmd("a-2", 2, "set", `{"rpm":200}`))
	testkit.Eventually(t, 10*time.Second, "a-2 queued behind b-1", func() bool {
		_, body := e.admin("/v1/devices/a")
		var di wire.DeviceInfo
		return json.Unmarshal(body, &di) == nil && di.QueueDepth == 2
	})
	if got := strings.Join(e.journalOps(), ","); got != "a-1" {
		t.Fatalf("journal %s while b-1 is held", got)
	}
	resolve(t, e, "b", "b-1", false)
	want(t, e.final("a-2"), wire.StatusApplied, wire.CodeOK)
	if got := strings.Join(e.journalOps(), ","); got != "a-1,a-2" {
		t.Fatalf("journal %s", got)
	}
}

// Defect 4 (docs/protocol.md §1: an unknown outcome is recorded and published):
// a write recovered as pending is resent; when the resend ended unknown,
// nothing was published, because the recovery had already marked the op
// "was unknown".
func TestRecoveredWriteThatEndsUnknownIsPublished(t *testing.T) {
	e := newEnv(t, pump("pump-7"))
	e.startProc("EDGE_AGENT_CRASH=after_pending:op-1")
	e.send("pump-7", cmd("op-1", 7, "set", `{"rpm":700}`))
	if code := e.waitExit(20 * time.Second); code != -1 || !strings.Contains(e.log(), "SIGKILL at crash point") {
		t.Fatalf("agent exited %d, want killed at the crash point:\n%s", code, e.log())
	}
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", ErrorRate: 1})
	e.startProc()
	want(t, e.result("op-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	if e.sim.Injected().Errors == 0 {
		t.Fatal("the resend was not answered 503: the fault did not happen")
	}
	setFaults(t, e.sim, sim.Faults{})
	want(t, e.final("op-1"), wire.StatusApplied, wire.CodeOK)
	if got := strings.Join(e.journalOps(), ","); got != "op-1" {
		t.Fatalf("journal %s", got)
	}
}

// Defect 5 (invariant 2): a queryable device whose ops route answers a
// plain 404 (no "applied": false). It was read as a tombstone and the
// write resent under a new key: a possible second apply. Now the write
// stays unknown, and the agent keeps asking; once the device gives the
// explicit answer, it is resolved. The misconfigured device is the real
// simulator behind a proxy that answers ops queries with a plain 404.
func TestPlain404IsNoTombstone(t *testing.T) {
	d := pump("pump-7")
	e := newEnv(t, d)
	target, _ := url.Parse(e.sim.URL())
	rp := httputil.NewSingleHostReverseProxy(target)
	var plain atomic.Bool
	var plainAnswers atomic.Int64
	plain.Store(true)
	px := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if plain.Load() && strings.Contains(r.URL.Path, "/ops/") {
			plainAnswers.Add(1)
			http.NotFound(w, r)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(px.Close)
	e.devs[0].url = px.URL
	e.start()
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", ErrorRate: 1})
	e.send("pump-7", cmd("op-1", 3, "set", `{"rpm":300}`))
	want(t, e.result("op-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	testkit.Eventually(t, 10*time.Second, "three plain 404s", func() bool { return plainAnswers.Load() >= 3 })
	if n := e.sim.Injected().Errors; n != 1 {
		t.Fatalf("the write was sent %d times after plain 404s, want once", n)
	}
	setFaults(t, e.sim, sim.Faults{})
	plain.Store(false)
	want(t, e.final("op-1"), wire.StatusApplied, wire.CodeOK)
	j := e.journal()
	if len(j) != 1 || !strings.HasPrefix(j[0].Key, "op-1.2.") {
		t.Fatalf("journal %+v: want op-1 once, under its second key", j)
	}
}

// resolve answers for an unknown write through the admin API.
func resolve(t *testing.T, e *env, dev, op string, applied bool) {
	t.Helper()
	body := `{"applied":false}`
	if applied {
		body = `{"applied":true}`
	}
	// On a device that is read back, the agent records why it holds the
	// write just before it takes the hold (the record must be durable
	// first): an operator who read the record in that gap is told 409
	// "queryable" and asks again, as this does, for a while.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Post("http://"+e.app.AdminAddr()+"/v1/devices/"+dev+"/ops/"+op+"/resolve", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusOK:
			return
		case resp.StatusCode == http.StatusConflict && strings.Contains(string(b), "queryable") && time.Now().Before(deadline):
			time.Sleep(20 * time.Millisecond) // polling the hold, with the deadline above
		default:
			t.Fatalf("resolve %s/%s: %d %s", dev, op, resp.StatusCode, b)
		}
	}
}

// metric reads one unlabelled series from the agent's /metrics.
func metric(t *testing.T, a *app.App, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + a.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			var f float64
			json.Unmarshal([]byte(v), &f)
			return f
		}
	}
	return -1
}
