package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"
)

// The Modbus table (BENCHMARKS.md): edge-agent with the same commands ({"v":N},
// action set) to the same simulated generic devices, over HTTP, over
// Modbus TCP (the value to holding register 0, the state read back from
// it after each write, as the HTTP device reports its state), and over
// Modbus TCP with verify: readback (one more read before each write, and
// a fast path less: the pending record waits for that read).

// modbusYAML is the agent's configuration for n generic devices d0.. on
// the simulator's Modbus listener at addr, unit IDs 1..n.
func modbusYAML(dataDir, broker, admin, addr string, n int, readback bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "gateway_id: %s\ndata_dir: %s\nmqtt:\n  broker: %s\n  client_id: edge-bench-mb-%d\nadmin:\n  listen: %q\ndevices:\n", gw, dataDir, broker, n, admin)
	verify := ""
	if readback {
		verify = ", verify: readback, settle: 200ms"
	}
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - id: d%d\n    type: generic\n    driver: {kind: modbus, url: \"tcp://%s\", unit_id: %d%s,\n", i, addr, i+1, verify)
		b.WriteString("      actions: {set: {params: {v: {register: 0}}}}, state: {v: {register: 0}}}\n")
	}
	return b.String()
}

// modbusRow is one device count's results in the Modbus table.
type modbusRow struct {
	n                      int
	http, modbus, readBack stats
}

// runModbus measures the three agents at each device count of list.
func runModbus(broker, bins, tmp string, dur time.Duration, list string) ([]modbusRow, error) {
	var rows []modbusRow
	for _, f := range splitList(list) {
		var n int
		fmt.Sscan(f, &n)
		if n < 1 || n > 255 {
			return nil, fmt.Errorf("-modbus-devices %d: one unit ID per device, 1..255", n)
		}
		row := modbusRow{n: n}
		for _, k := range []kind{agentKind, agentModbusKind, agentReadBackKind} {
			var st stats
			var err error
			pprof.Do(context.Background(), pprof.Labels("target", k.String()), func(context.Context) {
				st, err = measure(broker, n, dur, target{bins: bins, kind: k, small: true,
					dir: filepath.Join(tmp, fmt.Sprintf("mb-%s-%d", k, n))})
			})
			if err != nil {
				return nil, fmt.Errorf("%s, %d devices: %w", k, n, err)
			}
			fmt.Printf("%-8d %-12s %10.0f %9s %9s   (commands {\"v\":N})\n         %s\n", n, k, st.perSec, st.p50.Round(time.Microsecond), st.p99.Round(time.Microsecond), st.cpu)
			switch k {
			case agentKind:
				row.http = st
			case agentModbusKind:
				row.modbus = st
			default:
				row.readBack = st
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func writeModbusTable(w io.Writer, how, flags string, dur time.Duration, list string, rows []modbusRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\nedge-agent over HTTP and over Modbus TCP (%s), the same commands `{\"v\":N}`, %s per run, `go run ./cmd/edge-bench%s -duration %s -modbus-devices %s`, %s:\n\n",
		how, dur, flags, dur, list, time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintln(w, "| devices | HTTP cmds/s | HTTP p50 | Modbus cmds/s | Modbus p50 | Modbus readback cmds/s | readback p50 | Modbus/HTTP |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %d | %.0f | %s | %.0f | %s | %.0f | %s | %.2f |\n", r.n, r.http.perSec, r.http.p50.Round(time.Microsecond),
			r.modbus.perSec, r.modbus.p50.Round(time.Microsecond), r.readBack.perSec, r.readBack.p50.Round(time.Microsecond), r.modbus.perSec/r.http.perSec)
		fmt.Fprintf(w, "|  | %s | | %s | | %s | | |\n", cpuCell(r.http), cpuCell(r.modbus), cpuCell(r.readBack))
	}
}

// splitList is a comma-separated list without empty items.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
