package configs_test

import (
	"path/filepath"
	"testing"

	"github.com/edge-agent/edge-agent/internal/config"
)

// The examples a checkout runs (README.md) name paths in the checkout, so
// that `config check` and `run` find them there; only agent-production.yaml
// and agent-coordinated.yaml name the installed paths (the package's).
func TestCheckoutExamplesNameCheckoutPaths(t *testing.T) {
	for _, name := range []string{"agent.yaml", "agent-mosquitto.yaml", "agent-policies.yaml", "agent-modbus.yaml"} {
		t.Run(name, func(t *testing.T) {
			cfg, err := config.Load(name)
			if err != nil {
				t.Fatal(err)
			}
			if filepath.IsAbs(cfg.DataDir) || cfg.Plugins.Dir != "./plugins/build" {
				t.Fatalf("data_dir %q, plugins.dir %q: want paths in the checkout (./data, ./plugins/build)", cfg.DataDir, cfg.Plugins.Dir)
			}
		})
	}
	// From the checkout's root, where they are run, the files they name
	// are found (no plugin is bound here: those are built by make plugins).
	t.Chdir("..")
	for _, name := range []string{"agent.yaml", "agent-mosquitto.yaml"} {
		cfg, err := config.Load(filepath.Join("configs", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := cfg.CheckFiles(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
