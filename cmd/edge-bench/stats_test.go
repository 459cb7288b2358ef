package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

func ms(v ...int) []time.Duration {
	d := make([]time.Duration, len(v))
	for i, x := range v {
		d[i] = time.Duration(x) * time.Millisecond
	}
	return d
}

// latencies pools every device's latencies: p50 is the middle one, p99
// the one at 99%, per second over the measured time.
func TestLatencies(t *testing.T) {
	var dev0, dev1 []time.Duration
	for i := 1; i <= 100; i++ { // 1..200 ms over two devices, out of order
		dev0 = append(dev0, ms(201-2*i)...)
		dev1 = append(dev1, ms(2*i)...)
	}
	st, err := latencies([][]time.Duration{dev0, dev1, nil}, 4*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if st.n != 200 || st.perSec != 50 {
		t.Fatalf("n %d, %v/s, want 200 and 50/s", st.n, st.perSec)
	}
	if st.p50 != 101*time.Millisecond || st.p99 != 199*time.Millisecond {
		t.Fatalf("p50 %s p99 %s, want 101ms and 199ms", st.p50, st.p99)
	}
	one, err := latencies([][]time.Duration{ms(7)}, time.Second)
	if err != nil || one.p50 != 7*time.Millisecond || one.p99 != 7*time.Millisecond {
		t.Fatalf("one sample: %+v, %v", one, err)
	}
	if _, err := latencies([][]time.Duration{nil, {}}, time.Second); err == nil {
		t.Fatal("no latencies: no error")
	}
}

func TestMedians(t *testing.T) {
	for _, tt := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{9, 1, 5}, 5},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		in := append([]float64(nil), tt.in...)
		if got := median(in); got != tt.want {
			t.Errorf("median(%v) = %v, want %v", tt.in, got, tt.want)
		}
		for i := range in {
			if in[i] != tt.in[i] {
				t.Fatalf("median reordered its argument: %v", in)
			}
		}
	}
	if got := medianDuration(ms(30, 10, 20)); got != 20*time.Millisecond {
		t.Errorf("medianDuration = %s, want 20ms", got)
	}
	if got := medianDuration(ms(40, 10, 30, 20)); got != 30*time.Millisecond {
		t.Errorf("medianDuration of four = %s, want the upper middle 30ms", got)
	}
	if got := fmtRuns([]float64{1234.4, 99.5, 7}); got != "1234, 100, 7" {
		t.Errorf("fmtRuns = %q", got)
	}
}

func TestFloor(t *testing.T) {
	f := floor{commit: 1500 * time.Microsecond, write: 300 * time.Microsecond}
	if f.total() != 3300*time.Microsecond {
		t.Fatalf("total %s, want two commits and a write", f.total())
	}
	if got, want := f.String(), "floor 3.3ms = 2 x commit 1.5ms + device write 300µs"; got != want {
		t.Fatalf("String = %q, want %q", got, want)
	}
}

func TestCPUCells(t *testing.T) {
	st := stats{cpuNames: []string{"mosquitto", "edge-agent", "edge-bench"},
		cpuParts: []time.Duration{50 * time.Microsecond, 230 * time.Microsecond, 56 * time.Microsecond, 336 * time.Microsecond}}
	if got, want := cpuCell(st), "mosquitto 50 + edge-agent 230 + edge-bench 56 = 336 µs CPU"; got != want {
		t.Fatalf("cpuCell = %q, want %q", got, want)
	}
	if got := cpuCell(stats{}); got != "" {
		t.Fatalf("cpuCell of no meter = %q", got)
	}
	if got := agentCPU(st); got != 230*time.Microsecond {
		t.Fatalf("agentCPU = %s, want edge-agent's part", got)
	}
	// -inprocess: one process for everything; the agent's is the total.
	in := stats{cpuNames: []string{"edge-bench"}, cpuParts: []time.Duration{90 * time.Microsecond, 90 * time.Microsecond}}
	if got := agentCPU(in); got != 90*time.Microsecond {
		t.Fatalf("agentCPU in process = %s", got)
	}
	if got := agentCPU(stats{}); got != 0 {
		t.Fatalf("agentCPU of no meter = %s", got)
	}
}

// The meter reads this process's own CPU time from /proc: it grows with
// work, and perCommand divides it by the commands.
func TestCPUMeterOnThisProcess(t *testing.T) {
	pid := os.Getpid()
	before := cpuTime(pid)
	var m cpuMeter
	m.add("self", pid)
	if s, parts := m.perCommand(10); s != "" || parts != nil {
		t.Fatalf("perCommand before begin = %q %v", s, parts)
	}
	m.begin()
	spin := time.Now().Add(100 * time.Millisecond)
	for x := 0; time.Now().Before(spin); x++ {
		_ = strings.Repeat("x", x%64)
	}
	if after := cpuTime(pid); after <= before {
		t.Fatalf("cpuTime did not grow: %s then %s", before, after)
	}
	s, parts := m.perCommand(10)
	if len(parts) != 2 || parts[0] <= 0 || parts[1] != parts[0] {
		t.Fatalf("parts %v, want this process's share and the same total", parts)
	}
	if !strings.HasPrefix(s, "CPU per command: self ") || !strings.Contains(s, "(total ") {
		t.Fatalf("perCommand = %q", s)
	}
	if s, parts := m.perCommand(0); s != "" || parts != nil {
		t.Fatalf("perCommand of no commands = %q %v", s, parts)
	}
}
