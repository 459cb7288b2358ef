package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/edge-agent/edge-agent/configs"
	"github.com/edge-agent/edge-agent/internal/app"
	"github.com/edge-agent/edge-agent/internal/config"
)

func runCmd() *cobra.Command {
	var cfgPath, logLevel, logFormat string
	c := &cobra.Command{
		Use:   "run",
		Short: "Serve until SIGINT/SIGTERM, then drain and close cleanly",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return configErr(fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel))
			}
			log, err := newLogger(logFormat, lvl)
			if err != nil {
				return configErr(err)
			}
			var cfg *config.Config
			if cfgPath == "" {
				log.Info("no --config: using the demo defaults (configs/agent.yaml, embedded in the binary): embedded MQTT broker, data under ./data, admin API on " + config.DefaultAdminListen)
				cfg, err = config.Parse(configs.AgentYAML)
			} else {
				cfg, err = config.Load(cfgPath)
			}
			if err != nil {
				return configErr(err)
			}
			return run(cfg, log)
		},
	}
	c.Flags().StringVar(&cfgPath, "config", "", "configuration file (default: the embedded configs/agent.yaml)")
	c.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	c.Flags().StringVar(&logFormat, "log-format", "text", "text (logfmt-like) or json (one object per line, for journald/Loki)")
	return c
}

// faults reads the test-only fault injection variables (docs/testing.md):
// EDGE_AGENT_FAULT_FAIL_COMMIT=N fails the Nth group commit after start-up;
// EDGE_AGENT_CRASH=POINT[:OP_ID] SIGKILLs the process at a crash point
// (after_pending, after_write, before_ack), optionally only for one op_id.
func faults(log *slog.Logger) (failCommit func() error, crashAt string, kill func(point, op string), err error) {
	if v := os.Getenv("EDGE_AGENT_FAULT_FAIL_COMMIT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return nil, "", nil, fmt.Errorf("EDGE_AGENT_FAULT_FAIL_COMMIT=%q: want a positive integer", v)
		}
		var count atomic.Int64
		failCommit = func() error {
			if count.Add(1) == int64(n) {
				return errors.New("injected commit failure (EDGE_AGENT_FAULT_FAIL_COMMIT)")
			}
			return nil
		}
		log.Warn("fault injection: a commit will fail", "commit", n)
	}
	if v := os.Getenv("EDGE_AGENT_CRASH"); v != "" {
		point, _, _ := strings.Cut(v, ":")
		if point != "after_pending" && point != "after_write" && point != "before_ack" {
			return nil, "", nil, fmt.Errorf("EDGE_AGENT_CRASH=%q: want after_pending, after_write or before_ack, optionally :OP_ID", v)
		}
		crashAt = v
		kill = func(p, o string) {
			log.Warn("fault injection: SIGKILL at crash point", "point", p, "op_id", o)
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never returns
		}
		log.Warn("fault injection: crash point armed", "at", v)
	}
	return failCommit, crashAt, kill, nil
}

func run(cfg *config.Config, log *slog.Logger) error {
	failCommit, crashAt, kill, err := faults(log)
	if err != nil {
		return configErr(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	a := app.New(cfg, app.Options{Logger: log, Version: Version, FailCommit: failCommit, CrashAt: crashAt, Kill: kill})
	if err := a.Start(ctx); err != nil {
		if errors.Is(err, app.ErrConfig) {
			return configErr(err)
		}
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	mqttErr := a.MQTTErr()
	for {
		select {
		case err := <-mqttErr:
			mqttErr = nil
			if err != nil && ctx.Err() == nil {
				log.Error("mqtt: could not connect", "broker", cfg.MQTT.Broker, "err", err)
			} else if err == nil {
				log.Info("mqtt: connected and subscribed")
			}
		case <-hup:
			if err := a.Reload(ctx); err != nil {
				log.Error("policy reload refused; the loaded plugins keep serving", "err", err)
			} else {
				log.Info("policy plugins reloaded")
			}
		case <-a.Failed():
			// Invariant 5: exit non-zero at once; nothing more is acknowledged.
			log.Error("stopping after a fatal error", "err", a.Err())
			os.Exit(1)
		case <-ctx.Done():
			log.Info("draining", "shutdown_timeout", cfg.ShutdownTimeout.D().String())
			dctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout.D())
			defer cancel()
			if err := a.Stop(dctx); err != nil {
				return err
			}
			log.Info("stopped cleanly")
			return nil
		}
	}
}
