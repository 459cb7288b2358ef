package config

import "time"

// This file holds the ha block (docs/protocol.md §8): agents with one
// gateway_id on two hosts, one active and one standby. Its defaults and
// checks are called from config.go's defaults and check.

// HA is the standby that takes over.
type HA struct {
	Enabled bool `yaml:"enabled"`
	// SafetyMargin: the active stops writing to devices this long before
	// its etcd session could have expired. Default 2s.
	SafetyMargin Duration `yaml:"safety_margin"`
}

// DefaultSafetyMargin is ha.safety_margin's default.
const DefaultSafetyMargin = 2 * time.Second

func (c *Config) defaultsHA() {
	if c.HA.SafetyMargin == 0 {
		c.HA.SafetyMargin = Duration(DefaultSafetyMargin)
	}
}

func (c *Config) checkHA(p *Problems) {
	h := c.HA
	if h.SafetyMargin <= 0 {
		p.Add("ha.safety_margin", "must be positive")
	}
	if !h.Enabled {
		return
	}
	e := c.Coordination.Etcd
	if e == nil {
		p.Add("ha.enabled", "needs coordination.etcd (the active is the agent that holds the gateway's registration there)")
		return
	}
	if h.SafetyMargin > 0 && h.SafetyMargin >= e.SessionTTL {
		p.Add("ha.safety_margin", "%s: must be below coordination.etcd.session_ttl (%s)", h.SafetyMargin.D(), e.SessionTTL.D())
	}
}
