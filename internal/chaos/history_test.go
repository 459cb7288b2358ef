package chaos

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// A run directory written with OpenLines reads back with LoadHistory: the
// controllers' and the observer's events merged by time, the faults, and
// run.json; a last line torn by a SIGKILL of its writer is skipped.
func TestLoadHistory(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "run.json"), []byte(`{"seed":3,"broker":"embedded","devices":[{"id":"r","type":"relay","queryable":true}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctl, err := OpenLines(filepath.Join(dir, "ctl-a.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	ctl.Write(Event{T: 30, Src: "a", Ev: EvInvoked, Dev: "r", Op: "a-1", Fence: 5})
	ctl.Write(Event{T: 10, Src: "a", Ev: EvAcquired, Dev: "r", Fence: 5})
	if err := ctl.Close(); err != nil {
		t.Fatal(err)
	}
	obs, err := OpenLines(filepath.Join(dir, "observer.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	obs.Write(Event{T: 20, Src: "observer", Ev: EvResult, Op: "a-1", Result: &wire.Result{OpID: "a-1", Device: "r", Status: wire.StatusApplied, Code: wire.CodeOK}})
	obs.Close()
	f, err := os.OpenFile(filepath.Join(dir, "observer.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"t":40,"src":"observer","ev":"res`) // torn
	f.Close()
	faults, err := OpenLines(filepath.Join(dir, "faults.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	faults.Write(FaultRecord{T: 25, Kind: "agent_kill", Phase: "start"})
	faults.Close()

	h, err := LoadHistory(dir)
	if err != nil {
		t.Fatal(err)
	}
	if h.Meta.Seed != 3 || h.Meta.Broker != "embedded" {
		t.Errorf("meta %+v", h.Meta)
	}
	if d, ok := h.Meta.device("r"); !ok || d.Type != "relay" {
		t.Errorf("device r: %+v %v", d, ok)
	}
	var ts []int64
	for _, e := range h.Events {
		ts = append(ts, e.T)
	}
	if len(ts) != 3 || ts[0] != 10 || ts[1] != 20 || ts[2] != 30 {
		t.Errorf("events at %v, want [10 20 30] (merged by time, the torn line skipped)", ts)
	}
	if h.Events[1].Result == nil || h.Events[1].Result.Code != wire.CodeOK {
		t.Errorf("the observer's Result did not come back: %+v", h.Events[1])
	}
	if len(h.Faults) != 1 || h.Faults[0].Kind != "agent_kill" {
		t.Errorf("faults %+v", h.Faults)
	}
	if _, err := LoadHistory(t.TempDir()); err == nil {
		t.Errorf("a directory without run.json loaded")
	}
}
