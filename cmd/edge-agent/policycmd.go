package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/edge-agent/edge-agent/internal/policy"
)

// pluginLine is one line the plugin logged during the test.
type pluginLine struct {
	Level  string `json:"level"`
	Stream string `json:"stream"` // log (sdk.Log) or stdio
	Msg    string `json:"msg"`
	Plugin string `json:"-"`
}

// pluginLog collects the plugin's own lines ("policy: plugin says"): the
// reason a plugin gives for failing is there.
type pluginLog struct {
	mu    sync.Mutex
	lines []pluginLine
}

func (l *pluginLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *pluginLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *pluginLog) WithGroup(string) slog.Handler            { return l }
func (l *pluginLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "policy: plugin says" {
		return nil
	}
	pl := pluginLine{Level: r.Level.String()}
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "msg":
			pl.Msg = a.Value.String()
		case "stream":
			pl.Stream = a.Value.String()
		case "plugin":
			pl.Plugin = a.Value.String()
		}
		return true
	})
	l.mu.Lock()
	l.lines = append(l.lines, pl)
	l.mu.Unlock()
	return nil
}

// of is what the plugin named plugin said, line by line.
func (l *pluginLog) of(plugin string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, pl := range l.lines {
		if pl.Plugin == plugin {
			out = append(out, pl.Msg)
		}
	}
	return out
}

// policyResult is `policy test --json`.
type policyResult struct {
	Decision  string          `json:"decision,omitempty"` // allow or deny; absent when the plugin failed
	Reason    string          `json:"reason,omitempty"`
	Params    json.RawMessage `json:"params,omitempty"` // the rewritten params
	Error     string          `json:"error,omitempty"`
	PluginLog []pluginLine    `json:"plugin_log"`
	TimeUS    int64           `json:"time_us"`
}

func policyCmd() *cobra.Command {
	c := &cobra.Command{Use: "policy", Short: "Policy plugin tools"}
	var plugin, command, state, cfgFile string
	var asJSON bool
	t := &cobra.Command{
		Use:   "test",
		Short: "Evaluate one plugin on one command and print the decision (exit 0 decided, 1 failed)",
		Long: `Evaluate one plugin on one command and print the decision, the reason, the
rewritten params, what the plugin logged (its own reason when it fails) and
the time. Exit 0 when the plugin decided (allow or deny), 1 when it failed.`,
		Args: usageArgs(cobra.NoArgs),
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
			var plog pluginLog
			dec, took, err := policy.TestOnceLogged(ctx, plugin, cb, sb, kb, slog.New(&plog))
			res := policyResult{PluginLog: plog.lines, TimeUS: took.Microseconds()}
			if res.PluginLog == nil {
				res.PluginLog = []pluginLine{}
			}
			if err != nil {
				res.Error = err.Error()
			} else {
				res.Decision, res.Reason, res.Params = "deny", dec.Reason, dec.Params
				if dec.Allow {
					res.Decision = "allow"
				}
			}
			out := cmd.OutOrStdout()
			if asJSON {
				b, _ := json.Marshal(res)
				fmt.Fprintln(out, string(b))
			} else {
				if err != nil {
					fmt.Fprintf(out, "error: %v\n", err)
				} else {
					fmt.Fprintf(out, "decision: %s\n", res.Decision)
					if res.Reason != "" {
						fmt.Fprintf(out, "reason: %s\n", res.Reason)
					}
					if res.Params != nil {
						fmt.Fprintf(out, "params rewritten: %s\n", res.Params)
					}
				}
				for _, l := range res.PluginLog {
					fmt.Fprintf(out, "plugin says (%s): %s\n", l.Level, l.Msg)
				}
				fmt.Fprintf(out, "time: %s\n", took)
			}
			if err != nil {
				return &exitError{1, fmt.Errorf("plugin %s failed: %w", plugin, err)}
			}
			return nil
		},
	}
	t.Flags().StringVar(&plugin, "plugin", "", "the plugin's .wasm file")
	t.Flags().StringVar(&command, "command", "", "a Command JSON file")
	t.Flags().StringVar(&state, "state", "", "the device state JSON file (default {})")
	t.Flags().StringVar(&cfgFile, "config", "", "the plugin config JSON file (default {})")
	t.Flags().BoolVar(&asJSON, "json", false, `print one JSON object: {"decision","reason","params","error","plugin_log":[{"level","stream","msg"}],"time_us"}`)
	c.AddCommand(t)
	return c
}
