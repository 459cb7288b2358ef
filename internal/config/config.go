// Package config loads and validates edge-agent's YAML configuration
// (docs/protocol.md §5). Decoding is strict: unknown keys are errors, and every
// error names the key and the problem.
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// ErrInvalid wraps every validation error; the CLI maps it to exit 2.
var ErrInvalid = errors.New("config: invalid")

// Duration is a time.Duration written in Go syntax ("2s", "150ms").
type Duration time.Duration

// UnmarshalYAML parses a Go duration string. Its error is a
// *yaml.TypeError, so that the decoding goes on to the other keys.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := parseDuration(n)
	if err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %v", n.Line, err)}}
	}
	*d = v
	return nil
}

func parseDuration(n *yaml.Node) (Duration, error) {
	var s string
	if err := n.Decode(&s); err != nil {
		return 0, fmt.Errorf("want a duration such as 2s, got %s", shown(n))
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (Go syntax: 2s, 150ms)", s)
	}
	return Duration(v), nil
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
	Security        Security  `yaml:"security"` // signed commands (security.go)
	// Coordination is the etcd cluster that keeps fences beyond this disk
	// (coordination.go).
	Coordination Coordination `yaml:"coordination"`
	// HA is the standby that takes over (ha.go).
	HA HA `yaml:"ha"`
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
	// Brokers are the nodes of one broker cluster, instead of Broker: the
	// agent connects to one and moves to the next when it is lost.
	Brokers []string `yaml:"brokers"`
	// The embedded broker's authentication, ACL and TLS (security.go).
	EmbeddedPasswordFile   string      `yaml:"embedded_password_file"`
	EmbeddedACLFile        string      `yaml:"embedded_acl_file"`
	EmbeddedTLS            EmbeddedTLS `yaml:"embedded_tls"`
	EmbeddedAllowAnonymous bool        `yaml:"embedded_allow_anonymous"`
	// Embedded is what validate read of those files.
	Embedded Embedded `yaml:"-"`
}

// TLS files for ssl:// brokers.
type TLS struct {
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Admin is the admin HTTP API.
type Admin struct {
	Listen string `yaml:"listen"` // default DefaultAdminListen; "": disabled
	Token  string `yaml:"token"`
	// AllowedHosts are host names, besides admin.listen's host, that the
	// admin API answers to in a request's Host header (admin.Guard).
	AllowedHosts []string `yaml:"allowed_hosts"`
}

// Plugins says where policy plugins are found.
type Plugins struct {
	Dir string `yaml:"dir"`
}

// Dedup is the retention of final op records.
type Dedup struct {
	Retention Duration `yaml:"retention"`
	KeepLast  int      `yaml:"keep_last"` // default DefaultKeepLast
}

// Device is one configured device.
type Device struct {
	ID     string  `yaml:"id"`
	Type   string  `yaml:"type"`
	Group  string  `yaml:"group"`
	Lock   string  `yaml:"lock"`
	Queue  int     `yaml:"queue"` // default DefaultQueue
	Driver Driver  `yaml:"driver"`
	Policy *Policy `yaml:"policy"`
}

// UnmarshalYAML decodes a device over its defaults. Its unknown keys are
// Parse's to report (unknownKeys).
func (d *Device) UnmarshalYAML(n *yaml.Node) error {
	type plain Device
	*d = Device{Queue: DefaultQueue}
	if err := d.Driver.UnmarshalYAML(&yaml.Node{Kind: yaml.MappingNode}); err != nil {
		return err
	}
	return n.Decode((*plain)(d))
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

// Default values (docs/protocol.md §5).
const (
	DefaultQueue           = 256
	DefaultResends         = 5
	MaxResends             = 100
	DefaultRetention       = 168 * time.Hour
	DefaultKeepLast        = 10000
	DefaultShutdownTimeout = 10 * time.Second
	DefaultAdminListen     = "127.0.0.1:9464"
	DefaultEmbeddedListen  = "127.0.0.1:1883"
	MaxQueue               = 1 << 20
	DefaultResolveSettle   = 10 * time.Second
	MaxResolveSettle       = time.Hour
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

// Parse decodes and validates a YAML document: every problem, as
// Problems. The program must import the driver packages, which register
// the driver kinds (internal/device: http and modbus); Parse panics if
// none is registered.
func Parse(b []byte) (*Config, error) {
	if len(driverKinds()) == 0 {
		panic("config: no driver kind registered (import internal/device)")
	}
	var root yaml.Node
	if err := yaml.Unmarshal(b, &root); err != nil { // not YAML: nothing more to say
		return nil, Problems{fmt.Errorf("%w: %s", ErrInvalid, withSource(b, strings.TrimPrefix(err.Error(), "yaml: ")))}
	}
	var p Problems
	said := unknownKeys(&p, &root)
	c := Config{Admin: Admin{Listen: DefaultAdminListen}, Dedup: Dedup{KeepLast: DefaultKeepLast}}
	if root.Kind != 0 {
		var te *yaml.TypeError
		switch err := root.Decode(&c); {
		case errors.As(err, &te):
			for _, e := range te.Errors {
				if m := lineRe.FindStringSubmatch(e); m != nil && said[atoi(m[1])] {
					continue // unknownKeys said it, in the file's words
				}
				p = append(p, fmt.Errorf("%w: %s", ErrInvalid, withSource(b, e)))
			}
		case err != nil:
			return nil, Problems{fmt.Errorf("%w: %s", ErrInvalid, withSource(b, strings.TrimPrefix(err.Error(), "yaml: ")))}
		}
	}
	c.validate(&p)
	if len(p) > 0 {
		return nil, p
	}
	return &c, nil
}

var lineRe = regexp.MustCompile(`line (\d+): `)

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

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

// Problems collects every problem of a configuration, each naming its key
// and wrapping ErrInvalid. As an error (what Parse and Load return) it is
// every problem, one per line; errors.As finds it, to count them.
type Problems []error

// Add adds the problem of key (e.g. "devices[0] (p).driver.url"), worded
// by format.
func (p *Problems) Add(key, format string, a ...any) { *p = append(*p, bad(key, format, a...)) }

func (p Problems) Error() string   { return errors.Join(p...).Error() }
func (p Problems) Unwrap() []error { return p }

// validate is load, then provision, then validate (caddy's order): the
// defaults are filled in, every rule is checked, then (when no rule is
// broken) the files the configuration names are read. It adds every
// problem, not only the first.
func (c *Config) validate(p *Problems) {
	c.defaults()
	c.check(p)
	if len(*p) == 0 {
		c.readFiles(p)
	}
}

// defaults fills in every default of docs/protocol.md §5 (and docs/config.md's
// extensions) that a key left unset, where the key's zero value stands for
// unset. The keys whose zero value is a setting of its own (admin.listen:
// "" disables; dedup.keep_last, a device's queue and its driver's
// resends: 0) are decoded over their defaults instead (Parse,
// Device.UnmarshalYAML, Driver.UnmarshalYAML), so that no "unset" is left
// for code outside config to resolve.
func (c *Config) defaults() {
	if c.DataDir == "" {
		c.DataDir = "./data"
	}
	if c.MQTT.Broker == "embedded" && c.MQTT.EmbeddedListen == "" {
		c.MQTT.EmbeddedListen = DefaultEmbeddedListen
	}
	if c.MQTT.ClientID == "" && c.GatewayID != "" {
		c.MQTT.ClientID = "edge-agent-" + c.GatewayID
	}
	if c.MQTT.TopicPrefix == "" {
		c.MQTT.TopicPrefix = wire.DefaultPrefix
	}
	if c.Plugins.Dir == "" {
		c.Plugins.Dir = "./plugins/build"
	}
	if c.Dedup.Retention == 0 {
		c.Dedup.Retention = Duration(DefaultRetention)
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = Duration(DefaultShutdownTimeout)
	}
	c.defaultsSecurity()
	c.defaultsCoordination()
	c.defaultsHA()
	for _, d := range c.Devices {
		if d == nil {
			continue
		}
		if d.Driver.Config != nil {
			d.Driver.Config.Defaults()
		}
		if d.Policy != nil {
			d.Policy.ConfigJSON = json.RawMessage("{}")
		}
	}
}

// check adds a problem for every rule the configuration breaks. It reads
// no file.
func (c *Config) check(p *Problems) {
	switch {
	case c.GatewayID == "":
		p.Add("gateway_id", "required")
	case !wire.ValidDeviceID(c.GatewayID):
		p.Add("gateway_id", "%q must match [A-Za-z0-9_.-]{1,64}", c.GatewayID)
	}
	c.checkMQTT(p)
	if c.Dedup.Retention < 0 {
		p.Add("dedup.retention", "must be positive")
	}
	if c.Dedup.KeepLast < 0 {
		p.Add("dedup.keep_last", "must not be negative")
	}
	if c.ShutdownTimeout < 0 {
		p.Add("shutdown_timeout", "must be positive")
	}
	if len(c.Devices) == 0 {
		p.Add("devices", "at least one device is required")
	}
	seen := map[string]int{}
	for i, d := range c.Devices {
		c.checkDevice(p, i, d, seen)
	}
	c.checkSecurity(p)
	c.checkCoordination(p)
	c.checkHA(p)
}

func (c *Config) checkMQTT(p *Problems) {
	m := &c.MQTT
	switch {
	case m.Broker == "" && len(m.Brokers) == 0:
		p.Add("mqtt.broker", "required: embedded, tcp://host:port or ssl://host:port")
	case m.Broker == "":
		m.checkBrokers(p)
	case len(m.Brokers) > 0:
		p.Add("mqtt.brokers", "set mqtt.broker or mqtt.brokers, not both")
	case m.Broker == "embedded":
	default:
		if m.EmbeddedListen != "" {
			p.Add("mqtt.embedded_listen", "only with broker: embedded")
		}
		if !strings.HasPrefix(m.Broker, "tcp://") && !strings.HasPrefix(m.Broker, "ssl://") &&
			!strings.HasPrefix(m.Broker, "mqtt://") && !strings.HasPrefix(m.Broker, "tls://") {
			p.Add("mqtt.broker", "%q: want embedded, tcp://host:port or ssl://host:port", m.Broker)
		}
	}
	if strings.ContainsAny(m.TopicPrefix, "+#") {
		p.Add("mqtt.topic_prefix", "%q must not contain + or #", m.TopicPrefix)
	}
	if m.Password != "" && m.PasswordFile != "" {
		p.Add("mqtt.password_file", "set password or password_file, not both")
	}
	if (m.TLS.CertFile == "") != (m.TLS.KeyFile == "") {
		p.Add("mqtt.tls", "cert_file and key_file go together")
	}
}

// checkBrokers checks mqtt.brokers, naming a bad node by its index.
func (m *MQTT) checkBrokers(p *Problems) {
	if m.EmbeddedListen != "" {
		p.Add("mqtt.embedded_listen", "only with broker: embedded")
	}
	seen := map[string]int{}
	for i, b := range m.Brokers {
		key := fmt.Sprintf("mqtt.brokers[%d]", i)
		u, err := url.Parse(b)
		switch {
		case b == "embedded":
			p.Add(key, "the embedded broker is not a cluster node: use broker: embedded")
		case err != nil || u.Host == "" ||
			u.Scheme != "tcp" && u.Scheme != "ssl" && u.Scheme != "mqtt" && u.Scheme != "tls":
			p.Add(key, "%q: want tcp://host:port or ssl://host:port", b)
		}
		if j, dup := seen[b]; dup {
			p.Add(key, "%q is also mqtt.brokers[%d]", b, j)
		} else {
			seen[b] = i
		}
	}
}

// BrokerURLs are the brokers to connect to: mqtt.brokers, or mqtt.broker
// alone.
func (m *MQTT) BrokerURLs() []string {
	if len(m.Brokers) > 0 {
		return m.Brokers
	}
	return []string{m.Broker}
}

func (c *Config) checkDevice(p *Problems, i int, d *Device, seen map[string]int) {
	key := fmt.Sprintf("devices[%d]", i)
	if d == nil {
		p.Add(key, "empty entry")
		return
	}
	if d.ID == "" {
		p.Add(key+".id", "required")
	} else {
		key = fmt.Sprintf("devices[%d] (%s)", i, d.ID)
		if !wire.ValidDeviceID(d.ID) {
			p.Add(key+".id", "%q must match [A-Za-z0-9_.-]{1,64}", d.ID)
		}
		if j, dup := seen[d.ID]; dup {
			p.Add(key+".id", "duplicate device %q (also devices[%d])", d.ID, j)
		} else {
			seen[d.ID] = i
		}
	}
	if !DeviceTypes[d.Type] {
		p.Add(key+".type", "%q: want pump, valve, relay or generic", d.Type)
	}
	if d.Group != "" && !wire.ValidDeviceID(d.Group) {
		p.Add(key+".group", "%q must match [A-Za-z0-9_.-]{1,64}", d.Group)
	}
	if d.Queue < 1 || d.Queue > MaxQueue {
		p.Add(key+".queue", "%d: must be from 1 to %d", d.Queue, MaxQueue)
	}
	dr := &d.Driver
	if dr.Config == nil {
		p.Add(key+".driver.kind", "%q: want %s", dr.Kind, strings.Join(driverKinds(), " or "))
	} else {
		dr.Config.Check(p, key+".driver")
	}
	if dr.Resends < 0 || dr.Resends > MaxResends {
		p.Add(key+".driver.resends", "%d: must be from 0 to %d", dr.Resends, MaxResends)
	}
	if rs := dr.ResolveSettle.D(); rs < 0 || rs > MaxResolveSettle {
		p.Add(key+".driver.resolve_settle", "%v: must be from 0 to %v", rs, MaxResolveSettle)
	}
	if pol := d.Policy; pol != nil {
		if l := pol.Limits; l != nil && (l.Timeout < 0 || l.MemoryMiB < 0 || l.MaxInput < 0 || l.MaxOutput < 0 || l.Instances < 0 || l.InitTimeout < 0) {
			p.Add(key+".policy.limits", "must not be negative")
		}
		switch {
		case pol.Plugin == "":
			p.Add(key+".policy.plugin", "required")
		case strings.ContainsAny(pol.Plugin, "/\\") || strings.HasSuffix(pol.Plugin, ".wasm"):
			p.Add(key+".policy.plugin", "%q: a file name in plugins.dir without .wasm", pol.Plugin)
		}
	}
}

// readFiles reads what the configuration names (the MQTT password file)
// and converts the policy configs to JSON.
func (c *Config) readFiles(p *Problems) {
	if c.MQTT.PasswordFile != "" {
		b, err := ReadFile(c.MQTT.PasswordFile)
		if err != nil {
			p.Add("mqtt.password_file", "%v", err)
		} else {
			c.MQTT.Password = trimNewline(b)
		}
	}
	c.readSecurityFiles(p)
	c.readCoordinationFiles(p)
	for i, d := range c.Devices {
		if d.Policy == nil || d.Policy.Config.Kind == 0 {
			continue
		}
		key := fmt.Sprintf("devices[%d] (%s).policy.config", i, d.ID)
		var v any
		if err := d.Policy.Config.Decode(&v); err != nil {
			p.Add(key, "%v", err)
			continue
		}
		b, err := json.Marshal(jsonable(v))
		if err != nil {
			p.Add(key, "cannot be expressed as JSON: %v", err)
			continue
		}
		d.Policy.ConfigJSON = b
	}
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
