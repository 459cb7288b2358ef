// Package config loads and validates edge-agent's YAML configuration
// (PROTOCOL.md §5). Decoding is strict: unknown keys are errors, and every
// error names the key and the problem.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/edge-agent/edge-agent/wire"
)

// ErrInvalid wraps every validation error; the CLI maps it to exit 2.
var ErrInvalid = errors.New("config: invalid")

// Duration is a time.Duration written in Go syntax ("2s", "150ms").
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return fmt.Errorf("line %d: want a duration such as 2s, got %q", n.Line, n.Value)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (Go syntax: 2s, 150ms)", n.Line, s)
	}
	*d = Duration(v)
	return nil
}

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Config is the whole file.
type Config struct {
	GatewayID       string    `yaml:"gateway_id"`
	DataDir         string    `yaml:"data_dir"`
	MQTT            MQTT      `yaml:"mqtt"`
	Admin           Admin     `yaml:"admin"`
	Plugins         Plugins   `yaml:"plugins"`
	Dedup           Dedup     `yaml:"dedup"`
	ShutdownTimeout Duration  `yaml:"shutdown_timeout"`
	Devices         []*Device `yaml:"devices"`
}

// MQTT is the broker session.
type MQTT struct {
	Broker         string `yaml:"broker"`
	EmbeddedListen string `yaml:"embedded_listen"`
	ClientID       string `yaml:"client_id"`
	TopicPrefix    string `yaml:"topic_prefix"`
	Username       string `yaml:"username"`
	Password       string `yaml:"password"`
	PasswordFile   string `yaml:"password_file"`
	TLS            TLS    `yaml:"tls"`
}

// TLS files for ssl:// brokers.
type TLS struct {
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Admin is the admin HTTP API.
type Admin struct {
	Listen *string `yaml:"listen"` // nil: default; "": disabled
	Token  string  `yaml:"token"`
}

// Plugins says where policy plugins are found.
type Plugins struct {
	Dir string `yaml:"dir"`
}

// Dedup is the retention of final op records.
type Dedup struct {
	Retention Duration `yaml:"retention"`
	KeepLast  *int     `yaml:"keep_last"`
}

// Device is one configured device.
type Device struct {
	ID     string  `yaml:"id"`
	Type   string  `yaml:"type"`
	Group  string  `yaml:"group"`
	Lock   string  `yaml:"lock"`
	Queue  *int    `yaml:"queue"`
	Driver Driver  `yaml:"driver"`
	Policy *Policy `yaml:"policy"`
}

// Driver says how the device's firmware is reached.
type Driver struct {
	Kind       string   `yaml:"kind"`
	URL        string   `yaml:"url"`
	Timeout    Duration `yaml:"timeout"`
	Retries    *int     `yaml:"retries"`
	Resends    *int     `yaml:"resends"` // extension (docs/config.md): new keys after confirmed-unapplied tries
	Idempotent bool     `yaml:"idempotent"`
	Queryable  bool     `yaml:"queryable"`
}

// Policy binds a plugin to a device.
type Policy struct {
	Plugin string    `yaml:"plugin"`
	Config yaml.Node `yaml:"config"`
	Limits *Limits   `yaml:"limits"` // extension: per-binding limits (docs/config.md)
	// ConfigJSON is Config as JSON ({} when absent), filled by Validate.
	ConfigJSON json.RawMessage `yaml:"-"`
}

// Limits override the plugin ABI's default limits for one binding.
type Limits struct {
	Timeout     Duration `yaml:"timeout"`      // per call; default 50ms
	MemoryMiB   int      `yaml:"memory_mib"`   // default 64
	MaxInput    int      `yaml:"max_input"`    // bytes; default 1 MiB
	MaxOutput   int      `yaml:"max_output"`   // bytes; default 64 KiB
	Instances   int      `yaml:"instances"`    // warm instances; default 4
	InitTimeout Duration `yaml:"init_timeout"` // instantiation + policy_init; default 1s
}

// Default values (PROTOCOL.md §5).
const (
	DefaultQueue           = 256
	DefaultTimeout         = 2 * time.Second
	DefaultResends         = 5
	MaxResends             = 100
	DefaultRetention       = 168 * time.Hour
	DefaultKeepLast        = 10000
	DefaultShutdownTimeout = 10 * time.Second
	DefaultAdminListen     = "127.0.0.1:9464"
	DefaultEmbeddedListen  = "127.0.0.1:1883"
	MaxQueue               = 1 << 20
)

// DeviceTypes are the types of device the agent knows.
var DeviceTypes = map[string]bool{"pump": true, "valve": true, "relay": true, "generic": true}

// Load reads, decodes and validates the file at path.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, path, err)
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Parse decodes and validates a YAML document.
func Parse(b []byte) (*Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrInvalid, withSource(b, strings.TrimPrefix(err.Error(), "yaml: ")))
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

var lineRe = regexp.MustCompile(`line (\d+): `)

// withSource adds the offending source line to each "line N: ..." of a
// decode error, so the message names the key as written.
func withSource(src []byte, msg string) string {
	lines := strings.Split(string(src), "\n")
	return lineRe.ReplaceAllStringFunc(msg, func(m string) string {
		n, err := strconv.Atoi(lineRe.FindStringSubmatch(m)[1])
		if err != nil || n < 1 || n > len(lines) {
			return m
		}
		l := strings.TrimSpace(lines[n-1])
		if len(l) > 80 {
			l = l[:80] + "..."
		}
		return fmt.Sprintf("line %d (%s): ", n, l)
	})
}

func bad(key, format string, a ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalid, key, fmt.Sprintf(format, a...))
}

func (c *Config) validate() error {
	if c.GatewayID == "" {
		return bad("gateway_id", "required")
	}
	if !wire.ValidDeviceID(c.GatewayID) {
		return bad("gateway_id", "%q must match [A-Za-z0-9_.-]{1,64}", c.GatewayID)
	}
	if c.DataDir == "" {
		c.DataDir = "./data"
	}
	if c.MQTT.Broker == "" {
		return bad("mqtt.broker", "required: embedded, tcp://host:port or ssl://host:port")
	}
	if c.MQTT.Broker == "embedded" {
		if c.MQTT.EmbeddedListen == "" {
			c.MQTT.EmbeddedListen = DefaultEmbeddedListen
		}
	} else {
		if c.MQTT.EmbeddedListen != "" {
			return bad("mqtt.embedded_listen", "only with broker: embedded")
		}
		if !strings.HasPrefix(c.MQTT.Broker, "tcp://") && !strings.HasPrefix(c.MQTT.Broker, "ssl://") &&
			!strings.HasPrefix(c.MQTT.Broker, "mqtt://") && !strings.HasPrefix(c.MQTT.Broker, "tls://") {
			return bad("mqtt.broker", "%q: want embedded, tcp://host:port or ssl://host:port", c.MQTT.Broker)
		}
	}
	if c.MQTT.ClientID == "" {
		c.MQTT.ClientID = "edge-agent-" + c.GatewayID
	}
	if c.MQTT.TopicPrefix == "" {
		c.MQTT.TopicPrefix = wire.DefaultPrefix
	}
	if strings.ContainsAny(c.MQTT.TopicPrefix, "+#") {
		return bad("mqtt.topic_prefix", "%q must not contain + or #", c.MQTT.TopicPrefix)
	}
	if c.MQTT.Password != "" && c.MQTT.PasswordFile != "" {
		return bad("mqtt.password_file", "set password or password_file, not both")
	}
	if c.MQTT.PasswordFile != "" {
		b, err := os.ReadFile(c.MQTT.PasswordFile)
		if err != nil {
			return bad("mqtt.password_file", "%v", err)
		}
		c.MQTT.Password = strings.TrimRight(string(b), "\r\n")
	}
	if (c.MQTT.TLS.CertFile == "") != (c.MQTT.TLS.KeyFile == "") {
		return bad("mqtt.tls", "cert_file and key_file go together")
	}
	if c.Admin.Listen == nil {
		l := DefaultAdminListen
		c.Admin.Listen = &l
	}
	if c.Plugins.Dir == "" {
		c.Plugins.Dir = "./plugins/build"
	}
	if c.Dedup.Retention == 0 {
		c.Dedup.Retention = Duration(DefaultRetention)
	}
	if c.Dedup.Retention < 0 {
		return bad("dedup.retention", "must be positive")
	}
	if c.Dedup.KeepLast == nil {
		k := DefaultKeepLast
		c.Dedup.KeepLast = &k
	}
	if *c.Dedup.KeepLast < 0 {
		return bad("dedup.keep_last", "must not be negative")
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = Duration(DefaultShutdownTimeout)
	}
	if c.ShutdownTimeout < 0 {
		return bad("shutdown_timeout", "must be positive")
	}
	if len(c.Devices) == 0 {
		return bad("devices", "at least one device is required")
	}
	seen := map[string]int{}
	for i, d := range c.Devices {
		key := fmt.Sprintf("devices[%d]", i)
		if d == nil {
			return bad(key, "empty entry")
		}
		if d.ID == "" {
			return bad(key+".id", "required")
		}
		key = fmt.Sprintf("devices[%d] (%s)", i, d.ID)
		if !wire.ValidDeviceID(d.ID) {
			return bad(key+".id", "%q must match [A-Za-z0-9_.-]{1,64}", d.ID)
		}
		if j, dup := seen[d.ID]; dup {
			return bad(key+".id", "duplicate device %q (also devices[%d])", d.ID, j)
		}
		seen[d.ID] = i
		if !DeviceTypes[d.Type] {
			return bad(key+".type", "%q: want pump, valve, relay or generic", d.Type)
		}
		if d.Group != "" && !wire.ValidDeviceID(d.Group) {
			return bad(key+".group", "%q must match [A-Za-z0-9_.-]{1,64}", d.Group)
		}
		if d.Queue == nil {
			q := DefaultQueue
			d.Queue = &q
		}
		if *d.Queue < 1 || *d.Queue > MaxQueue {
			return bad(key+".queue", "%d: must be from 1 to %d", *d.Queue, MaxQueue)
		}
		if d.Driver.Kind == "" {
			d.Driver.Kind = "http"
		}
		if d.Driver.Kind != "http" {
			return bad(key+".driver.kind", "%q: only http exists", d.Driver.Kind)
		}
		if d.Driver.URL == "" {
			return bad(key+".driver.url", "required")
		}
		if !strings.HasPrefix(d.Driver.URL, "http://") && !strings.HasPrefix(d.Driver.URL, "https://") {
			return bad(key+".driver.url", "%q: want http:// or https://", d.Driver.URL)
		}
		if d.Driver.Timeout == 0 {
			d.Driver.Timeout = Duration(DefaultTimeout)
		}
		if d.Driver.Timeout < 0 {
			return bad(key+".driver.timeout", "must be positive")
		}
		if d.Driver.Retries == nil {
			r := 0
			d.Driver.Retries = &r
		}
		if *d.Driver.Retries < 0 || *d.Driver.Retries > 10 {
			return bad(key+".driver.retries", "%d: must be from 0 to 10", *d.Driver.Retries)
		}
		if d.Driver.Resends == nil {
			r := DefaultResends
			d.Driver.Resends = &r
		}
		if *d.Driver.Resends < 0 || *d.Driver.Resends > MaxResends {
			return bad(key+".driver.resends", "%d: must be from 0 to %d", *d.Driver.Resends, MaxResends)
		}
		if d.Policy != nil {
			if l := d.Policy.Limits; l != nil && (l.Timeout < 0 || l.MemoryMiB < 0 || l.MaxInput < 0 || l.MaxOutput < 0 || l.Instances < 0 || l.InitTimeout < 0) {
				return bad(key+".policy.limits", "must not be negative")
			}
			if d.Policy.Plugin == "" {
				return bad(key+".policy.plugin", "required")
			}
			if strings.ContainsAny(d.Policy.Plugin, "/\\") || strings.HasSuffix(d.Policy.Plugin, ".wasm") {
				return bad(key+".policy.plugin", "%q: a file name in plugins.dir without .wasm", d.Policy.Plugin)
			}
			d.Policy.ConfigJSON = json.RawMessage("{}")
			if d.Policy.Config.Kind != 0 {
				var v any
				if err := d.Policy.Config.Decode(&v); err != nil {
					return bad(key+".policy.config", "%v", err)
				}
				b, err := json.Marshal(jsonable(v))
				if err != nil {
					return bad(key+".policy.config", "cannot be expressed as JSON: %v", err)
				}
				d.Policy.ConfigJSON = b
			}
		}
	}
	return nil
}

// jsonable turns yaml's map[string]any trees into JSON-encodable values.
func jsonable(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = jsonable(e)
		}
		return x
	case map[any]any:
		m := map[string]any{}
		for k, e := range x {
			m[fmt.Sprint(k)] = jsonable(e)
		}
		return m
	case []any:
		for i, e := range x {
			x[i] = jsonable(e)
		}
		return x
	}
	return v
}

// WorkerID is the worker (and inbox) a device belongs to: "d:{dev}" for a
// lone device, "g:{group}" for a group.
func (d *Device) WorkerID() string {
	if d.Group != "" {
		return "g:" + d.Group
	}
	return "d:" + d.ID
}

// Device returns the configured device with the ID, or nil.
func (c *Config) Device(id string) *Device {
	for _, d := range c.Devices {
		if d.ID == id {
			return d
		}
	}
	return nil
}
