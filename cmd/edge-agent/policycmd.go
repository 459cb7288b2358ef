package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/edge-agent/edge-agent/internal/policy"
)

func policyCmd() *cobra.Command {
	c := &cobra.Command{Use: "policy", Short: "Policy plugin tools"}
	var plugin, command, state, cfgFile string
	t := &cobra.Command{
		Use:   "test",
		Short: "Evaluate one plugin on one command and print the decision (exit 0 decided, 1 failed)",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if plugin == "" || command == "" {
				return &exitError{2, fmt.Errorf("--plugin and --command are required")}
			}
			read := func(flag, p string) ([]byte, error) {
				if p == "" {
					return nil, nil
				}
				b, err := os.ReadFile(p)
				if err != nil {
					return nil, &exitError{1, fmt.Errorf("--%s: %w", flag, err)}
				}
				return b, nil
			}
			cb, err := read("command", command)
			if err != nil {
				return err
			}
			sb, err := read("state", state)
			if err != nil {
				return err
			}
			kb, err := read("config", cfgFile)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			dec, took, err := policy.TestOnce(ctx, plugin, cb, sb, kb)
			out := cmd.OutOrStdout()
			if err != nil {
				fmt.Fprintf(out, "error: %v\ntime: %s\n", err, took)
				return &exitError{1, fmt.Errorf("plugin %s failed: %w", plugin, err)}
			}
			verdict := "deny"
			if dec.Allow {
				verdict = "allow"
			}
			fmt.Fprintf(out, "decision: %s\n", verdict)
			if dec.Reason != "" {
				fmt.Fprintf(out, "reason: %s\n", dec.Reason)
			}
			if dec.Params != nil {
				fmt.Fprintf(out, "params rewritten: %s\n", dec.Params)
			}
			fmt.Fprintf(out, "time: %s\n", took)
			return nil
		},
	}
	t.Flags().StringVar(&plugin, "plugin", "", "the plugin's .wasm file")
	t.Flags().StringVar(&command, "command", "", "a Command JSON file")
	t.Flags().StringVar(&state, "state", "", "the device state JSON file (default {})")
	t.Flags().StringVar(&cfgFile, "config", "", "the plugin config JSON file (default {})")
	c.AddCommand(t)
	return c
}
