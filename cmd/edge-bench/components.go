package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/google/pprof/profile"
)

// A component is a part of the agent's work per command, recognised in a
// CPU profile by the functions on a sample's stack. The rules are tried in
// order and the first that matches takes the sample, so a part nested in
// another (an fsync in a commit, a log call in a worker) is counted apart.
type component struct {
	name string
	any  []string // a frame whose function name contains one of these
	also []string // and, when set, another frame containing one of these
}

var components = []component{
	// In -inprocess mode the firmware simulator runs in the agent's
	// labelled goroutines; its work (the server side of every device
	// write) is the device's, not the agent's, and is left out.
	{name: simulatorPart, any: []string{"firmware-sim/sim.", "net/http.(*conn).serve", "net/http.(*Server)"}},
	{name: "fsync (bbolt's fdatasync)", any: []string{"syscall.Fdatasync", "syscall.Fsync", "unix.Fdatasync", "(*FD).Fsync", "bbolt.fdatasync"}},
	{name: "logging (log/slog)", any: []string{"log/slog."}},
	{name: "garbage collection", any: []string{"runtime.gcBgMarkWorker", "runtime.gcAssistAlloc", "runtime.bgsweep", "runtime.bgscavenge"}},
	{name: "parse (command parser, content hash)", any: []string{"edge-agent/controller/wire.ParseCommand", "edge-agent/controller/wire.fromMembers", "internal/wirefast.ParseCommand", "internal/wirefast.ContentHash", "internal/wirefast.Canonical"}},
	{name: "store updates (the agent's functions in a commit)", any: []string{"internal/agent.", "edge-agent/agent."}, also: []string{"(*Store).commitWith"}},
	{name: "commit (bbolt's commit, page writes, the group commit)", any: []string{"internal/store.", "edge-agent/store.", "go.etcd.io/bbolt."}},
	{name: "HTTP to the device (driver, net/http)", any: []string{"internal/device.", "edge-agent/device.", "net/http.", "go-retryablehttp"}},
	{name: "MQTT (paho, the session, the publisher)", any: []string{"eclipse/paho", "internal/mqtt.", "edge-agent/mqtt.", "(*publisher)"}},
	{name: "Result and state encoding", any: []string{"internal/wirefast.Marshal", "internal/wirefast.append"}},
	{name: "policy host", any: []string{"internal/policy.", "edge-agent/policy.", "tetratelabs/wazero"}},
	{name: "scheduler and goroutine hand-offs", any: []string{"runtime.schedule", "runtime.findRunnable", "runtime.park_m", "runtime.goready", "runtime.ready", "runtime.mcall", "runtime.futex", "runtime.notewakeup", "runtime.wakep"}},
	{name: "the rest of the agent (intake, workers, admin)", any: []string{"internal/agent.", "internal/app.", "edge-agent/agent.", "edge-agent/app."}},
	{name: "other (runtime, syscalls not above)", any: []string{""}},
}

const simulatorPart = "the firmware simulator (in this process; not the agent's)"

// componentTable reads a CPU profile written with -cpuprofile -inprocess,
// keeps the samples labelled target=edge-agent, and writes a Markdown table
// of the agent's CPU per component, per command (commands: how many the
// agent answered while the profile ran).
func componentTable(w io.Writer, path string, commands int) error {
	return componentTableOf(w, path, agentKind.String(), commands)
}

// componentTableOf is componentTable for the samples labelled target=label.
func componentTableOf(w io.Writer, path, label string, commands int) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	cpu := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" {
			cpu = i
		}
	}
	if cpu < 0 {
		return fmt.Errorf("%s: not a CPU profile", path)
	}
	per := make([]time.Duration, len(components))
	var total time.Duration
	for _, s := range p.Sample {
		if !hasLabel(s, "target", label) {
			continue
		}
		d := time.Duration(s.Value[cpu])
		total += d
		frames := frameNames(s)
		for i, c := range components {
			if matches(frames, c.any) && (c.also == nil || matches(frames, c.also)) {
				per[i] += d
				if c.name == simulatorPart {
					total -= d
				}
				break
			}
		}
	}
	if total == 0 || commands == 0 {
		return fmt.Errorf("%s: no samples of the agent (run with -inprocess -cpuprofile)", path)
	}
	order := make([]int, len(components))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return per[order[a]] > per[order[b]] })
	fmt.Fprintf(w, "| part | share | µs CPU per command |\n|---|---|---|\n")
	for _, i := range order {
		if per[i] == 0 || components[i].name == simulatorPart {
			continue
		}
		fmt.Fprintf(w, "| %s | %.0f%% | %.1f |\n", components[i].name, 100*float64(per[i])/float64(total),
			float64(per[i].Microseconds())/float64(commands))
	}
	fmt.Fprintf(w, "| **the agent, in all** | 100%% | %.1f |\n", float64(total.Microseconds())/float64(commands))
	return nil
}

func hasLabel(s *profile.Sample, k, v string) bool {
	for _, x := range s.Label[k] {
		if x == v {
			return true
		}
	}
	return false
}

func frameNames(s *profile.Sample) []string {
	var out []string
	for _, loc := range s.Location {
		for _, l := range loc.Line {
			if l.Function != nil {
				out = append(out, l.Function.Name)
			}
		}
	}
	return out
}

func matches(frames, subs []string) bool {
	for _, f := range frames {
		for _, s := range subs {
			if strings.Contains(f, s) {
				return true
			}
		}
	}
	return false
}
