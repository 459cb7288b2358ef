// Package deploy holds what runs beside the agent: a Grafana dashboard
// (grafana/edge-agent.json) and Prometheus alerting rules
// (prometheus/edge-agent-rules.yml) with their unit tests. This file runs
// those tests; e2e/deploy_test.go checks both name only series a running
// agent exports.
package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("no promtool installed (Debian: apt-get install prometheus)")
	}
	return p
}

// The alerting rules are valid and their unit tests pass: each alert fires
// on the series that should page and stays quiet on the others
// (prometheus/edge-agent-rules.test.yml).
func TestAlertRules(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", "edge-agent-rules.yml"},
		{"test", "rules", "edge-agent-rules.test.yml"},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = "prometheus"
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if !strings.Contains(string(out), "SUCCESS") {
			t.Fatalf("promtool %s said no SUCCESS:\n%s", strings.Join(args, " "), out)
		}
	}
}

// The dashboard is one Grafana dashboard: unique panel IDs, each panel with
// a title, a place and at least one query on the templated data source.
func TestDashboardShape(t *testing.T) {
	b, err := os.ReadFile("grafana/edge-agent.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Title  string `json:"title"`
		Panels []struct {
			ID      int            `json:"id"`
			Title   string         `json:"title"`
			Type    string         `json:"type"`
			GridPos map[string]int `json:"gridPos"`
			Targets []struct {
				Expr       string `json:"expr"`
				Datasource struct {
					UID string `json:"uid"`
				} `json:"datasource"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" || len(d.Panels) < 10 {
		t.Fatalf("dashboard uid %q title %q with %d panels", d.UID, d.Title, len(d.Panels))
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] || p.ID == 0 {
			t.Errorf("panel %q: id %d repeated or missing", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Title == "" || p.Type == "" || p.GridPos["w"] == 0 || len(p.Targets) == 0 {
			t.Errorf("panel %d: title %q type %q gridPos %v targets %d", p.ID, p.Title, p.Type, p.GridPos, len(p.Targets))
		}
		for _, tg := range p.Targets {
			if tg.Expr == "" || tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: a target with expr %q on data source %q", p.Title, tg.Expr, tg.Datasource.UID)
			}
		}
	}
}

// The dashboard serves a fleet: a gateway variable (from
// edge_agent_gateway_info) that narrows the instance variable every panel
// filters on, and a fleet row of gateways online, gateways down (the
// EdgeAgentGatewayDown expression) and held writes per gateway.
func TestDashboardFleetRow(t *testing.T) {
	b, err := os.ReadFile("grafana/edge-agent.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Definition
	}
	if vars["gateway"] != "label_values(edge_agent_gateway_info, gateway)" || !strings.Contains(vars["instance"], `gateway=~"$gateway"`) {
		t.Fatalf("variables: %v", vars)
	}
	rules, err := os.ReadFile("prometheus/edge-agent-rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	fleet := map[string]string{}
	for _, p := range d.Panels {
		if strings.HasPrefix(p.Title, "Fleet: ") {
			fleet[p.Title] = p.Targets[0].Expr
		}
	}
	for title, want := range map[string]string{
		"Fleet: gateways online":                 "edge_agent_mqtt_connected",
		"Fleet: gateways down":                   "unless on (instance) (up{job=\"edge-agent\"} == 1 and on (instance) edge_agent_mqtt_connected == 1)",
		"Fleet: writes held unknown per gateway": "sum by (gateway) (edge_agent_writes_held_unknown",
	} {
		if !strings.Contains(fleet[title], want) || !strings.Contains(fleet[title], `edge_agent_gateway_info{gateway=~"$gateway"}`) {
			t.Errorf("panel %q: %q, want it to use %q by gateway", title, fleet[title], want)
		}
	}
	if down := fleet["Fleet: gateways down"]; !strings.Contains(string(rules), "unless on (instance) (up{job=\"edge-agent\"} == 1 and on (instance) edge_agent_mqtt_connected == 1)") || down == "" {
		t.Error("the gateways-down panel and the EdgeAgentGatewayDown alert must agree")
	}
	// Each fleet panel's expression, with every gateway selected, is one
	// that promtool evaluates on a fleet with an ha pair
	// (prometheus/edge-agent-rules.test.yml, TestAlertRules runs it).
	tests, err := os.ReadFile("prometheus/edge-agent-rules.test.yml")
	if err != nil {
		t.Fatal(err)
	}
	for title, expr := range fleet {
		if e := strings.ReplaceAll(expr, "$gateway", ".*"); !strings.Contains(string(tests), "- expr: '"+e+"'") {
			t.Errorf("panel %q: its expression is not tested in prometheus/edge-agent-rules.test.yml:\n%s", title, e)
		}
	}
	for _, alert := range []string{"unless on (gateway) ((edge_agent_mqtt_connected == 1 and on (instance) up{job=\"edge-agent\"} == 1) * on (instance) group_left (gateway) edge_agent_gateway_info)"} {
		if !strings.Contains(string(rules), alert) || !strings.Contains(fleet["Fleet: gateways down"], alert) {
			t.Errorf("the alert and the gateways-down panel must both leave out a gateway with another instance connected (a standby): %s", alert)
		}
	}
}
