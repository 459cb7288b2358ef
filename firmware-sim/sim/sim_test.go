package sim_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

var devices = map[string]string{"pump-7": "pump", "valve-1": "valve", "relay-1": "relay", "gen-1": "generic"}

// client talks to a simulator over real HTTP. Keep-alives are off so that
// no request is ever resent by the transport on a reused connection: every
// request counted by the simulator is one the test made.
type client struct {
	t    testing.TB
	base string
	hc   *http.Client
}

func newClient(t testing.TB, s *sim.Sim) *client {
	return &client{t: t, base: s.URL(), hc: &http.Client{
		Transport: &http.Transport{DisableKeepAlives: true},
		Timeout:   20 * time.Second,
	}}
}

type answer struct {
	code int
	body string
	err  error // a transport error: the connection was closed without an answer
}

func (c *client) do(method, path string, hdr map[string]string, body string) answer {
	req, err := http.NewRequest(method, c.base+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{code: resp.StatusCode, body: strings.TrimSpace(string(b)), err: err}
}

func (c *client) apply(dev, key, body string) answer {
	return c.do("POST", "/v1/devices/"+dev+"/apply", map[string]string{"Idempotency-Key": key, "X-Fence-Token": "7"}, body)
}

func (c *client) query(dev, key string) answer {
	return c.do("GET", "/v1/devices/"+dev+"/ops/"+key, nil, "")
}

func (a answer) want(t testing.TB, code int, body string) {
	t.Helper()
	if a.err != nil {
		t.Fatalf("transport error %v, want %d %s", a.err, code, body)
	}
	if a.code != code || (body != "" && a.body != body) {
		t.Fatalf("answer = %d %s, want %d %s", a.code, a.body, code, body)
	}
}

func (a answer) wantDropped(t testing.TB) {
	t.Helper()
	if a.err == nil {
		t.Fatalf("answer = %d %s, want the connection closed without an answer", a.code, a.body)
	}
}

func state(t testing.TB, s *sim.Sim, dev string) string {
	t.Helper()
	st, err := s.State(dev)
	if err != nil {
		t.Fatal(err)
	}
	return string(st)
}

func keys(entries []sim.Entry) []string {
	var ks []string
	for _, e := range entries {
		ks = append(ks, e.Device+"/"+e.Key)
	}
	return ks
}

func setFaults(t testing.TB, s *sim.Sim, f sim.Faults) {
	t.Helper()
	if err := s.SetFaults(f); err != nil {
		t.Fatal(err)
	}
}

const set1200 = `{"op_id":"op-1","action":"set","params":{"rpm":1200}}`

func TestApplyRepeatReturnsFirstAnswer(t *testing.T) {
	s := sim.StartForTest(t, devices)
	c := newClient(t, s)

	c.apply("pump-7", "k1", set1200).want(t, 200, `{"applied":true,"state":{"rpm":1200}}`)
	// The repeat carries other params: the key decides, not the body.
	c.apply("pump-7", "k1", `{"op_id":"op-1","action":"set","params":{"rpm":3000}}`).
		want(t, 200, `{"applied":true,"state":{"rpm":1200}}`)
	c.apply("pump-7", "k2", `{"op_id":"op-2","action":"stop"}`).want(t, 200, `{"applied":true,"state":{"rpm":0}}`)

	j := s.Journal()
	if len(j) != 2 {
		t.Fatalf("journal = %v, want 2 writes", j)
	}
	e := j[0]
	if e.Seq != 1 || e.Device != "pump-7" || e.OpID != "op-1" || e.Key != "k1" || e.Fence != 7 || e.Action != "set" ||
		string(e.Params) != `{"rpm":1200}` || e.At.IsZero() || j[1].Seq != 2 || string(j[1].Params) != `{}` {
		t.Fatalf("journal = %+v", j)
	}
	if got := s.Requests("pump-7", "k1"); got != 2 {
		t.Fatalf("Requests(k1) = %d, want 2", got)
	}
	if got := state(t, s, "pump-7"); got != `{"rpm":0}` {
		t.Fatalf("state = %s", got)
	}
	c.do("GET", "/v1/devices/pump-7/state", nil, "").want(t, 200, `{"rpm":0}`)

	// GET /v1/journal: the same writes as JSON lines, oldest first.
	a := c.do("GET", "/v1/journal", nil, "")
	a.want(t, 200, "")
	lines := strings.Split(a.body, "\n")
	if len(lines) != 2 {
		t.Fatalf("journal lines = %q", lines)
	}
	var first map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"seq", "device", "op_id", "key", "fence", "action", "params", "at"} {
		if _, ok := first[f]; !ok {
			t.Errorf("journal line lacks %q: %s", f, lines[0])
		}
	}
}

func TestApplyRequestErrors(t *testing.T) {
	s := sim.StartForTest(t, devices)
	c := newClient(t, s)
	tests := []struct {
		name, dev string
		hdr       map[string]string
		body      string
		code      int
		want      string
	}{
		{"no key", "pump-7", map[string]string{}, set1200, 400, `{"error":"Idempotency-Key: required"}`},
		{"bad fence", "pump-7", map[string]string{"Idempotency-Key": "k", "X-Fence-Token": "x"}, set1200, 400, `{"error":"X-Fence-Token: must be an integer, got \"x\""}`},
		{"no action", "pump-7", map[string]string{"Idempotency-Key": "k"}, `{"op_id":"o"}`, 400, `{"error":"action: required"}`},
		{"params not object", "pump-7", map[string]string{"Idempotency-Key": "k"}, `{"action":"set","params":[1]}`, 400, `{"error":"params: must be a JSON object"}`},
		{"unknown device", "pump-8", map[string]string{"Idempotency-Key": "k"}, set1200, 404, `{"error":"unknown device \"pump-8\""}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c.do("POST", "/v1/devices/"+tt.dev+"/apply", tt.hdr, tt.body).want(t, tt.code, tt.want)
		})
	}
	c.query("pump-8", "k").want(t, 404, `{"error":"unknown device \"pump-8\""}`)
	c.do("GET", "/v1/devices/pump-8/state", nil, "").want(t, 404, `{"error":"unknown device \"pump-8\""}`)
	if j := s.Journal(); len(j) != 0 {
		t.Fatalf("journal = %v, want none", j)
	}
	// A malformed request decides nothing about its key.
	c.apply("pump-7", "k", set1200).want(t, 200, `{"applied":true,"state":{"rpm":1200}}`)
}

func TestHardwareLimitsAndRememberedRefusal(t *testing.T) {
	s := sim.StartForTest(t, devices)
	c := newClient(t, s)
	tests := []struct{ dev, body, want string }{
		{"pump-7", `{"action":"set","params":{"rpm":6001}}`, `{"error":"rpm: must be an integer 0..6000, got 6001"}`},
		{"valve-1", `{"action":"set","params":{"open":-5}}`, `{"error":"open: must be an integer 0..100, got -5"}`},
		{"relay-1", `{"action":"set","params":{"on":"yes"}}`, `{"error":"on: must be a boolean, got \"yes\""}`},
		{"pump-7", `{"action":"set","params":{"rpm":10,"mode":"x"}}`, `{"error":"mode: unknown parameter"}`},
	}
	for i, tt := range tests {
		c.apply(tt.dev, fmt.Sprint("bad-", i), tt.body).want(t, 422, tt.want)
	}
	// The refusal is the key's stored answer, even for a valid body now.
	c.apply("pump-7", "bad-0", set1200).want(t, 422, tests[0].want)
	c.apply("gen-1", "g1", `{"action":"paint","params":{"colour":"red","n":1}}`).want(t, 200, `{"applied":true,"state":{"colour":"red","n":1}}`)
	c.apply("gen-1", "g2", `{"action":"paint","params":{"n":2}}`).want(t, 200, `{"applied":true,"state":{"colour":"red","n":2}}`)
	c.apply("relay-1", "r1", `{"action":"toggle"}`).want(t, 200, `{"applied":true,"state":{"on":true}}`)
	if got := keys(s.Journal()); fmt.Sprint(got) != "[gen-1/g1 gen-1/g2 relay-1/r1]" {
		t.Fatalf("journal = %v", got)
	}
	// A refused key is not applied: a query tombstones it like any other.
	c.query("pump-7", "bad-0").want(t, 404, `{"key":"bad-0","applied":false}`)
	c.apply("pump-7", "bad-0", set1200).want(t, 409, "")
}

func TestRepeatWhileInProgressWaits(t *testing.T) {
	s := sim.StartForTest(t, devices)
	setFaults(t, s, sim.Faults{Device: "pump-7", LatencyMS: 300})
	c := newClient(t, s)

	first := make(chan answer)
	go func() { first <- c.apply("pump-7", "k", set1200) }()
	testkit.Eventually(t, 10*time.Second, "the first request to be delayed", func() bool { return s.Injected().Delayed == 1 })
	// The repeat waits for the first, then gets the first's answer.
	second := c.apply("pump-7", "k", `{"op_id":"op-1","action":"set","params":{"rpm":5}}`)
	second.want(t, 200, `{"applied":true,"state":{"rpm":1200}}`)
	(<-first).want(t, 200, `{"applied":true,"state":{"rpm":1200}}`)
	if n := len(s.Journal()); n != 1 {
		t.Fatalf("journal has %d writes, want 1", n)
	}
	if got := s.Requests("pump-7", "k"); got != 2 {
		t.Fatalf("Requests = %d, want 2", got)
	}
}

// TestQueryWaitsForLatency: latency delays an apply before it takes
// effect, with its key already in progress; a query arriving during the
// delay waits for it and sees it applied (and does not tombstone it).
func TestQueryWaitsForLatency(t *testing.T) {
	s := sim.StartForTest(t, devices)
	setFaults(t, s, sim.Faults{Device: "pump-7", LatencyMS: 300})
	c := newClient(t, s)

	applied := make(chan answer)
	go func() { applied <- c.apply("pump-7", "k", set1200) }()
	testkit.Eventually(t, 10*time.Second, "the apply to be delayed", func() bool { return s.Injected().Delayed == 1 })
	start := time.Now()
	q := c.query("pump-7", "k")
	q.want(t, 200, `{"key":"k","op_id":"op-1","applied":true,"state":{"rpm":1200}}`)
	if waited := time.Since(start); waited < 100*time.Millisecond {
		t.Fatalf("query answered after %v: it did not wait for the delayed apply", waited)
	}
	(<-applied).want(t, 200, `{"applied":true,"state":{"rpm":1200}}`)
	if n := len(s.Journal()); n != 1 {
		t.Fatalf("journal has %d writes, want 1", n)
	}
}

// TestQueryWaitsForAbandonedApply: the apply in progress fails (503, not
// applied); the waiting query then answers 404 and tombstones the key.
func TestQueryWaitsForAbandonedApply(t *testing.T) {
	s := sim.StartForTest(t, devices)
	setFaults(t, s, sim.Faults{Device: "pump-7", LatencyMS: 200, ErrorRate: 1})
	c := newClient(t, s)
	applied := make(chan answer)
	go func() { applied <- c.apply("pump-7", "k", set1200) }()
	testkit.Eventually(t, 10*time.Second, "the apply to be delayed", func() bool { return s.Injected().Delayed == 1 })
	c.query("pump-7", "k").want(t, 404, `{"key":"k","applied":false}`)
	(<-applied).want(t, 503, "")
	setFaults(t, s, sim.Faults{})
	c.apply("pump-7", "k", set1200).want(t, 409, "")
	if j := s.Journal(); len(j) != 0 {
		t.Fatalf("journal = %v, want none", j)
	}
}

func TestTombstonedKeyIsNeverApplied(t *testing.T) {
	t.Run("a tombstoned key is never applied, even when the delayed request arrives after the query", func(t *testing.T) {
		s := sim.StartForTest(t, devices)
		c := newClient(t, s)
		// The request is still on its way when the query is made.
		c.query("pump-7", "late").want(t, 404, `{"key":"late","applied":false}`)
		c.query("pump-7", "late").want(t, 404, `{"key":"late","applied":false}`)
		c.apply("pump-7", "late", set1200).want(t, 409, `{"error":"Idempotency-Key \"late\" was tombstoned by an ops query: it is never applied"}`)
		c.apply("pump-7", "late", set1200).want(t, 409, "")
		if got := s.Requests("pump-7", "late"); got != 2 {
			t.Fatalf("Requests = %d, want 2: the requests did arrive", got)
		}
		if j := s.Journal(); len(j) != 0 {
			t.Fatalf("journal = %v, want none", j)
		}
		if got := state(t, s, "pump-7"); got != `{"rpm":0}` {
			t.Fatalf("state = %s, want untouched", got)
		}
		// Keys are per device.
		c.apply("valve-1", "late", `{"action":"set","params":{"open":5}}`).want(t, 200, "")
	})
	t.Run("a request held by hang when the query tombstones it is closed unapplied", func(t *testing.T) {
		s := sim.StartForTest(t, devices)
		setFaults(t, s, sim.Faults{Device: "pump-7", Hang: true})
		c := newClient(t, s)
		held := make(chan answer)
		go func() { held <- c.apply("pump-7", "k", set1200) }()
		testkit.Eventually(t, 10*time.Second, "the apply to be held", func() bool { return s.Injected().Held == 1 })
		// The query is not subject to the fault and does not wait for a
		// held request: it will never take effect.
		c.query("pump-7", "k").want(t, 404, `{"key":"k","applied":false}`)
		setFaults(t, s, sim.Faults{})
		(<-held).wantDropped(t)
		c.apply("pump-7", "k", set1200).want(t, 409, "")
		if j := s.Journal(); len(j) != 0 {
			t.Fatalf("journal = %v, want none", j)
		}
	})
}

// TestQueryApplyRace races an apply against a query of the same key, many
// times: each key ends either applied (the query waited and saw it) or
// tombstoned (the apply got 409), and the journal holds exactly the keys
// the queries saw applied.
func TestQueryApplyRace(t *testing.T) {
	s := sim.StartForTest(t, devices)
	setFaults(t, s, sim.Faults{LatencyMS: 1})
	c := newClient(t, s)
	const n = 60
	var mu sync.Mutex
	seenApplied := map[string]bool{}
	var wg sync.WaitGroup
	for i := range n {
		key := fmt.Sprint("k", i)
		var a, q answer
		wg.Go(func() {
			var inner sync.WaitGroup
			inner.Go(func() { a = c.apply("gen-1", key, fmt.Sprintf(`{"action":"set","params":{"%s":1}}`, key)) })
			inner.Go(func() { q = c.query("gen-1", key) })
			inner.Wait()
			switch {
			case a.err == nil && q.err == nil && a.code == 200 && q.code == 200:
				mu.Lock()
				seenApplied["gen-1/"+key] = true
				mu.Unlock()
			case a.err == nil && q.err == nil && a.code == 409 && q.code == 404:
			default:
				t.Errorf("%s: apply %d %v, query %d %v", key, a.code, a.err, q.code, q.err)
			}
		})
	}
	wg.Wait()
	j := s.Journal()
	if len(j) != len(seenApplied) {
		t.Fatalf("journal has %d writes, queries saw %d applied", len(j), len(seenApplied))
	}
	for _, k := range keys(j) {
		if !seenApplied[k] {
			t.Errorf("%s applied but its query said not", k)
		}
	}
	t.Logf("%d of %d keys applied before their query", len(j), n)
}

func TestConcurrentAppliesApplyEachKeyOnce(t *testing.T) {
	s := sim.StartForTest(t, devices)
	setFaults(t, s, sim.Faults{LatencyMS: 2})
	c := newClient(t, s)
	const keysPerDevice, senders = 20, 4
	answers := map[string][]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, dev := range []string{"pump-7", "valve-1"} {
		for i := range keysPerDevice {
			key := fmt.Sprint("k", i)
			param := map[string]string{"pump-7": "rpm", "valve-1": "open"}[dev]
			for sender := range senders {
				wg.Go(func() {
					a := c.apply(dev, key, fmt.Sprintf(`{"action":"set","params":{"%s":%d}}`, param, i*senders+sender))
					if a.err != nil || a.code != 200 {
						t.Errorf("%s/%s: %d %v", dev, key, a.code, a.err)
					}
					mu.Lock()
					answers[dev+"/"+key] = append(answers[dev+"/"+key], a.body)
					mu.Unlock()
				})
			}
		}
	}
	wg.Wait()
	j := s.Journal()
	if len(j) != 2*keysPerDevice {
		t.Fatalf("journal has %d writes, want %d", len(j), 2*keysPerDevice)
	}
	seen := map[string]bool{}
	for i, e := range j {
		if e.Seq != int64(i+1) {
			t.Fatalf("journal[%d].seq = %d", i, e.Seq)
		}
		k := e.Device + "/" + e.Key
		if seen[k] {
			t.Fatalf("%s applied twice", k)
		}
		seen[k] = true
	}
	for k, as := range answers {
		for _, a := range as {
			if a != as[0] {
				t.Fatalf("%s answered differently: %q", k, as)
			}
		}
		dev, key, _ := strings.Cut(k, "/")
		if got := s.Requests(dev, key); got != senders {
			t.Fatalf("Requests(%s) = %d, want %d", k, got, senders)
		}
	}
}

func TestErrorRateAnswers503WithoutApplying(t *testing.T) {
	s := sim.StartForTest(t, devices)
	setFaults(t, s, sim.Faults{Device: "pump-7", ErrorRate: 1})
	c := newClient(t, s)
	c.apply("pump-7", "k", set1200).want(t, 503, `{"error":"injected fault: error_rate 1"}`)
	if j := s.Journal(); len(j) != 0 || s.Injected().Errors != 1 {
		t.Fatalf("journal = %v, injected = %+v", j, s.Injected())
	}
	// Another device is not affected.
	c.apply("valve-1", "k", `{"action":"close"}`).want(t, 200, "")
	setFaults(t, s, sim.Faults{})
	// The 503 decided nothing: the key is still free.
	c.apply("pump-7", "k", set1200).want(t, 200, `{"applied":true,"state":{"rpm":1200}}`)
}

func TestDropResponseAppliesThenCloses(t *testing.T) {
	s := sim.StartForTest(t, devices)
	setFaults(t, s, sim.Faults{DropResponseRate: 1})
	c := newClient(t, s)
	c.apply("pump-7", "k", set1200).wantDropped(t)
	if got := s.Injected().Dropped; got != 1 {
		t.Fatalf("dropped = %d, want 1", got)
	}
	if got := keys(s.Journal()); fmt.Sprint(got) != "[pump-7/k]" {
		t.Fatalf("journal = %v: the dropped write must be applied", got)
	}
	// A repeat is dropped too while the fault holds, and applies nothing.
	c.apply("pump-7", "k", set1200).wantDropped(t)
	// Ops queries are never subject to faults.
	c.query("pump-7", "k").want(t, 200, `{"key":"k","op_id":"op-1","applied":true,"state":{"rpm":1200}}`)
	setFaults(t, s, sim.Faults{})
	c.apply("pump-7", "k", set1200).want(t, 200, `{"applied":true,"state":{"rpm":1200}}`)
	if n := len(s.Journal()); n != 1 {
		t.Fatalf("journal has %d writes, want 1", n)
	}
}

func TestHangHoldsUntilClearedThenClosesUnapplied(t *testing.T) {
	s := sim.StartForTest(t, devices)
	setFaults(t, s, sim.Faults{Hang: true})
	c := newClient(t, s)
	held := make(chan answer)
	go func() { held <- c.apply("pump-7", "k", set1200) }()
	testkit.Eventually(t, 10*time.Second, "the apply to be held", func() bool { return s.Injected().Held == 1 })
	select {
	case a := <-held:
		t.Fatalf("held apply answered %+v while hang holds", a)
	case <-time.After(100 * time.Millisecond):
	}
	// Queries, state and the journal still answer.
	c.do("GET", "/v1/devices/pump-7/state", nil, "").want(t, 200, `{"rpm":0}`)
	c.do("GET", "/v1/journal", nil, "").want(t, 200, "")
	// Setting other faults that still hang keeps holding.
	setFaults(t, s, sim.Faults{Hang: true, LatencyMS: 1})
	setFaults(t, s, sim.Faults{})
	(<-held).wantDropped(t)
	if j := s.Journal(); len(j) != 0 {
		t.Fatalf("journal = %v, want none", j)
	}
	// Never applied, never tombstoned: the key can still be used.
	c.apply("pump-7", "k", set1200).want(t, 200, "")
}

func TestFaultsAPI(t *testing.T) {
	s := sim.StartForTest(t, devices)
	c := newClient(t, s)
	post := func(body string) answer { return c.do("POST", "/v1/faults", nil, body) }

	post(`{"latency_ms":5,"error_rate":0.5}`).want(t, 200, "")
	if f := s.FaultsOf("valve-1"); f.LatencyMS != 5 || f.ErrorRate != 0.5 {
		t.Fatalf("valve-1 faults = %+v", f)
	}
	post(`{"device":"pump-7","drop_response_rate":0.2,"hang":true}`).want(t, 200, "")
	if f := s.FaultsOf("pump-7"); f.LatencyMS != 0 || f.DropResponseRate != 0.2 || !f.Hang {
		t.Fatalf("pump-7 faults = %+v", f)
	}
	if f := s.FaultsOf("valve-1"); f.LatencyMS != 5 {
		t.Fatalf("valve-1 faults = %+v: a per-device setting changed another device", f)
	}
	post(`{}`).want(t, 200, `{"all":{"latency_ms":0,"error_rate":0,"drop_response_rate":0,"hang":false},"devices":{}}`)
	if f := s.FaultsOf("pump-7"); f != (sim.Faults{Device: "pump-7"}) {
		t.Fatalf("after {}: pump-7 faults = %+v", f)
	}
	post(`{"device":"nope","hang":true}`).want(t, 404, `{"error":"sim: unknown device: \"nope\""}`)
	post(`{"error_rate":1.5}`).want(t, 400, `{"error":"sim: invalid faults: error_rate must be 0..1, got 1.5"}`)
	post(`{"latency_ms":-1}`).want(t, 400, "")
	post(`{"hang":true,"colour":1}`).want(t, 400, "")
	c.do("GET", "/v1/faults", nil, "").want(t, 200, `{"all":{"latency_ms":0,"error_rate":0,"drop_response_rate":0,"hang":false},"devices":{}}`)
}

func TestOpsAndJournalAreNotSubjectToFaults(t *testing.T) {
	s := sim.StartForTest(t, devices)
	c := newClient(t, s)
	c.apply("pump-7", "k", set1200).want(t, 200, "")
	setFaults(t, s, sim.Faults{LatencyMS: 5000, ErrorRate: 1, DropResponseRate: 1})
	start := time.Now()
	c.query("pump-7", "k").want(t, 200, "")
	c.query("pump-7", "other").want(t, 404, "")
	c.do("GET", "/v1/journal", nil, "").want(t, 200, "")
	c.do("GET", "/v1/devices/pump-7/state", nil, "").want(t, 200, `{"rpm":1200}`)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v: faults delayed queries", d)
	}
}

func TestRestartReloadsJournalAndTombstones(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.jsonl")
	opts := sim.Options{Devices: devices, JournalPath: path}

	s1 := sim.StartForTestWith(t, opts, "")
	c := newClient(t, s1)
	c.apply("pump-7", "k1", set1200).want(t, 200, `{"applied":true,"state":{"rpm":1200}}`)
	c.apply("gen-1", "g1", `{"op_id":"g","action":"x","params":{"a":1}}`).want(t, 200, "")
	c.apply("gen-1", "g2", `{"op_id":"g2","action":"x","params":{"b":2}}`).want(t, 200, `{"applied":true,"state":{"a":1,"b":2}}`)
	c.apply("pump-7", "k2", `{"op_id":"op-2","action":"stop"}`).want(t, 200, `{"applied":true,"state":{"rpm":0}}`)
	c.query("pump-7", "dead").want(t, 404, "")
	before := s1.Journal()
	addr := s1.Addr()
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}

	// A torn last line (a write cut by a crash before its fsync) is dropped.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"seq":5,"device":"pump-7","op_id":"torn","key":"torn","fen`)
	f.Close()

	s2 := sim.StartForTestWith(t, opts, addr)
	c = newClient(t, s2)
	after := s2.Journal()
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("journal after restart = %v, want %v", after, before)
	}
	if got := state(t, s2, "pump-7"); got != `{"rpm":0}` {
		t.Fatalf("pump-7 state after restart = %s", got)
	}
	if got := state(t, s2, "gen-1"); got != `{"a":1,"b":2}` {
		t.Fatalf("gen-1 state after restart = %s", got)
	}
	// Stored answers come back from the journal: the state each write reported.
	c.apply("pump-7", "k1", set1200).want(t, 200, `{"applied":true,"state":{"rpm":1200}}`)
	c.apply("gen-1", "g1", `{"action":"x","params":{"a":9}}`).want(t, 200, `{"applied":true,"state":{"a":1}}`)
	c.query("pump-7", "k1").want(t, 200, `{"key":"k1","op_id":"op-1","applied":true,"state":{"rpm":1200}}`)
	c.apply("pump-7", "dead", set1200).want(t, 409, "")
	c.query("pump-7", "torn").want(t, 404, "")
	c.apply("pump-7", "k3", `{"action":"set","params":{"rpm":10}}`).want(t, 200, "")
	j := s2.Journal()
	if len(j) != 5 || j[4].Seq != 5 || j[4].Key != "k3" {
		t.Fatalf("journal = %+v, want k3 appended as seq 5", j)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}

	// The file is whole JSON lines: the torn one was cut, not continued.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	if len(lines) != 5 {
		t.Fatalf("journal file has %d lines:\n%s", len(lines), data)
	}
	for _, l := range lines {
		var e sim.Entry
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("journal line %q: %v", l, err)
		}
	}
	// And a third start still knows both tombstones.
	s3 := sim.StartForTestWith(t, opts, "")
	c = newClient(t, s3)
	c.apply("pump-7", "dead", set1200).want(t, 409, "")
	c.apply("pump-7", "torn", set1200).want(t, 409, "")
}

func TestCorruptJournal(t *testing.T) {
	for _, tt := range []struct{ name, journal string }{
		{"not json", "{\"seq\":1}\nnot json\n"},
		{"seq out of order", "{\"seq\":2}\n{\"seq\":1}\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "journal.jsonl")
			if err := os.WriteFile(path, []byte(tt.journal), 0o644); err != nil {
				t.Fatal(err)
			}
			s, err := sim.New(sim.Options{Devices: devices, JournalPath: path})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Start(context.Background(), "127.0.0.1:0"); !errors.Is(err, sim.ErrCorruptJournal) {
				t.Fatalf("Start = %v, want ErrCorruptJournal", err)
			}
			if j := s.Journal(); len(j) != 0 {
				t.Fatalf("a failed load left a journal behind: %v", j)
			}
		})
	}
}

// TestClosePowersOff: Close abandons a write still in its latency, like a
// power cut before it took effect; it is neither applied nor journaled.
func TestClosePowersOff(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.jsonl")
	opts := sim.Options{Devices: devices, JournalPath: path}
	s := sim.StartForTestWith(t, opts, "")
	setFaults(t, s, sim.Faults{LatencyMS: 60_000})
	c := newClient(t, s)
	inFlight := make(chan answer)
	go func() { inFlight <- c.apply("pump-7", "k", set1200) }()
	testkit.Eventually(t, 10*time.Second, "the apply to be delayed", func() bool { return s.Injected().Delayed == 1 })
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Close took %v", d)
	}
	(<-inFlight).wantDropped(t)
	if err := s.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if err := s.Start(context.Background(), "127.0.0.1:0"); !errors.Is(err, sim.ErrClosed) {
		t.Fatalf("Start after Close = %v", err)
	}
	if err := s.SetFaults(sim.Faults{}); !errors.Is(err, sim.ErrClosed) {
		t.Fatalf("SetFaults after Close = %v", err)
	}
	s2 := sim.StartForTestWith(t, opts, "")
	newClient(t, s2).query("pump-7", "k").want(t, 404, "")
	if j := s2.Journal(); len(j) != 0 {
		t.Fatalf("journal = %v", j)
	}
}

func TestNew(t *testing.T) {
	for _, tt := range []struct {
		name    string
		devices map[string]string
		want    error
	}{
		{"none", nil, sim.ErrNoDevices},
		{"bad id", map[string]string{"a/b": "pump"}, sim.ErrBadDeviceID},
		{"bad type", map[string]string{"a": "toaster"}, sim.ErrUnknownType},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := sim.New(sim.Options{Devices: tt.devices}); !errors.Is(err, tt.want) {
				t.Fatalf("New = %v, want %v", err, tt.want)
			}
		})
	}
}

// TestHandlerWithoutStart: Handler serves on any server, e.g. httptest's.
func TestHandlerWithoutStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "j")
	s, err := sim.New(sim.Options{Devices: devices, JournalPath: path})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rec := &recorder{header: http.Header{}}
	req, _ := http.NewRequest("POST", "/v1/devices/pump-7/apply", strings.NewReader(set1200))
	req.Header.Set("Idempotency-Key", "k")
	s.Handler().ServeHTTP(rec, req)
	if rec.code != 200 || len(s.Journal()) != 1 {
		t.Fatalf("answer %d %s, journal %v", rec.code, rec.body.String(), s.Journal())
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("journal file: %v", err)
	}
}

type recorder struct {
	header http.Header
	code   int
	body   strings.Builder
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) WriteHeader(code int)        { r.code = code }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
