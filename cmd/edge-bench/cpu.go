package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of utime and stime in /proc/PID/stat (USER_HZ,
// 100 on every Linux this runs on).
const clockTick = 10 * time.Millisecond

// cpuTime reads the user+system CPU time a process has used so far from
// /proc/PID/stat (pid 0: this process). It returns 0 where /proc is not
// available; the CPU columns are then meaningless and printed as such.
func cpuTime(pid int) time.Duration {
	p := "self"
	if pid != 0 {
		p = strconv.Itoa(pid)
	}
	b, err := os.ReadFile("/proc/" + p + "/stat")
	if err != nil {
		return 0
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// fields are counted after its closing parenthesis.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	// After the name: state is field 3, utime field 14, stime field 15.
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+st) * clockTick
}

// cpuMeter samples the CPU time of named processes at two points.
type cpuMeter struct {
	names []string
	pids  []int
	start []time.Duration
}

func (m *cpuMeter) add(name string, pid int) {
	m.names = append(m.names, name)
	m.pids = append(m.pids, pid)
}

func (m *cpuMeter) begin() {
	m.start = make([]time.Duration, len(m.pids))
	for i, p := range m.pids {
		m.start[i] = cpuTime(p)
	}
}

// perCommand formats each process's CPU per command since begin, e.g.
// "mosquitto 41µs, edge-agent 230µs", and returns the same figures in the
// order the processes were added, their total last.
func (m *cpuMeter) perCommand(cmds int) (string, []time.Duration) {
	if cmds == 0 || m.start == nil {
		return "", nil
	}
	var parts []string
	var each []time.Duration
	var total time.Duration
	for i, p := range m.pids {
		d := (cpuTime(p) - m.start[i]) / time.Duration(cmds)
		total += d
		each = append(each, d)
		parts = append(parts, fmt.Sprintf("%s %s", m.names[i], d.Round(time.Microsecond)))
	}
	return fmt.Sprintf("CPU per command: %s (total %s)", strings.Join(parts, ", "), total.Round(time.Microsecond)), append(each, total)
}
