package main

import (
	"encoding/json"
	"os"
	"path/filepath"

	"github.com/edge-agent/edge-agent/internal/config"
)

// bindDemoPolicies binds the example plugins to the demo devices when they
// have been built (make plugins): range-limit denies on pump-7, a clamping
// range-limit rewrites on valve-1.
func bindDemoPolicies(cfg *config.Config) error {
	dir := cfg.Plugins.Dir
	if _, err := os.Stat(filepath.Join(dir, "range-limit.wasm")); err != nil {
		return nil
	}
	for _, d := range cfg.Devices {
		switch d.ID {
		case "pump-7":
			d.Policy = &config.Policy{Plugin: "range-limit", ConfigJSON: json.RawMessage(`{"param":"rpm","min":0,"max":3000}`)}
		case "valve-1":
			d.Policy = &config.Policy{Plugin: "range-limit", ConfigJSON: json.RawMessage(`{"param":"open","min":0,"max":80,"clamp":true}`)}
		}
	}
	return nil
}

func policiesBound(cfg *config.Config) bool {
	for _, d := range cfg.Devices {
		if d.Policy != nil {
			return true
		}
	}
	return false
}
