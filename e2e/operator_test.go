package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/admin"
	"github.com/edge-agent/edge-agent/internal/agent"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// sseEvent is one Server-Sent Event as a client sees it.
type sseEvent struct {
	kind string
	data string
}

// streamEvents reads GET /v1/events until the test ends; every event goes
// to the returned channel (a slow test drops none: the buffer is large).
func streamEvents(t *testing.T, base string) <-chan sseEvent {
	t.Helper()
	return streamEventsAt(t, base+"/v1/events")
}

func streamEventsAt(t *testing.T, url string) <-chan sseEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("GET /v1/events: %s %s", resp.Status, resp.Header.Get("Content-Type"))
	}
	ch := make(chan sseEvent, 10000)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.kind != "" {
					ch <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "event: "):
				ev.kind = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				if ev.data != "" {
					ev.data += "\n"
				}
				ev.data += strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	return ch
}

func getJSON(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK && v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("GET %s: %v\n%s", url, err, b)
		}
	}
	return resp.StatusCode
}

// The operator's views of a running agent (docs/protocol.md §3, added
// 2026-12-01): a device's history paged newest first while the agent runs,
// the live feed of Results and states, the writes held unknown (a write on
// a device that cannot be asked, resolved through the API), the gateway's
// status and the metrics that say the same.
func TestOperatorViews(t *testing.T) {
	held := pump("v")
	held.queryable = false
	e := newEnv(t, pump("p"), held)
	e.start()
	base := "http://" + e.app.AdminAddr()
	events := streamEvents(t, base)

	for i := 1; i <= 5; i++ {
		e.send("p", cmd(fmt.Sprintf("op-%d", i), 7, "set", fmt.Sprintf(`{"rpm":%d}`, i*100)))
		want(t, e.final(fmt.Sprintf("op-%d", i)), wire.StatusApplied, wire.CodeOK)
	}
	e.send("p", cmd("stale", 6, "set", `{"rpm":1}`))
	want(t, e.final("stale"), wire.StatusRejected, wire.CodeStaleFence)

	// History, newest first, two at a time; a stale_fence is recorded too.
	var got []agent.OpEntry
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatal("history does not end")
		}
		var page agent.OpPage
		if code := getJSON(t, base+"/v1/devices/p/ops?limit=2&before="+cursor, &page); code != http.StatusOK {
			t.Fatalf("history: HTTP %d", code)
		}
		if len(page.Ops) > 2 {
			t.Fatalf("a page of %d with limit=2", len(page.Ops))
		}
		got = append(got, page.Ops...)
		if page.Next == "" {
			break
		}
		cursor = page.Next
	}
	wantOps := []string{"stale", "op-5", "op-4", "op-3", "op-2", "op-1"}
	if len(got) != len(wantOps) {
		t.Fatalf("history has %d entries, want %d: %+v", len(got), len(wantOps), got)
	}
	for i, en := range got {
		if en.OpID != wantOps[i] || en.Device != "p" || en.Action != "set" || en.ReceivedAt.IsZero() || en.Record != "final" {
			t.Fatalf("history[%d] = %+v, want op %s", i, en, wantOps[i])
		}
	}
	if string(got[1].Params) != `{"rpm":500}` || got[1].Code != wire.CodeOK || got[0].Code != wire.CodeStaleFence {
		t.Fatalf("history entries: %+v / %+v", got[0], got[1])
	}

	// The feed had a result event for each of them, and p's state.
	seen := map[string]bool{}
	var state bool
	testkit.Eventually(t, 10*time.Second, "a result event for every op and a state event", func() bool {
		for {
			select {
			case ev := <-events:
				var r wire.Result
				switch ev.kind {
				case "result":
					if json.Unmarshal([]byte(ev.data), &r) != nil || r.Device == "" {
						t.Fatalf("result event that is no Result with a device: %q", ev.data)
					}
					seen[r.OpID] = true
				case "state":
					state = true
				}
			default:
				return state && len(seen) == len(wantOps)
			}
		}
	})

	// A write whose answer is lost on a device that cannot be asked: held
	// unknown, listed, resolved by the operator.
	if err := e.sim.SetFaults(sim.Faults{Device: "v", DropResponseRate: 1}); err != nil {
		t.Fatal(err)
	}
	e.send("v", cmd("v-1", 3, "set", `{"rpm":42}`))
	want(t, e.result("v-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	if e.sim.Injected().Dropped == 0 {
		t.Fatal("the simulator dropped no answer")
	}
	var ops agent.OpPage
	testkit.Eventually(t, 10*time.Second, "v-1 listed as held unknown", func() bool {
		getJSON(t, base+"/v1/ops?status=unknown", &ops)
		return len(ops.Ops) == 1
	})
	if h := ops.Ops[0]; h.OpID != "v-1" || h.Device != "v" || h.Status != wire.StatusUnknown || h.Queryable == nil || *h.Queryable || h.Key == "" {
		t.Fatalf("held write: %+v", h)
	}
	var st admin.GatewayStatus
	getJSON(t, base+"/v1/status", &st)
	if st.Gateway != gw || st.Version != "e2e" || !st.MQTTConnected || !st.StoreOK || !st.Ready || st.HeldUnknown != 1 || st.UptimeS < 0 {
		t.Fatalf("status while v-1 is held: %+v", st)
	}
	metrics := func() string {
		_, b := e.admin("/metrics")
		return string(b)
	}
	for _, line := range []string{
		"edge_agent_writes_held_unknown 1",
		"edge_agent_mqtt_connected 1",
		`edge_agent_device_outcomes_total{code="stale_fence",device="p"} 1`,
		`edge_agent_device_outcomes_total{code="ok",device="p"} 5`,
		`edge_agent_queue_limit{device="p",group=""} 256`,
		`edge_agent_build_info{goversion=`,
		"edge_agent_store_commit_seconds_count",
		"edge_agent_store_commit_updates_bucket",
		"edge_agent_inbox_depth 1",
		"edge_agent_event_clients 1",
	} {
		if m := metrics(); !strings.Contains(m, line) {
			t.Errorf("/metrics has no %q", line)
		}
	}
	e.sim.SetFaults(sim.Faults{})
	resp, err := http.Post(base+"/v1/devices/v/ops/v-1/resolve", "application/json", strings.NewReader(`{"applied":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("resolve: HTTP %d", resp.StatusCode)
	}
	want(t, e.final("v-1"), wire.StatusApplied, wire.CodeOK)
	getJSON(t, base+"/v1/ops?status=unknown", &ops)
	getJSON(t, base+"/v1/status", &st)
	if len(ops.Ops) != 0 || st.HeldUnknown != 0 || !strings.Contains(metrics(), "edge_agent_writes_held_unknown 0") {
		t.Fatalf("after the resolve: held %+v, status %+v", ops.Ops, st)
	}

	// Bad queries name the problem.
	for path, code := range map[string]int{
		"/v1/devices/p/ops?limit=0":       http.StatusBadRequest,
		"/v1/devices/p/ops?limit=1001":    http.StatusBadRequest,
		"/v1/devices/p/ops?before=abc":    http.StatusBadRequest,
		"/v1/devices/nope/ops":            http.StatusNotFound,
		"/v1/ops?status=final":            http.StatusBadRequest,
		"/v1/stats?seconds=0":             http.StatusBadRequest,
		"/v1/devices/p/ops?limit=1000":    http.StatusOK,
		"/v1/stats":                       http.StatusOK,
		"/":                               http.StatusOK,
		"/no-such-page":                   http.StatusNotFound,
		"/v1/devices/p/ops?before=999999": http.StatusOK,
	} {
		if got, _ := e.admin(path); got != code {
			t.Errorf("GET %s: HTTP %d, want %d", path, got, code)
		}
	}
	var stats struct {
		Points []agent.StatPoint `json:"points"`
	}
	getJSON(t, base+"/v1/stats?seconds=120", &stats)
	n := 0
	for _, p := range stats.Points {
		n += p.Commands
	}
	if len(stats.Points) != 120 || n < 7 {
		t.Fatalf("stats: %d points, %d commands (want 120 points, >= 7 commands)", len(stats.Points), n)
	}
}

// GET /v1/events?max_rate=N (an extension, for the status page under
// load): at most N events a second, bursts of N, and every event it
// skipped counted in an "skipped" event, so a client can tell a sample
// from the whole. 200 commands: every Result is either sent or counted.
func TestEventsMaxRate(t *testing.T) {
	e := newEnv(t, pump("p"))
	e.start()
	base := "http://" + e.app.AdminAddr()
	if code := getJSON(t, base+"/v1/events?max_rate=0", nil); code != http.StatusBadRequest {
		t.Fatalf("max_rate=0: %d, want 400", code)
	}
	events := streamEventsAt(t, base+"/v1/events?max_rate=5")
	start := time.Now()
	const n = 200
	for i := range n {
		e.send("p", cmd(fmt.Sprintf("r-%d", i), 7, "set", fmt.Sprintf(`{"rpm":%d}`, i)))
	}
	want(t, e.final(fmt.Sprintf("r-%d", n-1)), wire.StatusApplied, wire.CodeOK)
	var sent, skipped int
	deadline := time.After(30 * time.Second)
	for sent+skipped < n {
		select {
		case ev := <-events:
			switch ev.kind {
			case "result":
				sent++
			case "skipped":
				var k map[string]int
				if err := json.Unmarshal([]byte(ev.data), &k); err != nil {
					t.Fatalf("skipped event %q: %v", ev.data, err)
				}
				skipped += k["result"]
			}
		case <-deadline:
			t.Fatalf("%d Results sent and %d counted as skipped, want %d in all", sent, skipped, n)
		}
	}
	// The bucket: 5 at once, then 5 a second (states share it).
	if limit := 5 + 5*time.Since(start).Seconds(); float64(sent) > limit || skipped == 0 {
		t.Fatalf("%d Results sent in %s (at most %.0f), %d skipped", sent, time.Since(start), limit, skipped)
	}
}
