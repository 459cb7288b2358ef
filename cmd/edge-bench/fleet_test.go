package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/config"
)

func TestFleetFlags(t *testing.T) {
	if got, err := parseCounts(" 1, 5,20 "); err != nil || !slices.Equal(got, []int{1, 5, 20}) {
		t.Errorf("parseCounts = %v, %v", got, err)
	}
	for _, bad := range []string{"", "0", "1,x", "-2", ","} {
		if got, err := parseCounts(bad); err == nil {
			t.Errorf("parseCounts(%q) = %v, want an error", bad, got)
		}
	}
	if got, err := parseBrokerKinds("mosquitto, nats"); err != nil || !slices.Equal(got, []string{"mosquitto", "nats"}) {
		t.Errorf("parseBrokerKinds = %v, %v", got, err)
	}
	for _, bad := range []string{"", "embedded", "nats,emqx"} {
		if got, err := parseBrokerKinds(bad); err == nil {
			t.Errorf("parseBrokerKinds(%q) = %v, want an error", bad, got)
		}
	}
}

func TestFleetStats(t *testing.T) {
	d := ms(5, 1, 4, 2, 3)
	if q := quantile(d, 0.5); q != 3*time.Millisecond {
		t.Errorf("p50 = %v, want 3ms", q)
	}
	if !slices.IsSorted(d) {
		t.Error("quantile leaves its input unsorted")
	}
	var hundred []time.Duration
	for i := 100; i >= 1; i-- {
		hundred = append(hundred, time.Duration(i)*time.Millisecond)
	}
	if q := quantile(hundred, 0.99); q != 100*time.Millisecond {
		t.Errorf("p99 of 1..100ms = %v, want 100ms (as latencies takes it)", q)
	}
	if q := quantile(ms(7), 1); q != 7*time.Millisecond {
		t.Errorf("quantile 1 of one = %v", q)
	}
	if q := quantile(nil, 0.99); q != 0 {
		t.Errorf("quantile of none = %v", q)
	}
	in := ms(9, 1, 5, 3)
	if med, mx := medianMax(in); med != 5*time.Millisecond || mx != 9*time.Millisecond {
		t.Errorf("medianMax = %v, %v, want 5ms, 9ms", med, mx)
	}
	if in[0] != 9*time.Millisecond {
		t.Error("medianMax sorted its input")
	}
	if med, mx := medianMax(nil); med != 0 || mx != 0 {
		t.Errorf("medianMax of none = %v, %v", med, mx)
	}
	if got := parseSchedstat("137367744 71158436823 727\n"); got != 137367744*time.Nanosecond {
		t.Errorf("parseSchedstat = %v", got)
	}
	if got := parseSchedstat(""); got != 0 {
		t.Errorf("parseSchedstat of nothing = %v", got)
	}
	if got := schedTimes([]int{0}); got[0] <= 0 {
		t.Errorf("this process ran for %v", got[0])
	}
	if got := parseLoadavg("1.02 0.88 0.61 3/412 9999\n"); got != "1.02 0.88 0.61" {
		t.Errorf("parseLoadavg = %q", got)
	}
	if got := parseLoadavg(""); got != "?" {
		t.Errorf("parseLoadavg of nothing = %q", got)
	}
}

func TestFleetGrowthAndRow(t *testing.T) {
	one := fleetResult{broker: "mosquitto", gateways: 1, devices: 16, perSec: 400}
	five := fleetResult{broker: "mosquitto", gateways: 5, devices: 16, perSec: 1000,
		p50: 1500 * time.Microsecond, p99: 9 * time.Millisecond, acqP50: 40 * time.Millisecond, acqP99: 120 * time.Millisecond,
		agentCPU:      []time.Duration{300 * time.Microsecond, 500 * time.Microsecond, 400 * time.Microsecond, 350 * time.Microsecond, 900 * time.Microsecond},
		agentIdle:     []time.Duration{2 * time.Millisecond, 9 * time.Millisecond, 3500 * time.Microsecond},
		commitsPerCmd: []float64{0.5, 0.25, 1}, commitTime: []time.Duration{2 * time.Millisecond, 3 * time.Millisecond},
		brokerCPU: 80 * time.Microsecond, etcdCPU: 12 * time.Microsecond, simCPU: 150 * time.Microsecond, benchCPU: 200 * time.Microsecond, load: "1.0 0.9 0.8"}
	if got := fmtLatency(1234567 * time.Nanosecond); got != "1.235ms" {
		t.Errorf("fmtLatency(1.234567ms) = %s", got)
	}
	if got := fmtLatency(1063895 * time.Microsecond); got != "1.0639s" {
		t.Errorf("fmtLatency(1.063895s) = %s", got)
	}
	if perSecond(30*time.Millisecond, 5*time.Second) != 6*time.Millisecond || perSecond(time.Second, 0) != 0 {
		t.Error("perSecond")
	}
	if g := growth(one, one); g != "1" {
		t.Errorf("growth of the base = %q", g)
	}
	if g := growth(five, one); g != "x2.50 for x5 devices" {
		t.Errorf("growth = %q", g)
	}
	want := "| mosquitto | 5 x 16 | 1000 | 200 | x2.50 for x5 devices | 1.5ms | 9ms | 40ms | 120ms | 400 | 900 | 3.5 | 0.50 | 3.00 | 80 | 12 | 150 | 200 | 1.0 0.9 0.8 |"
	if got := fleetRow(five, one); got != want {
		t.Errorf("row\n got %s\nwant %s", got, want)
	}
	var b strings.Builder
	nats := five
	nats.broker = "nats"
	writeFleetTable(&b, []fleetResult{one, five, nats})
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("table of 3 results has %d lines:\n%s", len(lines), b.String())
	}
	// Each broker's rows grow against its own first row.
	if !strings.Contains(lines[3], "| x2.50 for x5 devices |") || !strings.Contains(lines[4], "| nats | 5 x 16 | 1000 | 200 | 1 |") {
		t.Errorf("growth not per broker:\n%s", b.String())
	}
}

func TestFleetNames(t *testing.T) {
	if got := rotate([]string{"a", "b", "c"}, 4); !slices.Equal(got, []string{"b", "c", "a"}) {
		t.Errorf("rotate = %v", got)
	}
	if got := rotate([]string{"a"}, 3); !slices.Equal(got, []string{"a"}) {
		t.Errorf("rotate of one = %v", got)
	}
	if rotate(nil, 1) != nil {
		t.Error("rotate of none")
	}
	if fleetGatewayID(3) != "gw03" || fleetDeviceID(3, 12) != "gw03-d12" || fleetLock("gw03-d12") != "locks/device/gw03-d12" {
		t.Errorf("names: %s %s %s", fleetGatewayID(3), fleetDeviceID(3, 12), fleetLock("gw03-d12"))
	}
}

// TestFleetAgentYAML: the configuration the fleet run writes is one the
// agent takes: its gateway, the brokers (one: mqtt.broker; more:
// mqtt.brokers in order), coordination.etcd and each device bound to
// its lock.
func TestFleetAgentYAML(t *testing.T) {
	devs := []string{fleetDeviceID(2, 0), fleetDeviceID(2, 1)}
	for _, brokers := range [][]string{{"tcp://127.0.0.1:1883"}, {"tcp://127.0.0.1:2001", "tcp://127.0.0.1:2002", "tcp://127.0.0.1:2003"}} {
		y := fleetAgentYAML("gw02", t.TempDir(), "127.0.0.1:9999", "http://127.0.0.1:8000", "http://127.0.0.1:2379", brokers, devs)
		cfg, err := config.Parse([]byte(y))
		if err != nil {
			t.Fatalf("%v\n%s", err, y)
		}
		if cfg.GatewayID != "gw02" || cfg.MQTT.ClientID != "edge-fleet-gw02" {
			t.Errorf("gateway %q, client_id %q", cfg.GatewayID, cfg.MQTT.ClientID)
		}
		got := cfg.MQTT.Brokers
		if len(brokers) == 1 {
			got = []string{cfg.MQTT.Broker}
		}
		if !slices.Equal(got, brokers) {
			t.Errorf("brokers %v, want %v", got, brokers)
		}
		if e := cfg.Coordination.Etcd; e == nil || !slices.Equal(e.Endpoints, []string{"http://127.0.0.1:2379"}) {
			t.Errorf("coordination.etcd = %+v", e)
		}
		if len(cfg.Devices) != 2 || cfg.Devices[1].ID != "gw02-d01" || cfg.Devices[1].Lock != "locks/device/gw02-d01" {
			t.Errorf("devices: %+v", cfg.Devices)
		}
	}
}

func TestParseStoreCommits(t *testing.T) {
	text := `# HELP edge_agent_store_commit_updates Updates in one group commit.
# TYPE edge_agent_store_commit_updates histogram
edge_agent_store_commit_updates_bucket{le="1"} 10
edge_agent_store_commit_updates_sum 250
edge_agent_store_commit_updates_count 100
edge_agent_store_commit_seconds_bucket{le="0.005"} 90
edge_agent_store_commit_seconds_sum 0.42
edge_agent_store_commit_seconds_count 100
edge_agent_command_seconds_sum 9
`
	got := parseStoreCommits(text)
	if got != (storeCommits{commits: 100, updates: 250, seconds: 0.42}) {
		t.Errorf("parseStoreCommits = %+v", got)
	}
	if got := parseStoreCommits("garbage\n\n"); got != (storeCommits{}) {
		t.Errorf("of nothing: %+v", got)
	}
}
