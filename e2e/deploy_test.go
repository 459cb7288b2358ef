package e2e

import (
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// seriesRe finds the agent's series names in a PromQL expression (and
// process_*, from the process collector the agent registers). Prometheus's
// own `up` is not the agent's to export.
var seriesRe = regexp.MustCompile(`\b(edge_[a-z0-9_]+|process_[a-z0-9_]+)\b`)

// exprs collects every string under an "expr", "query" or "definition" key.
func exprs(v any, out *[]string) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && (k == "expr" || k == "query" || k == "definition") {
				*out = append(*out, s)
				continue
			}
			exprs(e, out)
		}
	case []any:
		for _, e := range x {
			exprs(e, out)
		}
	}
}

// The Grafana dashboard and the alerting rules in deploy/ name only series
// that a running agent exports: the agent runs with a policy plugin bound,
// handles a command, and its /metrics is scraped.
func TestDashboardAndAlertsUseExportedMetrics(t *testing.T) {
	dir := plugins(t)
	e := newEnv(t, withPolicy(pump("pump-7"), "range-limit", `{param: rpm, min: 0, max: 3000}`))
	e.extra = "plugins:\n  dir: " + dir + "\n"
	e.start()
	e.send("pump-7", cmd("op-1", 1, "set", `{"rpm":1200}`))
	want(t, e.final("op-1"), wire.StatusApplied, wire.CodeOK)

	// The outcome's counters are counted just after its Result is handed
	// to the publisher: scrape until the command is counted.
	exported := map[string]bool{}
	testkit.Eventually(t, 10*time.Second, "op-1 counted in /metrics", func() bool {
		code, body := e.admin("/metrics")
		if code != 200 {
			t.Fatalf("/metrics: HTTP %d", code)
		}
		clear(exported)
		for _, line := range strings.Split(string(body), "\n") {
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			name := line[:strings.IndexAny(line, "{ ")]
			exported[name] = true
		}
		return exported["edge_agent_device_outcomes_total"]
	})

	var used []string
	var dash any
	b, err := os.ReadFile("../deploy/grafana/edge-agent.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("deploy/grafana/edge-agent.json: %v", err)
	}
	exprs(dash, &used)
	var rules any
	b, err = os.ReadFile("../deploy/prometheus/edge-agent-rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatalf("deploy/prometheus/edge-agent-rules.yml: %v", err)
	}
	nDash := len(used)
	exprs(rules, &used)
	if nDash < 20 || len(used)-nDash < 9 {
		t.Fatalf("found %d expressions in the dashboard and %d in the rules: the walk misses them", nDash, len(used)-nDash)
	}
	names := map[string]bool{}
	for _, x := range used {
		for _, n := range seriesRe.FindAllString(x, -1) {
			names[n] = true
		}
	}
	var missing []string
	for n := range names {
		if !exported[n] {
			missing = append(missing, n)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Fatalf("deploy/ uses series the agent does not export: %s", strings.Join(missing, ", "))
	}
	if len(names) < 20 {
		t.Fatalf("only %d series names found in deploy/: %v", len(names), names)
	}
}
