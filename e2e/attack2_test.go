package e2e

// Adversarial tests of the reworked command path (attack round 2). Each
// TestAttack2* drives one sequence of events against real parts (mosquitto,
// firmware-sim, bbolt, the agent) that breaks a rule of docs/protocol.md §1 or
// an invariant of docs/design.md; the comment above each says which, and why.

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// devProxy stands between the agent and the simulator: hook sees every
// request first and may answer it itself (return true); anything else is
// forwarded to the simulator unchanged.
func devProxy(t *testing.T, e *env, hook func(w http.ResponseWriter, r *http.Request) bool) string {
	t.Helper()
	target, err := url.Parse(e.sim.URL())
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	px := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hook != nil && hook(w, r) {
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(px.Close)
	return px.URL
}

func isApply(r *http.Request) bool {
	return r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/apply")
}

func isOpsQuery(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/ops/")
}

// docs/protocol.md §1: "`expired` is judged when the worker reaches the command
// (and again before any resend), against the agent's clock."
//
// Sequence: a queryable pump answers the first three applies 503 (nothing
// applied); the third 503 comes 150 ms before the command's expires_at.
// The agent asks the device, which tombstones the key: not applied, and
// not yet expired, so AfterQuery says StepResend. The worker then sleeps
// the resend backoff (resendWait(3): 400..800 ms) and sends the operation
// again under a new key WITHOUT judging expires_at again: the device
// applies it 250..650 ms after expires_at and the Result says applied/ok.
// The resend backoff (up to 10 s) is what opens the window; before the
// rework, resends were immediate.
//
// Root cause: worker.go drive(), case StepResend: pause(resendWait) then
// StepSend, with no expiry check between the pause and pend(); decide.go
// AfterQuery judges the expiry only before the pause.
func TestAttack2ResendAfterBackoffIgnoresExpiry(t *testing.T) {
	d := pump("pump-7")
	d.timeout = "5s" // the proxy holds the third apply for a while
	e := newEnv(t, d)
	exp := time.Now().Add(4 * time.Second).Truncate(time.Millisecond)
	var applies atomic.Int32
	var lastRefusal, firstForwarded atomic.Int64
	e.devs[0].url = devProxy(t, e, func(w http.ResponseWriter, r *http.Request) bool {
		if !isApply(r) {
			return false
		}
		switch n := applies.Add(1); {
		case n <= 3:
			if n == 3 {
				time.Sleep(time.Until(exp.Add(-150 * time.Millisecond)))
			}
			lastRefusal.Store(time.Now().UnixNano())
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":"busy, not applied"}`))
			return true
		default:
			firstForwarded.CompareAndSwap(0, time.Now().UnixNano())
			return false
		}
	})
	e.start()
	c := cmd("op-1", 5, "set", `{"rpm":300}`)
	c.ExpiresAt = &exp
	e.send("pump-7", c)
	want(t, e.result("op-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	r := e.final("op-1")

	// The preconditions of the sequence: the last refusal came before
	// expires_at (so the query after it judged "not expired" legitimately).
	if lr := time.Unix(0, lastRefusal.Load()); applies.Load() < 3 || !lr.Before(exp) {
		t.Skipf("the sequence did not happen as planned (applies %d, last refusal %v vs expires_at %v)", applies.Load(), lr, exp)
	}
	var late []string
	for _, j := range e.journal() {
		if j.OpID == "op-1" && j.At.After(exp) {
			late = append(late, j.Key+" at "+j.At.Format(time.RFC3339Nano))
		}
	}
	if fw := firstForwarded.Load(); fw != 0 && time.Unix(0, fw).After(exp) {
		t.Errorf("a resend of op-1 was sent to the device %v after its expires_at %v", time.Unix(0, fw).Sub(exp), exp.Format(time.RFC3339Nano))
	}
	if len(late) > 0 {
		t.Errorf("op-1 was applied after its expires_at %s: %v", exp.Format(time.RFC3339Nano), late)
	}
	if r.Status != wire.StatusRejected || r.Code != wire.CodeExpired {
		t.Errorf("op-1 ended %s/%s (%s); want rejected/expired: it was not resent before expires_at", r.Status, r.Code, r.Reason)
	}
}

// The fix of TestStopDuringFastPathAdmissionSendsTheWrite (a command decided
// on arrival is "the write in hand" and sent during a graceful stop) has a
// second window: the stop comes after the intake submitted the admission
// but before the commit loop runs it (a slow fsync of an earlier batch,
// here another device's command). The idle worker of p1 sees `stopping`
// with an empty queue and returns; then the admission runs, finds the
// worker idle (depth 0), decides the command on arrival (pending, key
// recorded, last_fence raised), pushes it to the worker that is gone, and
// the acker acknowledges it. Nothing is sent. After a restart the pending
// record counts as unknown: p1 cannot be asked, so the agent publishes
// outcome_unknown ("the write may have reached the device") for a write
// that certainly never did, and holds p1 for an operator.
//
// docs/protocol.md §1 table: unknown/outcome_unknown is for a write that "may
// have reached the device"; docs/design.md invariant 6 then makes an operator
// resolve a write that was never sent (and resolving it "applied" by
// mistake would record a state the device never had).
//
// Root cause: intake.go admit(): the fast path (`w.depth.Load() == 0`)
// decides in the commit without looking at a.stopping; worker.go next()
// returns for good once stopping with an empty queue, so an item pushed
// after that is never taken.
func TestAttack2StopBeforeFastPathAdmissionRunsLeavesUnsentWriteUnknown(t *testing.T) {
	p0 := pump("p0")
	p1 := pump("p1")
	p1.queryable = false
	e := newEnv(t, p0, p1)
	var applies atomic.Int32
	e.devs[1].url = devProxy(t, e, func(w http.ResponseWriter, r *http.Request) bool {
		if isApply(r) {
			applies.Add(1)
		}
		return false
	})
	var armed atomic.Bool
	inCommit := make(chan struct{})
	var once sync.Once
	var slowEnd atomic.Int64
	e.failCommit = func() error {
		if armed.CompareAndSwap(true, false) {
			once.Do(func() { close(inCommit) })
			time.Sleep(1500 * time.Millisecond) // a slow fsync
			slowEnd.Store(time.Now().UnixNano())
		}
		return nil
	}
	e.start()
	armed.Store(true)
	e.send("p0", cmd("op-0", 1, "set", `{"rpm":10}`)) // its commit is the slow one
	select {
	case <-inCommit:
	case <-time.After(10 * time.Second):
		t.Fatal("no commit reached the store")
	}
	e.send("p1", cmd("op-1", 5, "set", `{"rpm":100}`))
	testkit.Eventually(t, 5*time.Second, "op-1's admission waiting behind the slow commit", func() bool { return e.app.Store().Waiting() > 0 })
	stopAt := time.Now().UnixNano()
	e.stop()
	if end := slowEnd.Load(); end == 0 || stopAt >= end {
		t.Skipf("the stop did not come while the earlier commit was under way (stop %d, end %d)", stopAt, end)
	}
	sentBeforeRestart := applies.Load()

	e.start()
	e.result("op-1", 1)
	rs := e.res.results("op-1")
	if applies.Load() == 0 {
		for _, r := range rs {
			if r.Status == wire.StatusUnknown {
				t.Fatalf("op-1 was published %s/%s (%q) and held for an operator, but the device never received a write for it (applies before restart: %d, after: %d)",
					r.Status, r.Code, r.Reason, sentBeforeRestart, applies.Load())
			}
		}
	}
	if len(rs) == 0 {
		t.Fatalf("no Result for op-1 after the restart; applies %d", applies.Load())
	}
	want(t, e.final("op-1"), wire.StatusApplied, wire.CodeOK)
}

// docs/protocol.md §1: "An `unknown` outcome is recorded as unknown, published,
// and once resolved, recorded and published again"; dedup: "a queued or
// pending one is only acknowledged (its Result will come); an unknown one
// is replayed as unknown". docs/design.md Recovery: "At start-up every pending
// record counts as unknown".
//
// Sequence: the agent is SIGKILLed after a write to a queryable pump
// (after_write: the device applied it, the outcome is not recorded). At
// the restart the device's ops route cannot answer (503: busy, rebooting),
// so the write cannot be resolved. The same situation without the crash
// (a timeout) publishes outcome_unknown at once and replays it to a
// controller's resend. After the crash the op stays "pending": nothing is
// published for as long as the device cannot be asked, and the
// controller's resend is only acknowledged (AdmitInFlight), never
// answered. The controller cannot tell a held write from a lost command.
// (The non-queryable path, hold(), does publish the unknown for an
// interrupted write; the queryable path, ask(), does not.)
//
// Root cause: worker.go handle(): a pending record at start-up goes
// straight to StepAsk; ask() loops on query errors without markUnknown
// (only hold() marks an interrupted write unknown first); decide.go Dedup
// answers a pending record AdmitInFlight.
func TestAttack2RecoveredWriteHeldSilentlyWhileDeviceCannotBeAsked(t *testing.T) {
	d := pump("pump-7")
	e := newEnv(t, d)
	var noAnswer atomic.Bool
	var refused atomic.Int32
	e.devs[0].url = devProxy(t, e, func(w http.ResponseWriter, r *http.Request) bool {
		if noAnswer.Load() && isOpsQuery(r) {
			refused.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":"rebooting"}`))
			return true
		}
		return false
	})
	e.startProc("EDGE_AGENT_CRASH=after_write:op-1")
	e.send("pump-7", cmd("op-1", 7, "set", `{"rpm":700}`))
	if code := e.waitExit(20 * time.Second); code != -1 || !strings.Contains(e.log(), "SIGKILL at crash point") {
		t.Fatalf("agent exited %d, want killed at the crash point:\n%s", code, e.log())
	}
	if got := strings.Join(e.journalOps(), ","); got != "op-1" {
		t.Fatalf("journal %q: the write did not happen before the crash", got)
	}
	noAnswer.Store(true)
	e.start()
	// Held while the device cannot answer: published unknown.
	want(t, e.result("op-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	if refused.Load() == 0 {
		t.Fatal("no query was refused: the fault did not happen")
	}
	// The controller resends, as it must until it sees a final Result: it
	// is answered from the record, unknown.
	e.send("pump-7", cmd("op-1", 7, "set", `{"rpm":700}`))
	if r := e.result("op-1", 2); !r.Duplicate || r.Status != wire.StatusUnknown {
		t.Fatalf("resend of the held op-1: %+v, want the unknown replayed", r)
	}
	noAnswer.Store(false)
	want(t, e.final("op-1"), wire.StatusApplied, wire.CodeOK)
	if got := strings.Join(e.journalOps(), ","); got != "op-1" {
		t.Fatalf("journal %q", got)
	}
}

// docs/protocol.md §1: "`expired` is judged when the worker reaches the command
// ..., against the agent's clock." The fast path judges it with the clock
// read when the delivery arrived, not when the decision is made: admit()
// reads `now` before Submit, and the check runs inside the commit, which
// may come much later when the commit loop is busy (a slow fsync of an
// earlier batch, here another device's command). The command is decided
// "not expired" in a commit that runs after its expires_at, and sent.
//
// Sequence: a commit of p0's command takes 1.5 s (slow disk). op-1 for
// the idle p1 arrives with expires_at 400 ms ahead and waits for the
// commit loop; its admission runs ~1.2 s later, past expires_at, with
// now = arrival: pending, sent, applied/ok. Had the worker (not the fast
// path) decided it, Check would have read the clock then and ended it
// rejected/expired.
//
// Root cause: intake.go admit(): `now := a.now()` before a.st.Submit(...),
// then `Check(a.rules(rt), &o, d, now)` inside the commit function.
func TestAttack2FastPathJudgesExpiryWithTheArrivalClock(t *testing.T) {
	e := newEnv(t, pump("p0"), pump("p1"))
	var armed atomic.Bool
	inCommit := make(chan struct{})
	var once sync.Once
	e.failCommit = func() error {
		if armed.CompareAndSwap(true, false) {
			once.Do(func() { close(inCommit) })
			time.Sleep(1500 * time.Millisecond) // a slow fsync
		}
		return nil
	}
	e.start()
	armed.Store(true)
	e.send("p0", cmd("op-0", 1, "set", `{"rpm":10}`))
	select {
	case <-inCommit:
	case <-time.After(10 * time.Second):
		t.Fatal("no commit reached the store")
	}
	c := cmd("op-1", 5, "set", `{"rpm":100}`)
	exp := time.Now().Add(400 * time.Millisecond)
	c.ExpiresAt = &exp
	e.send("p1", c)
	r := e.final("op-1")
	for _, j := range e.journal() {
		if j.OpID == "op-1" && j.At.After(exp) {
			t.Errorf("op-1 was applied %v after its expires_at (Result %s/%s)", j.At.Sub(exp), r.Status, r.Code)
		}
	}
	want(t, r, wire.StatusRejected, wire.CodeExpired)
}

// docs/design.md invariant 6: "a device that cannot be asked is held until an
// operator resolves the write"; docs/protocol.md §3: resolve answers 409 for "an
// operation that is not unknown"; docs/design.md Recovery: "every pending record
// counts as unknown".
//
// Sequence: a (queryable) and b (queryable: false) are separate devices.
// a-1 ends unknown and a's ops route cannot answer (503), so it stays
// unresolved. The agent is SIGKILLed right after writing b-1 (after_write):
// b-1 is pending. The restart puts a and b into one group. Recovery puts
// b-1 first (cannot be asked: held for an operator), but settleRecovered
// first asks about every write on a device that can be asked, and its
// ask() of a-1 loops for as long as a cannot answer. b-1 is never reached:
// it stays "pending", so no outcome_unknown is published for it, and the
// operator's resolve of b-1 is refused 409 ("not unknown"). The group is
// held, and the write that the design says an operator resolves cannot be
// resolved by anyone until another device comes back.
//
// Root cause: recovery.go settleRecovered(): it calls w.ask() (which loops
// until the device answers) before the held write on a device that cannot
// be asked has been marked unknown (worker.go hold() does that only when
// the main loop reaches it); admin.go Resolve accepts only OpUnknown.
func TestAttack2RegroupedHeldWriteCannotBeResolved(t *testing.T) {
	a, b := pump("a"), pump("b")
	b.queryable, b.timeout = false, "300ms"
	e := newEnv(t, a, b)
	var aQueries atomic.Int32
	e.devs[0].url = devProxy(t, e, func(w http.ResponseWriter, r *http.Request) bool {
		switch {
		case isApply(r):
			w.WriteHeader(http.StatusServiceUnavailable) // may or may not have happened
			w.Write([]byte(`{"error":"overloaded"}`))
			return true
		case isOpsQuery(r):
			aQueries.Add(1)
			w.WriteHeader(http.StatusServiceUnavailable) // cannot answer now
			w.Write([]byte(`{"error":"rebooting"}`))
			return true
		}
		return false
	})
	e.startProc("EDGE_AGENT_CRASH=after_write:b-1")
	e.send("a", cmd("a-1", 1, "set", `{"rpm":100}`))
	want(t, e.result("a-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	e.send("b", cmd("b-1", 1, "set", `{"rpm":100}`))
	if code := e.waitExit(20 * time.Second); code != -1 || !strings.Contains(e.log(), "SIGKILL at crash point") {
		t.Fatalf("agent exited %d, want killed at the crash point:\n%s", code, e.log())
	}

	e.devs[0].group, e.devs[1].group = "g", "g"
	e.start()
	// b-1, interrupted on a device that cannot be asked, is published
	// unknown while a-1 is still being asked about.
	want(t, e.result("b-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	testkit.Eventually(t, 10*time.Second, "a-1 asked about after the restart", func() bool { return aQueries.Load() >= 3 })
	resp, err := http.Post("http://"+e.app.AdminAddr()+"/v1/devices/b/ops/b-1/resolve", "application/json", strings.NewReader(`{"applied":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the operator's resolve of the held b-1 was refused: HTTP %d (b-1 is still recorded pending)", resp.StatusCode)
	}
}
