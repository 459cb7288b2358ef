package e2e

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// The series an operator alerts on, scraped from a running agent: a
// device's last_fence, whether it is reachable and when it last answered,
// the age of the oldest held write, build_info's revision, and
// device_outcomes_total present from 0 for a device that has had no
// command.
func TestMetricsAnOperatorAlertsOn(t *testing.T) {
	held := pump("pump-h")
	held.queryable = false
	gone := pump("pump-gone")
	gone.url = "http://" + testkit.FreeAddr(t)
	e := newEnv(t, pump("pump-7"), pump("pump-idle"), held, gone)
	e.start()

	scrape := func() string {
		t.Helper()
		code, body := e.admin("/metrics")
		if code != 200 {
			t.Fatalf("/metrics: HTTP %d", code)
		}
		return string(body)
	}
	sample := func(body, series string) (float64, bool) {
		for _, line := range strings.Split(body, "\n") {
			if rest, ok := strings.CutPrefix(line, series+" "); ok {
				v, err := strconv.ParseFloat(rest, 64)
				return v, err == nil
			}
		}
		return 0, false
	}

	body := scrape()
	if v, ok := sample(body, `edge_agent_device_outcomes_total{code="ok",device="pump-idle"}`); !ok || v != 0 {
		t.Errorf("pump-idle's ok outcomes before any command: %v %v", v, ok)
	}
	if _, ok := sample(body, `edge_agent_device_reachable{device="pump-idle"}`); ok {
		t.Error("pump-idle reachable before any try")
	}
	if !regexp.MustCompile(`(?m)^edge_agent_build_info\{goversion="go[^"]+",revision="[^"]+",version="[^"]+"\} 1$`).MatchString(body) {
		t.Errorf("build_info without a revision:\n%s", grepLines(body, "build_info"))
	}

	e.send("pump-7", cmd("op-1", 742, "set", `{"rpm":1200}`))
	want(t, e.final("op-1"), wire.StatusApplied, wire.CodeOK)
	e.send("pump-gone", cmd("g1", 1, "set", `{"rpm":1}`))
	want(t, e.final("g1"), wire.StatusFailed, wire.CodeDeviceUnreachable)
	if err := e.sim.SetFaults(sim.Faults{Device: "pump-h", DropResponseRate: 1}); err != nil {
		t.Fatal(err)
	}
	e.send("pump-h", cmd("h1", 2, "set", `{"rpm":30}`))
	want(t, e.result("h1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)

	testkit.Eventually(t, 10*time.Second, "the series after the commands", func() bool {
		body = scrape()
		lf, _ := sample(body, `edge_agent_device_last_fence{device="pump-7"}`)
		up7, ok7 := sample(body, `edge_agent_device_reachable{device="pump-7"}`)
		upGone, okGone := sample(body, `edge_agent_device_reachable{device="pump-gone"}`)
		contact, okC := sample(body, `edge_agent_device_last_contact_timestamp_seconds{device="pump-7"}`)
		_, goneContact := sample(body, `edge_agent_device_last_contact_timestamp_seconds{device="pump-gone"}`)
		age, okAge := sample(body, `edge_agent_oldest_held_write_age_seconds`)
		return lf == 742 && ok7 && up7 == 1 && okGone && upGone == 0 && okC &&
			time.Since(time.Unix(int64(contact), 0)) < time.Minute && !goneContact && okAge && age > 0
	})
	if v, _ := sample(body, `edge_agent_device_outcomes_total{code="ok",device="pump-7"}`); v != 1 {
		t.Errorf("pump-7's ok outcomes: %v", v)
	}
}

func grepLines(body, what string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.Contains(l, what) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
