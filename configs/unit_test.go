package configs_test

import (
	"bufio"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/edge-agent/edge-agent/internal/config"
	_ "github.com/edge-agent/edge-agent/internal/device" // registers the driver kinds
)

// unitSettings reads edge-agent.service into key -> values (in order).
func unitSettings(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open("edge-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, "[") {
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			t.Fatalf("not KEY=VALUE: %q", l)
		}
		m[k] = append(m[k], v)
	}
	return m
}

// The hardening docs/operations.md promises is in the unit.
func TestUnitSettings(t *testing.T) {
	m := unitSettings(t)
	for k, want := range map[string]string{
		"Type":                  "notify",
		"User":                  "edge-agent",
		"StateDirectory":        "edge-agent",
		"CapabilityBoundingSet": "",
		"ProtectSystem":         "strict",
		"ProtectHome":           "yes",
		"PrivateTmp":            "yes",
		"NoNewPrivileges":       "yes",
		"SystemCallFilter":      "@system-service",
		"ExecStart":             "/usr/bin/edge-agent run --config /etc/edge-agent/agent.yaml",
		"Restart":               "on-failure",
		"Environment":           "GOTRACEBACK=crash",
	} {
		if !contains(m[k], want) {
			t.Errorf("%s=%s missing (have %q)", k, want, m[k])
		}
	}
	for _, k := range []string{"MemoryMax", "WatchdogSec"} {
		if len(m[k]) != 1 || m[k][0] == "" {
			t.Errorf("%s not set", k)
		}
	}
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

var exposure = regexp.MustCompile(`Overall exposure level for edge-agent\.service: ([0-9.]+)`)

// systemd-analyze rates the unit's exposure 2.5 or lower (0 is the
// safest, 10 the most exposed). Skipped where systemd-analyze is missing,
// or too old for --offline (systemd 250).
func TestUnitSecurityExposure(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed (apt-get install systemd)")
	}
	out, _ := exec.Command(sa, "security", "--offline=true", "edge-agent.service").CombinedOutput()
	if strings.Contains(string(out), "unrecognized option") {
		t.Skipf("this systemd-analyze has no --offline: %s", out)
	}
	mm := exposure.FindStringSubmatch(string(out))
	if mm == nil {
		t.Fatalf("no overall exposure in:\n%s", out)
	}
	score, err := strconv.ParseFloat(mm[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("exposure %.1f", score)
	if score > 2.5 {
		t.Fatalf("exposure %.1f, want 2.5 or lower:\n%s", score, out)
	}
}

// The production configuration is valid, and its paths are the unit's and
// the package's.
func TestProductionConfig(t *testing.T) {
	cfg, err := config.Load("agent-production.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DataDir != "/var/lib/edge-agent" || cfg.Plugins.Dir != "/usr/lib/edge-agent/plugins" ||
		cfg.MQTT.Broker != "embedded" || !strings.HasPrefix(cfg.MQTT.EmbeddedListen, "127.0.0.1:") ||
		!strings.HasPrefix(cfg.Admin.Listen, "127.0.0.1:") {
		t.Fatalf("data_dir %q, plugins.dir %q, broker %q on %q, admin %q", cfg.DataDir, cfg.Plugins.Dir,
			cfg.MQTT.Broker, cfg.MQTT.EmbeddedListen, cfg.Admin.Listen)
	}
	m := unitSettings(t)
	if !contains(m["WorkingDirectory"], cfg.DataDir) || !contains(m["StateDirectory"], "edge-agent") {
		t.Fatalf("the unit's state directory is not data_dir %s", cfg.DataDir)
	}
}
