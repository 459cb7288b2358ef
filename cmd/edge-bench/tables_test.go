package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

func TestModbusTable(t *testing.T) {
	var b bytes.Buffer
	writeModbusTable(&b, "processes", "", 5*time.Second, "1,8", nil)
	if b.Len() != 0 {
		t.Fatalf("no rows wrote %q", b.String())
	}
	row := modbusRow{n: 8,
		http:     stats{perSec: 1000, p50: 7800 * time.Microsecond},
		modbus:   stats{perSec: 1500, p50: 5200 * time.Microsecond, cpuNames: []string{"edge-agent"}, cpuParts: []time.Duration{200 * time.Microsecond, 200 * time.Microsecond}},
		readBack: stats{perSec: 500, p50: 15 * time.Millisecond}}
	writeModbusTable(&b, "processes", " -modbus", 5*time.Second, "1,8", []modbusRow{row})
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if !strings.Contains(lines[0], "`go run ./cmd/edge-bench -modbus -duration 5s -modbus-devices 1,8`") {
		t.Fatalf("heading %q does not give the command", lines[0])
	}
	want := []string{
		"| devices | HTTP cmds/s | HTTP p50 | Modbus cmds/s | Modbus p50 | Modbus readback cmds/s | readback p50 | Modbus/HTTP |",
		"|---|---|---|---|---|---|---|---|",
		"| 8 | 1000 | 7.8ms | 1500 | 5.2ms | 500 | 15ms | 1.50 |",
		"|  |  | | edge-agent 200 = 200 µs CPU | |  | | |",
	}
	if got := lines[len(lines)-4:]; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("table:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestFootprintCells(t *testing.T) {
	if got := mib(3 << 19); got != "1.5 MiB" {
		t.Errorf("mib = %q", got)
	}
	mosq := footprintRow{broker: "mosquitto", brokerBytes: 812.4, brokerStore: 1 << 20}
	emb := footprintRow{broker: "embedded", brokerBytes: 99, brokerStore: 5 << 20}
	for _, tt := range []struct{ got, want string }{
		{brokerCell(mosq), "812"},
		{brokerCell(emb), "(in the agent)"},
		{embeddedCell(mosq), ""},
		{embeddedCell(emb), "5.0 MiB"},
	} {
		if tt.got != tt.want {
			t.Errorf("cell %q, want %q", tt.got, tt.want)
		}
	}
}

func TestFootprintPluginsTable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bench.md")
	if err := os.WriteFile(path, []byte("before\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	vs := fpAll[:2]
	if err := appendFootprintTable(path, vs, []string{"| baseline | cold | row |"}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	s := string(b)
	for _, want := range []string{"before\n", "- `baseline`: as shipped\n", "- `no-plugins`: ", "| variant | start |", "| baseline | cold | row |\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("table lacks %q:\n%s", want, s)
		}
	}
}

// writeProfile writes a real pprof CPU profile with one sample per
// (target label, stack, nanoseconds).
func writeProfile(t *testing.T, samples []struct {
	target string
	stack  []string
	ns     int64
}) string {
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"},
		Period:     10_000_000,
	}
	fns := map[string]*profile.Function{}
	for _, s := range samples {
		var locs []*profile.Location
		for _, name := range s.stack {
			fn := fns[name]
			if fn == nil {
				fn = &profile.Function{ID: uint64(len(fns) + 1), Name: name}
				fns[name] = fn
				p.Function = append(p.Function, fn)
			}
			loc := &profile.Location{ID: uint64(len(p.Location) + 1), Line: []profile.Line{{Function: fn}}}
			p.Location = append(p.Location, loc)
			locs = append(locs, loc)
		}
		p.Sample = append(p.Sample, &profile.Sample{Location: locs, Value: []int64{1, s.ns}, Label: map[string][]string{"target": {s.target}}})
	}
	if err := p.CheckValid(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Write(f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// The component table counts the target's samples only, the first
// matching rule takes a sample (an fsync inside a commit is the fsync's),
// the simulator's work is left out of the agent's total, and the rows
// come largest first.
func TestComponentTable(t *testing.T) {
	path := writeProfile(t, []struct {
		target string
		stack  []string
		ns     int64
	}{
		{"edge-agent", []string{"syscall.Fdatasync", "go.etcd.io/bbolt.(*Tx).Commit", "internal/store.(*Store).commitWith"}, 3_000_000},
		{"edge-agent", []string{"go.etcd.io/bbolt.(*Tx).Commit", "internal/store.(*Store).commitWith"}, 1_000_000},
		{"edge-agent", []string{"github.com/eclipse/paho.mqtt.golang.(*client).Publish"}, 2_000_000},
		{"edge-agent", []string{"github.com/edge-agent/edge-agent/firmware-sim/sim.(*Sim).apply"}, 5_000_000},
		{"echo", []string{"syscall.Fdatasync"}, 9_000_000},
	})
	var b bytes.Buffer
	if err := componentTableOf(&b, path, "edge-agent", 100); err != nil {
		t.Fatal(err)
	}
	want := "| part | share | µs CPU per command |\n|---|---|---|\n" +
		"| fsync (bbolt's fdatasync) | 50% | 30.0 |\n" +
		"| MQTT (paho, the session, the publisher) | 33% | 20.0 |\n" +
		"| commit (bbolt's commit, page writes, the group commit) | 17% | 10.0 |\n" +
		"| **the agent, in all** | 100% | 60.0 |\n"
	if b.String() != want {
		t.Fatalf("table:\n%s\nwant:\n%s", b.String(), want)
	}
	if err := componentTableOf(&b, path, "agent-signed", 100); err == nil {
		t.Fatal("no samples of the target: no error")
	}
	if err := componentTableOf(&b, path, "edge-agent", 0); err == nil {
		t.Fatal("no commands: no error")
	}
	notProfile := filepath.Join(t.TempDir(), "x")
	os.WriteFile(notProfile, []byte("not a profile"), 0o644)
	if err := componentTableOf(&b, notProfile, "edge-agent", 1); err == nil {
		t.Fatal("not a profile: no error")
	}
}
