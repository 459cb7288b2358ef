package device

import (
	"strings"

	"github.com/edge-agent/edge-agent/internal/config"
)

// HTTPConfig is the `driver:` block of a device with kind: http
// (docs/config.md), as written; Device resolves it.
type HTTPConfig struct {
	URL        string          `yaml:"url"`
	Timeout    config.Duration `yaml:"timeout"` // default DefaultTimeout
	Retries    int             `yaml:"retries"`
	Idempotent bool            `yaml:"idempotent"`
	Queryable  bool            `yaml:"queryable"`
	// Modbus is kind: modbus's own keys, refused here with one sentence
	// naming them.
	Modbus ModbusKeys `yaml:",inline"`
}

// configMaxRetries bounds the retries key (the driver takes more).
const configMaxRetries = 10

func init() {
	config.RegisterDriver("http", func() config.DriverConfig { return &HTTPConfig{} })
}

// Defaults implements config.DriverConfig.
func (c *HTTPConfig) Defaults() {
	if c.Timeout == 0 {
		c.Timeout = config.Duration(DefaultTimeout)
	}
}

// Check implements config.DriverConfig.
func (c *HTTPConfig) Check(p *config.Problems, key string) {
	switch {
	case c.URL == "":
		p.Add(key+".url", "required")
	case !strings.HasPrefix(c.URL, "http://") && !strings.HasPrefix(c.URL, "https://"):
		p.Add(key+".url", "%q: want http:// or https://", c.URL)
	}
	if c.Modbus.set() {
		p.Add(key, "unit_id, verify, settle, actions and state are only for kind: modbus")
	}
	checkTimeoutRetries(p, key, c.Timeout, c.Retries)
}

// checkTimeoutRetries checks the keys both kinds decode, after the kind's
// own checks.
func checkTimeoutRetries(p *config.Problems, key string, timeout config.Duration, retries int) {
	if timeout < 0 {
		p.Add(key+".timeout", "must be positive")
	}
	if retries < 0 || retries > configMaxRetries {
		p.Add(key+".retries", "%d: must be from 0 to %d", retries, configMaxRetries)
	}
}

// Device is the block as the driver takes it (Defaults applied).
func (c *HTTPConfig) Device() HTTPDevice {
	return HTTPDevice{URL: c.URL, Timeout: c.Timeout.D(), Retries: c.Retries, Idempotent: c.Idempotent, Queryable: c.Queryable}
}
