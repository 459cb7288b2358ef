package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/edge-agent/edge-agent/internal/app"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/policy"
)

func configCmd() *cobra.Command {
	c := &cobra.Command{Use: "config", Short: "Configuration tools"}
	var path string
	check := &cobra.Command{
		Use:   "check",
		Short: "Validate a configuration without starting: print every problem, exit 2 if any",
		Long: `Validate a configuration without starting the agent: every key, then
(when the keys are sound) every path it names (data_dir, plugins.dir and
each bound plugin's file, mqtt.tls's files), then every policy plugin it
binds, loaded as run would load it (policy_init with its config; what the
plugin says of a config it rejects is printed with it). Prints every
problem, one per line, each naming its key; exit 0 when there is none, 2
otherwise.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if path == "" {
				return &exitError{2, errors.New("--config is required")}
			}
			out := cmd.OutOrStdout()
			cfg, problems := checkConfig(cmd.Context(), path)
			if len(problems) > 0 {
				for _, p := range problems {
					fmt.Fprintln(out, p)
				}
				return &exitError{2, fmt.Errorf("%s: %d problem(s)", path, len(problems))}
			}
			groups := map[string]bool{}
			bound := 0
			for _, d := range cfg.Devices {
				if d.Group != "" {
					groups[d.Group] = true
				}
				if d.Policy != nil {
					bound++
				}
			}
			fmt.Fprintf(out, "%s: ok: gateway %s, %d devices (%d groups, %d with a policy), broker %s, data_dir %s, admin %q\n",
				path, cfg.GatewayID, len(cfg.Devices), len(groups), bound, strings.Join(cfg.MQTT.BrokerURLs(), ","), cfg.DataDir, cfg.Admin.Listen)
			return nil
		},
	}
	check.Flags().StringVar(&path, "config", "", "the configuration file to check (required)")
	c.AddCommand(check)
	return c
}

// checkConfig is config check's every problem of the file at path, each a
// line of its own; none when the configuration is sound.
func checkConfig(ctx context.Context, path string) (*config.Config, []error) {
	cfg, err := config.Load(path)
	if err == nil {
		err = cfg.CheckFiles()
	}
	if err == nil {
		err = checkPlugins(ctx, cfg)
	}
	if err == nil {
		return cfg, nil
	}
	var p config.Problems
	if errors.As(err, &p) {
		return nil, p
	}
	return nil, []error{err}
}

// checkPlugins loads the bound plugins as run does. Each plugin that fails
// is a problem of the key at fault (a device's policy.config its plugin
// rejected, else the device's policy.plugin), with what the plugin said.
func checkPlugins(ctx context.Context, cfg *config.Config) error {
	var plog pluginLog
	err := app.CheckPlugins(ctx, cfg, slog.New(&plog))
	if err == nil {
		return nil
	}
	var loads []*policy.LoadError
	loadErrors(err, &loads)
	if len(loads) == 0 {
		return err
	}
	index := map[string]int{}
	for i, d := range cfg.Devices {
		index[d.ID] = i
	}
	key := func(dev, sub string) string {
		return fmt.Sprintf("devices[%d] (%s).policy.%s", index[dev], dev, sub)
	}
	var p config.Problems
	for _, le := range loads {
		says := ""
		if lines := plog.of(le.Plugin); len(lines) > 0 {
			says = "; the plugin says: " + strings.Join(lines, "; ")
		}
		if errors.Is(le, policy.ErrConfigRejected) && len(le.Devices) > 0 {
			for _, dev := range le.Devices {
				p.Add(key(dev, "config"), "rejected by plugin %s (%v)%s", le.Plugin, le.Err, says)
			}
			continue
		}
		first := ""
		for _, d := range cfg.Devices {
			if d.Policy != nil && d.Policy.Plugin == le.Plugin {
				first = d.ID
				break
			}
		}
		if first == "" { // not one binding's plugin
			p = append(p, fmt.Errorf("%w: %v%s", config.ErrInvalid, le, says))
			continue
		}
		p.Add(key(first, "plugin"), "%v%s", le, says)
	}
	return p
}

// loadErrors appends every *policy.LoadError in err's tree.
func loadErrors(err error, into *[]*policy.LoadError) {
	if le, ok := err.(*policy.LoadError); ok {
		*into = append(*into, le)
		return
	}
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			loadErrors(e, into)
		}
	case interface{ Unwrap() error }:
		if e := u.Unwrap(); e != nil {
			loadErrors(e, into)
		}
	}
}
