package agent

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// A subscriber that stops reading is dropped once EventBuffer events are
// waiting for it; publishing never blocks on it, and the others keep
// receiving.
func TestSlowEventClientIsDropped(t *testing.T) {
	var h hub
	slow, fast := h.subscribe(), h.subscribe()
	for i := 0; i < EventBuffer+10; i++ {
		done := make(chan struct{})
		go func() { h.publish("result", []byte(`{}`)); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("publish %d blocked", i)
		}
		<-fast.ch
	}
	select {
	case <-slow.gone:
	default:
		t.Fatal("the subscriber that never read is still subscribed")
	}
	if h.n.Load() != 1 || h.dropped.Load() != 1 {
		t.Fatalf("%d subscribers, %d dropped; want 1 and 1", h.n.Load(), h.dropped.Load())
	}
	select {
	case <-fast.gone:
		t.Fatal("the reading subscriber was dropped")
	default:
	}
	for i := 0; i < MaxEventClients-1; i++ {
		if h.subscribe() == nil {
			t.Fatalf("subscriber %d refused below MaxEventClients", i+2)
		}
	}
	if h.subscribe() != nil {
		t.Fatal("more than MaxEventClients subscribers")
	}
}

func testAgent(log *slog.Logger) *Agent {
	return &Agent{log: log, m: newMetrics(nil), stats: &statRing{}, devs: map[string]*devRT{}}
}

// The outcome line: one per outcome, at warn for the codes an operator acts
// on, with the documented keys (docs/operations.md, Logs).
func TestOutcomeLogLine(t *testing.T) {
	var buf bytes.Buffer
	a := testAgent(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})))
	a.observe(&outcome{dev: "pump-7", opID: "op-1", fence: 42, action: "set", holder: "ctl-a", code: wire.CodeOK, took: 3 * time.Millisecond})
	a.observe(&outcome{dev: "pump-7", opID: "op-2", fence: 41, action: "set", code: wire.CodeStaleFence, reason: "fence 41 is below 42"})
	a.observe(&outcome{dev: "pump-7", opID: "op-1", fence: 42, action: "set", code: wire.CodeOK, dup: true})
	a.observe(&outcome{dev: "valve-1", opID: "c1", fence: 5, action: "set", code: wire.CodeOK, rewritten: []byte(`{"open":80}`)})
	var lines []map[string]any
	dec := json.NewDecoder(&buf)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 4", len(lines))
	}
	first := lines[0]
	for k, v := range map[string]any{"msg": "outcome", "level": "INFO", "device": "pump-7", "op_id": "op-1", "fence": 42.0,
		"action": "set", "holder": "ctl-a", "code": "ok", "duration": float64(3 * time.Millisecond), "duplicate": false} {
		if first[k] != v {
			t.Errorf("key %s = %v (%T), want %v", k, first[k], first[k], v)
		}
	}
	if lines[1]["level"] != "WARN" || lines[1]["reason"] != "fence 41 is below 42" {
		t.Errorf("stale_fence line: %v", lines[1])
	}
	if lines[2]["duplicate"] != true {
		t.Errorf("replay line: %v", lines[2])
	}
	if _, ok := first["rewritten_params"]; ok {
		t.Errorf("a line without a rewrite has rewritten_params: %v", first)
	}
	if lines[3]["rewritten_params"] != `{"open":80}` {
		t.Errorf("a clamped write's line: %v", lines[3])
	}
}

// The charts' figures: outcomes per second by code, and a p99 inside the
// bucket its samples fall in.
func TestStats(t *testing.T) {
	a := testAgent(slog.New(slog.DiscardHandler))
	now := time.Unix(1_000_000, 0)
	for i := 0; i < 100; i++ {
		a.stats.add(now, wire.CodeOK, 2*time.Millisecond)
	}
	a.stats.add(now, wire.CodeStaleFence, 0)
	a.stats.add(now.Add(-time.Second), wire.CodeBusy, 0)
	pts := a.Stats(now, 3)
	if len(pts) != 3 || pts[2].T != now.Unix() {
		t.Fatalf("points %+v", pts)
	}
	if p := pts[2]; p.Commands != 101 || p.Codes["ok"] != 100 || p.Codes["stale_fence"] != 1 || p.Samples != 100 {
		t.Fatalf("this second: %+v", p)
	}
	if p := pts[2]; p.P99Ms < 1.5 || p.P99Ms > 2.6 {
		t.Fatalf("p99 %.3f ms for samples of 2 ms", p.P99Ms)
	}
	if pts[1].Commands != 1 || pts[0].Commands != 0 {
		t.Fatalf("earlier seconds: %+v", pts[:2])
	}
	// A second statSlots later reuses the slot: the old counts are gone.
	if p := a.Stats(now.Add(statSlots*time.Second), 1)[0]; p.Commands != 0 {
		t.Fatalf("a slot from %d s ago is reported: %+v", statSlots, p)
	}
}

// With the outcome's level off, logging it costs one call and allocates
// nothing (`go test -bench Outcome ./internal/agent`; BENCHMARKS.md).
func BenchmarkOutcomeLog(b *testing.B) {
	o := &outcome{dev: "pump-7", opID: "op-1", fence: 42, action: "set", holder: "ctl-a", code: wire.CodeOK, took: 3 * time.Millisecond}
	for _, bc := range []struct {
		name  string
		level slog.Level
	}{{"off", slog.LevelWarn}, {"json", slog.LevelInfo}} {
		b.Run(bc.name, func(b *testing.B) {
			a := testAgent(slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: bc.level})))
			b.ReportAllocs()
			for b.Loop() {
				a.logOutcome(o)
			}
		})
	}
}

func TestOutcomeLogOffAllocatesNothing(t *testing.T) {
	a := testAgent(slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn})))
	o := &outcome{dev: "pump-7", opID: "op-1", fence: 42, action: "set", code: wire.CodeOK}
	if n := testing.AllocsPerRun(100, func() { a.logOutcome(o) }); n != 0 {
		t.Fatalf("%v allocations per outcome with info off", n)
	}
}
