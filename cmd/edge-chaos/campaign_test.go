package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/chaos"
	"github.com/edge-agent/edge-agent/internal/rig"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// needs skips a test when a server the campaign runs is not installed
// (CI installs them: .ci/run; there a missing one fails).
func needs(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("the chaos campaign runs for minutes; not with -short")
	}
	for _, bin := range []string{"/usr/bin/etcd", "mosquitto"} {
		if _, err := exec.LookPath(bin); err != nil {
			if _, err2 := os.Stat("/usr/sbin/" + bin); err2 == nil {
				continue
			}
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed (.ci/run installs it)", bin)
			}
			t.Skipf("%s is not installed", bin)
		}
	}
}

// runBin runs edge-chaos with args (in dir) within limit and returns its
// output and exit code.
func runBin(t *testing.T, dir string, limit time.Duration, args ...string) (string, int) {
	t.Helper()
	bin := testkit.Build(t, ".")
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("edge-chaos %v did not end within %v:\n%s", args, limit, testkit.Tail(string(out), 6000))
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("edge-chaos: %v", err)
	}
	return string(out), code
}

// count reads a number from the report: the row named label.
func count(t *testing.T, out, label string) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(label) + `\s+(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the report has no row %q:\n%s", label, testkit.Tail(out, 6000))
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// A short fixed-seed campaign (make test): real processes, every fault of
// one round of the schedule, and a history without a violation. The
// faults are shown to have happened (the report counts them, the agent
// was killed and crashed at its crash points, stale holders were fenced,
// its store was wiped and restored, a clone was refused).
func TestCampaignShortRun(t *testing.T) {
	needs(t)
	agent := testkit.Build(t, "../edge-agent", "failpoints")
	fw := testkit.Build(t, "../../firmware-sim")
	dir := filepath.Join(t.TempDir(), "history")
	out, code := runBin(t, ".", 4*time.Minute, "run", "-seed", "7", "-duration", "60s", "-settle", "45s",
		"-agent", agent, "-firmware", fw, "-out", dir, "-porcupine-timeout", "30s")
	if code != 0 || !regexp.MustCompile(`(?m)^violations: 0$`).MatchString(out) {
		v, _ := os.ReadFile(filepath.Join(dir, "violations.txt"))
		t.Fatalf("edge-chaos exit %d:\n%s\n%s", code, testkit.Tail(out, 8000), testkit.Tail(string(v), 8000))
	}
	if n := count(t, out, "commands (operations invoked)"); n < 500 {
		t.Errorf("only %d commands in 60s", n)
	}
	for _, k := range []string{fCtlStale, fCtlKill, fAgentCrashPoint, fAgentSlowFsync, fBrokerRestart, fEtcdLeaderKill, fFwKill, fAgentWipe, fAgentRestore, fAgentClone} {
		if count(t, out, k) == 0 {
			t.Errorf("fault %s was not injected", k)
		}
	}
	if !regexp.MustCompile(`one agent per gateway \(clones\) +0  \([1-9][0-9]* refused`).MatchString(out) {
		t.Errorf("no clone of the gateway was started and refused")
	}
	if count(t, out, "signal killed") == 0 {
		t.Errorf("the agent was never killed")
	}
	t.Logf("%s", testkit.Tail(out, 3000))
}

// A short fixed-seed campaign of the standby pair (make test; make chaos
// HA=1): two agents, kills, pauses and etcd partitions of either among the
// other faults, at least one takeover, and no violation.
func TestCampaignHAShortRun(t *testing.T) {
	needs(t)
	agent := testkit.Build(t, "../edge-agent", "failpoints")
	fw := testkit.Build(t, "../../firmware-sim")
	dir := filepath.Join(t.TempDir(), "history")
	out, code := runBin(t, ".", 4*time.Minute, "run", "-ha", "-seed", "5", "-duration", "45s", "-settle", "45s",
		"-agent", agent, "-firmware", fw, "-out", dir, "-porcupine-timeout", "30s")
	if code != 0 || !regexp.MustCompile(`(?m)^violations: 0$`).MatchString(out) {
		v, _ := os.ReadFile(filepath.Join(dir, "violations.txt"))
		t.Fatalf("edge-chaos -ha exit %d:\n%s\n%s", code, testkit.Tail(out, 8000), testkit.Tail(string(v), 8000))
	}
	if n := count(t, out, "takeovers (the other agent became active)"); n == 0 {
		t.Errorf("no takeover in the pair")
	}
	for _, k := range []string{fHAKill, fHAPause, fHAPartition} {
		if count(t, out, k) == 0 {
			t.Errorf("fault %s was not injected", k)
		}
	}
	if n := count(t, out, "commands (operations invoked)"); n < 300 {
		t.Errorf("only %d commands in 45s", n)
	}
	t.Logf("%s", testkit.Tail(out, 3000))
}

// A short fixed-seed fleet campaign (CHAOS_FLEET=1 make test; make chaos
// FLEET=3): three gateways on the 3-node NATS cluster and the 3-member
// etcd, broker node kills, etcd member kills, device moves between
// gateways and each gateway's wipes, restores and kills among the other
// faults; commands answered by every gateway, and no violation. Not in a
// plain make test: it passed in four clean-clone runs and failed in the
// fifth, where a held write on a device that cannot be asked was never
// resolved by the campaign's operator (its resolve met the gateway
// restarting) and the device's later commands had no final Result by the
// end (docs/testing.md).
func TestCampaignFleetShortRun(t *testing.T) {
	if os.Getenv("CHAOS_FLEET") != "1" {
		t.Skip("set CHAOS_FLEET=1 to run the fleet slice (three gateways on a NATS cluster, about 90 s)")
	}
	needs(t)
	if _, err := rig.FindNATS(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	agent := testkit.Build(t, "../edge-agent", "failpoints")
	fw := testkit.Build(t, "../../firmware-sim")
	dir := filepath.Join(t.TempDir(), "history")
	out, code := runBin(t, ".", 4*time.Minute, "run", "-fleet", "3", "-broker", "nats", "-seed", "3", "-duration", "60s", "-settle", "45s",
		"-agent", agent, "-firmware", fw, "-out", dir, "-porcupine-timeout", "30s")
	if code != 0 || !regexp.MustCompile(`(?m)^violations: 0$`).MatchString(out) {
		v, _ := os.ReadFile(filepath.Join(dir, "violations.txt"))
		// Why the operator left writes held, if it did.
		var refusals []string
		faults, _ := chaos.ReadLines[chaos.FaultRecord](filepath.Join(dir, "faults.jsonl"))
		for _, f := range faults {
			if f.Kind == "operator_resolve" && f.Phase == "error" {
				refusals = append(refusals, f.Target+": "+f.Detail)
			}
		}
		t.Fatalf("edge-chaos -fleet 3 exit %d:\n%s\n%s\noperator's refusals:\n%s", code, testkit.Tail(out, 8000), testkit.Tail(string(v), 8000), testkit.Tail(strings.Join(refusals, "\n"), 4000))
	}
	for _, k := range []string{fNATSKill, fEtcdMemberKill, fDeviceMove, fAgentWipe, fAgentRestore, fAgentKill} {
		if count(t, out, k) == 0 {
			t.Errorf("fault %s was not injected", k)
		}
	}
	for _, gw := range []string{"gw1", "gw2", "gw3"} {
		if n := count(t, out, gw); n < 50 {
			t.Errorf("gateway %s answered only %d commands", gw, n)
		}
	}
	// A move's end names the new gateway's floor for the device.
	faults, _ := os.ReadFile(filepath.Join(dir, "faults.jsonl"))
	if !regexp.MustCompile(`"device_move","phase":"end"[^\n]*fronts it: true; its fence floor [1-9]`).Match(faults) {
		t.Errorf("no device moved to a gateway that took a fence floor for it")
	}
	if !regexp.MustCompile(`"broker_node_kill","phase":"end"[^\n]*accepts MQTT clients`).Match(faults) {
		t.Errorf("no NATS node was killed and restarted")
	}
	t.Logf("%s", testkit.Tail(out, 3000))
}

// make chaos-mutants, as a test (CHAOS_MUTANTS=1 make test): every mutant
// agent (cmd/edge-chaos/mutants/) is caught by a fixed-seed campaign.
func TestMutantsAreCaught(t *testing.T) {
	if os.Getenv("CHAOS_MUTANTS") != "1" {
		t.Skip("set CHAOS_MUTANTS=1 to build every mutant agent and run the campaign against each (about 15 minutes)")
	}
	needs(t)
	out, code := runBin(t, "../..", 45*time.Minute, "mutants", "-seed", "1", "-duration", "60s", "-settle", "30s")
	if code != 0 || !regexp.MustCompile(`(?m)^caught 8/8$`).MatchString(out) {
		t.Fatalf("edge-chaos mutants exit %d:\n%s", code, out)
	}
	t.Logf("%s", out)
}
