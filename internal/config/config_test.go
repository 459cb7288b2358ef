package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/configs"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/device"
)

// http is a kind: http device's driver block (the device package
// registers the kind).
func http(d *config.Device) *device.HTTPConfig { return d.Driver.Config.(*device.HTTPConfig) }

func TestShippedDefaultsParse(t *testing.T) {
	c, err := config.Parse(configs.AgentYAML)
	if err != nil {
		t.Fatal(err)
	}
	if c.MQTT.Broker != "embedded" || c.DataDir != "./data" || c.Admin.Listen != config.DefaultAdminListen {
		t.Fatalf("defaults: %+v", c)
	}
	d := c.Device("pump-7")
	if d == nil || d.Queue != 256 || http(d).Timeout.D() != 2*time.Second || !http(d).Queryable || d.WorkerID() != "d:pump-7" {
		t.Fatalf("pump-7: %+v", d)
	}
	if c.Dedup.Retention.D() != 168*time.Hour || c.Dedup.KeepLast != 10000 || c.ShutdownTimeout.D() != 10*time.Second {
		t.Fatalf("dedup/shutdown: %+v", c)
	}
}

func TestShippedPolicyExampleParses(t *testing.T) {
	c, err := config.Parse(configs.AgentPoliciesYAML)
	if err != nil {
		t.Fatal(err)
	}
	bound := map[string]string{}
	for _, d := range c.Devices {
		if d.Policy != nil {
			bound[d.ID] = d.Policy.Plugin
		}
	}
	for dev, plugin := range map[string]string{"pump-7": "range-limit", "valve-1": "range-limit", "relay-1": "allowlist",
		"pump-1": "ramp-limit", "valve-2": "interlock", "mixer-1": "time-window"} {
		if bound[dev] != plugin {
			t.Errorf("%s binds %q, want %q", dev, bound[dev], plugin)
		}
	}
	if c.Device("pump-1").WorkerID() != c.Device("valve-2").WorkerID() {
		t.Error("the interlock's pump and valve must share a worker (one group)")
	}
}

func TestDefaultsAndGroups(t *testing.T) {
	c, err := config.Parse([]byte(`gateway_id: g
mqtt: {broker: "tcp://127.0.0.1:1883"}
devices:
  - {id: a, type: pump, group: s, driver: {url: "http://x"}}
  - {id: b, type: valve, group: s, queue: 3, driver: {url: "http://x"}, policy: {plugin: interlock, config: {pump: a, valve: b, n: [1, 2]}}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.MQTT.ClientID != "edge-agent-g" || c.MQTT.TopicPrefix != "edge" || c.Plugins.Dir != "./plugins/build" {
		t.Fatalf("mqtt defaults: %+v", c.MQTT)
	}
	a, b := c.Device("a"), c.Device("b")
	if a.WorkerID() != "g:s" || b.WorkerID() != "g:s" || a.Queue != config.DefaultQueue || b.Queue != 3 || http(a).Retries != 0 {
		t.Fatalf("devices: %+v %+v", a, b)
	}
	if got := string(b.Policy.ConfigJSON); got != `{"n":[1,2],"pump":"a","valve":"b"}` {
		t.Fatalf("policy config as JSON: %s", got)
	}
}

func TestBrokersOfACluster(t *testing.T) {
	c, err := config.Parse([]byte(`gateway_id: g
mqtt: {brokers: ["tcp://n1:1883", "ssl://n2:8883", "tcp://n3:1883"]}
devices:
  - {id: a, type: pump, driver: {url: "http://x"}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.MQTT.BrokerURLs(), ","); got != "tcp://n1:1883,ssl://n2:8883,tcp://n3:1883" || c.MQTT.Broker != "" {
		t.Fatalf("brokers %s, broker %q", got, c.MQTT.Broker)
	}
	c, err = config.Parse([]byte("gateway_id: g\nmqtt: {broker: \"tcp://h:1\"}\ndevices:\n  - {id: a, type: pump, driver: {url: \"http://x\"}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.MQTT.BrokerURLs(); len(got) != 1 || got[0] != "tcp://h:1" {
		t.Fatalf("broker alone: %v", got)
	}
}

func TestErrorsNameTheKey(t *testing.T) {
	base := "gateway_id: g\nmqtt: {broker: embedded}\n"
	dev := "devices:\n  - {id: p, type: pump, driver: {url: \"http://x\"}}\n"
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown key", base + "extra: 1\n" + dev, "extra (line 3): unknown key; the keys here are admin, coordination,"},
		{"bad duration", base + "shutdown_timeout: 10\n" + dev, "shutdown_timeout"},
		{"negative retention", base + "dedup: {retention: -1h}\n" + dev, "dedup.retention"},
		{"bad prefix", "gateway_id: g\nmqtt: {broker: embedded, topic_prefix: \"a/#\"}\n" + dev, "mqtt.topic_prefix"},
		{"embedded_listen with tcp", "gateway_id: g\nmqtt: {broker: \"tcp://h:1\", embedded_listen: \"x\"}\n" + dev, "mqtt.embedded_listen"},
		{"broker and brokers", "gateway_id: g\nmqtt: {broker: \"tcp://h:1\", brokers: [\"tcp://h:2\"]}\n" + dev, "mqtt.brokers: set mqtt.broker or mqtt.brokers, not both"},
		{"bad node", "gateway_id: g\nmqtt: {brokers: [\"tcp://h:1\", \"http://h:2\"]}\n" + dev, `mqtt.brokers[1]: "http://h:2": want tcp://host:port or ssl://host:port`},
		{"node without host", "gateway_id: g\nmqtt: {brokers: [\"tcp://h:1\", \"tcp://\"]}\n" + dev, `mqtt.brokers[1]: "tcp://"`},
		{"embedded node", "gateway_id: g\nmqtt: {brokers: [embedded]}\n" + dev, "mqtt.brokers[0]: the embedded broker is not a cluster node"},
		{"node twice", "gateway_id: g\nmqtt: {brokers: [\"tcp://h:1\", \"tcp://h:1\"]}\n" + dev, `mqtt.brokers[1]: "tcp://h:1" is also mqtt.brokers[0]`},
		{"password and file", "gateway_id: g\nmqtt: {broker: embedded, password: a, password_file: b}\n" + dev, "mqtt.password_file"},
		{"cert without key", "gateway_id: g\nmqtt: {broker: embedded, tls: {cert_file: a}}\n" + dev, "mqtt.tls"},
		{"bad device id", base + "devices:\n  - {id: \"a/b\", type: pump, driver: {url: \"http://x\"}}\n", "devices[0] (a/b).id"},
		{"bad url scheme", base + "devices:\n  - {id: p, type: pump, driver: {url: \"ftp://x\"}}\n", "devices[0] (p).driver.url"},
		{"retries too many", base + "devices:\n  - {id: p, type: pump, driver: {url: \"http://x\", retries: 11}}\n", "devices[0] (p).driver.retries"},
		{"resolve_settle negative", base + "devices:\n  - {id: p, type: pump, driver: {url: \"http://x\", resolve_settle: -1s}}\n", "devices[0] (p).driver.resolve_settle: -1s: must be from 0 to 1h0m0s"},
		{"resolve_settle too long", base + "devices:\n  - {id: p, type: pump, driver: {url: \"http://x\", resolve_settle: 2h}}\n", "devices[0] (p).driver.resolve_settle: 2h0m0s"},
		{"plugin with .wasm", base + "devices:\n  - {id: p, type: pump, driver: {url: \"http://x\"}, policy: {plugin: a.wasm}}\n", "devices[0] (p).policy.plugin"},
		{"negative limits", base + "devices:\n  - {id: p, type: pump, driver: {url: \"http://x\"}, policy: {plugin: a, limits: {max_input: -1}}}\n", "devices[0] (p).policy.limits"},
		{"unknown driver kind", base + "devices:\n  - {id: p, type: pump, driver: {kind: bacnet, url: \"http://x\"}}\n", "devices[0] (p).driver.kind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.yaml))
			if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want config.ErrInvalid naming %q", err, tc.want)
			}
		})
	}
}

// A past defect: validate reported only the first problem. Every problem is
// reported, each on its own line naming its key.
func TestEveryProblemIsReported(t *testing.T) {
	_, err := config.Parse([]byte(`gateway_id: "g/1"
mqtt: {broker: "tcp://h:1", embedded_listen: "x", topic_prefix: "a/#"}
dedup: {keep_last: -1}
devices:
  - {id: p, type: pump, driver: {url: "ftp://x", retries: 11, resends: 101}}
  - {id: p, type: robot, queue: 0, driver: {url: "http://x"}, policy: {plugin: a.wasm}}
  -
`))
	if !errors.Is(err, config.ErrInvalid) {
		t.Fatalf("got %v, want config.ErrInvalid", err)
	}
	want := []string{
		"gateway_id: \"g/1\" must match",
		"mqtt.embedded_listen: only with broker: embedded",
		"mqtt.topic_prefix:",
		"dedup.keep_last: must not be negative",
		"devices[0] (p).driver.url: \"ftp://x\"",
		"devices[0] (p).driver.retries: 11",
		"devices[0] (p).driver.resends: 101",
		"devices[1] (p).id: duplicate device \"p\" (also devices[0])",
		"devices[1] (p).type: \"robot\"",
		"devices[1] (p).queue: 0",
		"devices[1] (p).policy.plugin: \"a.wasm\"",
		"devices[2]: empty entry",
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Errorf("%d problems reported, want %d:\n%v", len(lines), len(want), err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("missing %q in:\n%v", w, err)
		}
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "config: invalid: ") {
			t.Errorf("line %q does not say config: invalid", l)
		}
	}
}

// An unknown key is reported as the user wrote it (its key path and line,
// with the known key it is likely a typo of), so is a value of the wrong
// type (no Go type name), and neither hides the file's other problems:
// every one is reported, once, one per line.
func TestUnknownKeysInTheUsersWords(t *testing.T) {
	_, err := config.Parse([]byte(`gateway_id: gw-1
mqtt:
  broker: embedded
  embeded_listen: 127.0.0.1:1883
shutdown_timeout: soon
security:
  keys:
    - {id: ctl-a, public_key_fil: /x.pub}
devices:
  - id: pump-7
    type: pmp
    driver:
      url: htp://127.0.0.1:8081
      timout: 2s
    policy: {plugin: range-limit, limits: {memory_mb: 8}, config: {anything: goes}}
  - id: relay-1
    type: relay
    driver: {kind: modbus, url: "tcp://h:502", actions: {on: {coil: 0, value: true, coill: 1}}}
  - id: valve-1
    type: valve
    driver: {kind: bacnet, anything: 1}
  - id: mixer-1
    type: generic
    queue: many
    driver: {url: "http://x", idempotent: sure}
plugins: [a]
`))
	var p config.Problems
	if !errors.As(err, &p) || !errors.Is(err, config.ErrInvalid) {
		t.Fatalf("got %v, want config.Problems", err)
	}
	want := []string{
		"mqtt.embeded_listen (line 4): unknown key; did you mean embedded_listen?",
		"security.keys[0] (ctl-a).public_key_fil (line 8): unknown key; did you mean public_key_file?",
		"devices[0] (pump-7).driver.timout (line 14): unknown key; did you mean timeout?",
		"devices[0] (pump-7).policy.limits.memory_mb (line 15): unknown key; did you mean memory_mib?",
		"devices[1] (relay-1).driver.actions.on.coill (line 18): unknown key; did you mean coil?",
		`shutdown_timeout (line 5): "soon" is not a duration (Go syntax: 2s, 150ms)`,
		`devices[3] (mixer-1).queue (line 24): want a whole number, got "many"`,
		`devices[3] (mixer-1).driver.idempotent (line 25): want true or false, got "sure"`,
		`plugins (line 26): want a mapping (key: value), got a list`,
		`devices[0] (pump-7).type: "pmp": want pump, valve, relay or generic`,
		`devices[0] (pump-7).driver.url: "htp://127.0.0.1:8081": want http:// or https://`,
		`devices[2] (valve-1).driver.kind: "bacnet": want http or modbus`,
		"security.keys[0] (ctl-a).public_key_file: required", // the typo's consequence
	}
	if len(p) != len(want) || len(strings.Split(err.Error(), "\n")) != len(want) {
		t.Errorf("%d problems reported, want %d:\n%v", len(p), len(want), err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), "config: invalid: "+w) {
			t.Errorf("missing %q in:\n%v", w, err)
		}
	}
}
