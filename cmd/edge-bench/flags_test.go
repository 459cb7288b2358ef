package main

import (
	"fmt"
	"os/exec"
	"slices"
	"testing"

	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/device"
)

func TestChromiumPath(t *testing.T) {
	for in, want := range map[string]string{"off": "", "": "", "page": pageClient, "/opt/chrome": "/opt/chrome"} {
		if got := chromiumPath(in); got != want {
			t.Errorf("-browser %q = %q, want %q", in, got, want)
		}
	}
	want := pageClient
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			want = p
			break
		}
	}
	if got := chromiumPath("auto"); got != want {
		t.Errorf("-browser auto = %q, want %q", got, want)
	}
}

func TestLists(t *testing.T) {
	if got := splitList(" 1, 8,,64 ,"); !slices.Equal(got, []string{"1", "8", "64"}) {
		t.Errorf("splitList = %q", got)
	}
	if got := splitList(""); got != nil {
		t.Errorf("splitList of \"\" = %q, want none", got)
	}
	if !containsWord("baseline, gogc50", "gogc50") || containsWord("baseline,gogc50", "gogc") || containsWord("", "baseline") {
		t.Error("containsWord matches a part of a word, or misses a whole one")
	}
}

func TestKinds(t *testing.T) {
	got := []string{echoKind.String(), deviceEchoKind.String(), agentKind.String(), agentModbusKind.String(), agentReadBackKind.String(), agentSignedKind.String()}
	if want := []string{"echo", "device-echo", "edge-agent", "agent-modbus", "agent-mb-rb", "agent-signed"}; !slices.Equal(got, want) {
		t.Fatalf("kinds %q, want %q", got, want)
	}
	for k, want := range map[kind]bool{agentKind: false, agentModbusKind: true, agentReadBackKind: true, agentSignedKind: false} {
		if k.modbus() != want {
			t.Errorf("%s.modbus() = %v", k, !want)
		}
	}
}

// The configurations edge-bench gives the agent are ones the agent
// accepts, with the devices the load generator addresses.
func TestBenchConfigsParse(t *testing.T) {
	dir := t.TempDir()
	check := func(name, y string, n int) *config.Config {
		t.Helper()
		cfg, err := config.Parse([]byte(y))
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, y)
		}
		if cfg.GatewayID != gw || cfg.MQTT.Broker != "tcp://127.0.0.1:1883" || len(cfg.Devices) != n {
			t.Fatalf("%s: gateway %q broker %q, %d devices, want %s, the broker, %d", name, cfg.GatewayID, cfg.MQTT.Broker, len(cfg.Devices), gw, n)
		}
		for i, d := range cfg.Devices {
			if d.ID != fmt.Sprintf("d%d", i) {
				t.Fatalf("%s: device %d is %q", name, i, d.ID)
			}
		}
		return cfg
	}
	check("agentYAML", agentYAML(dir, "tcp://127.0.0.1:1883", "", "http://127.0.0.1:8081", "", 8), 8)
	key, err := writeBenchKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := check("agentYAML signed", agentYAML(dir, "tcp://127.0.0.1:1883", "127.0.0.1:0", "http://127.0.0.1:8081", key, 1), 1); len(cfg.Security.Keys) != 1 {
		t.Fatalf("signed: %d keys, want 1", len(cfg.Security.Keys))
	}
	co := check("agentYAML with coordination", agentYAML(dir, "tcp://127.0.0.1:1883", "127.0.0.1:0", "http://127.0.0.1:8081", "", 64)+coordYAML("http://127.0.0.1:2379"), 64)
	if co.Coordination.Etcd == nil || len(co.Coordination.Etcd.Endpoints) != 1 || co.Coordination.Etcd.Endpoints[0] != "http://127.0.0.1:2379" {
		t.Fatalf("coordination: %+v", co.Coordination)
	}
	mb := check("modbusYAML", modbusYAML(dir, "tcp://127.0.0.1:1883", "", "127.0.0.1:5020", 3, false), 3)
	if d := mb.Devices[2]; d.Driver.Kind != "modbus" || modbusOf(t, d.Driver).UnitID == nil || *modbusOf(t, d.Driver).UnitID != 3 || modbusOf(t, d.Driver).Verify != "" {
		t.Fatalf("modbus device 2: %+v", d.Driver)
	}
	rb := check("modbusYAML readback", modbusYAML(dir, "tcp://127.0.0.1:1883", "", "127.0.0.1:5020", 1, true), 1)
	if v := modbusOf(t, rb.Devices[0].Driver).Verify; v != "readback" {
		t.Fatalf("readback: verify %q", v)
	}
}

// Every variant of -footprint-plugins edits configs/agent-policies.yaml
// into a configuration the agent accepts.
func TestPoliciesYAMLVariants(t *testing.T) {
	dir := t.TempDir()
	for _, v := range fpAll {
		y, err := policiesYAML(dir, "tcp://127.0.0.1:1883", "gw-fp", "127.0.0.1:0", "http://127.0.0.1:9", dir, v)
		if err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
		cfg, err := config.Parse([]byte(y))
		if err != nil {
			t.Fatalf("%s: %v\n%s", v.name, err, y)
		}
		bound := 0
		for _, d := range cfg.Devices {
			if d.Policy != nil {
				bound++
			}
		}
		if cfg.GatewayID != "gw-fp" || (bound == 0) != v.noPlugins {
			t.Fatalf("%s: gateway %q, %d devices with a policy", v.name, cfg.GatewayID, bound)
		}
	}
}

// modbusOf is d's Modbus settings (the driver block of kind modbus).
func modbusOf(t *testing.T, d config.Driver) *device.ModbusConfig {
	t.Helper()
	m, ok := d.Config.(*device.ModbusConfig)
	if !ok {
		t.Fatalf("driver of kind %q is not Modbus: %T", d.Kind, d.Config)
	}
	return m
}
