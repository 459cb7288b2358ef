package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/edge-agent/edge-agent/internal/app"
	"github.com/edge-agent/edge-agent/internal/config"
)

func configCmd() *cobra.Command {
	c := &cobra.Command{Use: "config", Short: "Configuration tools"}
	var path string
	check := &cobra.Command{
		Use:   "check",
		Short: "Validate a configuration without starting: print every problem, exit 2 if any",
		Long: `Validate a configuration without starting the agent: every key, then
(when the keys are sound) every policy plugin it binds, loaded as run would
load it (policy_init with its config). Prints every problem, one per line,
each naming its key; exit 0 when there is none, 2 otherwise.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if path == "" {
				return &exitError{2, errors.New("--config is required")}
			}
			out := cmd.OutOrStdout()
			cfg, err := config.Load(path)
			if err == nil {
				err = app.CheckPlugins(cmd.Context(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
			}
			if err != nil {
				lines := strings.Split(strings.TrimSpace(err.Error()), "\n")
				for _, l := range lines {
					fmt.Fprintln(out, l)
				}
				return &exitError{2, fmt.Errorf("%s: %d problem(s)", path, len(lines))}
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
