package main

import (
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/edge-agent/edge-agent/internal/chaos"
)

// faultCounts counts the faults by kind from the history (starts), with the
// agent's exits by how they ended.
func faultCounts(h *chaos.History) (map[string]int, map[string]int) {
	kinds, exits := map[string]int{}, map[string]int{}
	for _, f := range h.Faults {
		switch {
		case f.Kind == "agent_exit":
			exits[f.Detail]++
		case f.Kind == "agent_start", f.Kind == chaos.KindMemoryLost, f.Phase != "start":
		default:
			kinds[f.Kind]++
		}
	}
	return kinds, exits
}

// takeovers counts the pair's takeovers (-ha): the registration taken by
// the other agent.
func takeovers(h *chaos.History) int {
	n := 0
	for _, f := range h.Faults {
		if f.Kind == chaos.KindMemoryLost && f.Target == "takeover" {
			n++
		}
	}
	return n
}

// report prints the summary table, and writes every violation with its
// window to DIR/violations.txt.
func report(out io.Writer, h *chaos.History, res *chaos.CheckResult, dir string) {
	m := h.Meta
	agent := "-tags " + m.Tags
	if m.Mutant != "" {
		agent += " and the mutant " + m.Mutant
	}
	fmt.Fprintf(out, "\nedge-chaos: seed %d, %s of faults, broker %s, agent built with %s\n", m.Seed, m.Duration, m.Broker, agent)
	fmt.Fprintf(out, "history: %s\n\n", dir)
	fmt.Fprintf(out, "%-40s %8d\n", "commands (operations invoked)", res.Ops)
	fmt.Fprintf(out, "%-40s %8d\n", "  of which barriers", res.Barriers)
	fmt.Fprintf(out, "%-40s %8d\n", "  published (acknowledged by the broker)", res.Published)
	fmt.Fprintf(out, "%-40s %8d\n", "results delivered", res.Results)
	fmt.Fprintf(out, "%-40s %8d\n", "writes in the firmware journal", res.Journal)
	if len(m.Fleet) > 0 {
		fmt.Fprintf(out, "%-40s %8d\n", "results a controller got, the observer not", res.CtlOnly)
	}
	kinds, exits := faultCounts(h)
	if m.HA {
		fmt.Fprintf(out, "%-40s %8d\n", "takeovers (the other agent became active)", takeovers(h))
	}
	if len(m.Fleet) > 0 {
		fleetReport(out, h)
	}
	fmt.Fprintf(out, "\nfaults                                      count\n")
	seen := map[string]bool{}
	for _, k := range roundKinds(m.HA, len(m.Fleet)) {
		if seen[k] {
			continue
		}
		seen[k] = true
		fmt.Fprintf(out, "  %-40s %6d\n", k, kinds[k])
	}
	if n := kinds["operator_resolve"]; n > 0 {
		fmt.Fprintf(out, "  %-40s %6d\n", "operator_resolve (not a fault)", n)
	}
	fmt.Fprintf(out, "agent exits\n")
	for _, k := range slices.Sorted(maps.Keys(exits)) {
		fmt.Fprintf(out, "  %-40s %6d\n", k, exits[k])
	}
	fmt.Fprintf(out, "\noutcomes (first final Result per command)   count\n")
	for _, k := range slices.Sorted(maps.Keys(res.Outcomes)) {
		fmt.Fprintf(out, "  %-40s %6d\n", k, res.Outcomes[k])
	}
	fmt.Fprintf(out, "\nchecks                                 violations\n")
	for _, l := range res.Checks {
		note := ""
		if l.Note != "" {
			note = "  (" + l.Note + ")"
		}
		fmt.Fprintf(out, "  %-40s %6d%s\n", l.Name, l.Violations, note)
	}
	for _, d := range slices.Sorted(maps.Keys(res.Porcupine)) {
		if res.Porcupine[d] != "ok" {
			fmt.Fprintf(out, "  porcupine %s: %s\n", d, res.Porcupine[d])
		}
	}
	if len(res.Violations) > 0 {
		var b strings.Builder
		for i, v := range res.Violations {
			fmt.Fprintf(&b, "violation %d: [%s] %s %s at %s: %s\n", i+1, v.Check, v.Dev, v.Op, m.Stamp(v.T), v.Msg)
			for _, l := range v.Window {
				fmt.Fprintf(&b, "    %s\n", l)
			}
			b.WriteString("\n")
		}
		path := filepath.Join(dir, "violations.txt")
		_ = os.WriteFile(path, []byte(b.String()), 0o644)
		fmt.Fprintf(out, "\nfirst violations (all of them, each with its window of history: %s)\n", path)
		for i, v := range res.Violations {
			if i == 3 {
				break
			}
			fmt.Fprintf(out, "  [%s] %s %s at %s: %s\n", v.Check, v.Dev, v.Op, m.Stamp(v.T), v.Msg)
			for j, l := range v.Window {
				if j == 25 {
					fmt.Fprintf(out, "      ... (%d more lines in violations.txt)\n", len(v.Window)-25)
					break
				}
				fmt.Fprintf(out, "      %s\n", l)
			}
		}
	}
	fmt.Fprintf(out, "\nviolations: %d\n", len(res.Violations))
}

// fleetReport prints, per gateway, the commands it answered (operations
// with a Result on its topics), its Results, and the faults that hit it
// (moves count for both gateways).
func fleetReport(out io.Writer, h *chaos.History) {
	ops, results, faults := map[string]map[string]bool{}, map[string]int{}, map[string]int{}
	for _, e := range h.Events {
		if e.Src != "observer" || e.Ev != chaos.EvResult || e.Gw == "" {
			continue
		}
		if ops[e.Gw] == nil {
			ops[e.Gw] = map[string]bool{}
		}
		ops[e.Gw][e.Op] = true
		results[e.Gw]++
	}
	for _, f := range h.Faults {
		if f.Phase != "start" || f.Kind == "agent_start" || f.Kind == chaos.KindMemoryLost {
			continue
		}
		for _, gw := range h.Meta.Fleet {
			if strings.Contains(f.Target, gw) {
				faults[gw]++
			}
		}
	}
	fmt.Fprintf(out, "\n%-12s %22s %10s %10s\n", "gateway", "commands (answered)", "results", "faults")
	for _, gw := range h.Meta.Fleet {
		fmt.Fprintf(out, "  %-10s %22d %10d %10d\n", gw, len(ops[gw]), results[gw], faults[gw])
	}
}
