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

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/spf13/cobra"

	"github.com/edge-agent/edge-agent/configs"
	"github.com/edge-agent/edge-agent/internal/app"
	"github.com/edge-agent/edge-agent/internal/config"
)

func runCmd() *cobra.Command {
	var cfgPath, logLevel string
	c := &cobra.Command{
		Use:   "run",
		Short: "Serve until SIGINT/SIGTERM, then drain and close cleanly",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return configErr(fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel))
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
			var cfg *config.Config
			var err error
			if cfgPath == "" {
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
	return c
}

// faults reads the test-only fault injection variables (docs/testing.md):
// EDGE_AGENT_FAULT_FAIL_COMMIT=N fails the Nth group commit after start-up;
// EDGE_AGENT_FAULT_STALL_COMMIT=N makes the Nth group commit hang for good
// (a disk that stopped answering: the commit loop is stuck, the process
// lives on); EDGE_AGENT_CRASH=POINT[:OP_ID] SIGKILLs the process at a crash
// point (after_pending, after_write, before_ack), optionally only for one
// op_id.
func faults(log *slog.Logger) (failCommit func() error, crashAt string, kill func(point, op string), err error) {
	nth := func(name string) (int64, error) {
		v := os.Getenv(name)
		if v == "" {
			return 0, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return 0, fmt.Errorf("%s=%q: want a positive integer", name, v)
		}
		return int64(n), nil
	}
	failAt, err := nth("EDGE_AGENT_FAULT_FAIL_COMMIT")
	if err != nil {
		return nil, "", nil, err
	}
	stallAt, err := nth("EDGE_AGENT_FAULT_STALL_COMMIT")
	if err != nil {
		return nil, "", nil, err
	}
	if failAt > 0 || stallAt > 0 {
		var count atomic.Int64
		failCommit = func() error {
			switch count.Add(1) {
			case stallAt:
				log.Warn("fault injection: commit stalled for good (EDGE_AGENT_FAULT_STALL_COMMIT)", "commit", stallAt)
				select {} // the commit loop never returns from this commit
			case failAt:
				return errors.New("injected commit failure (EDGE_AGENT_FAULT_FAIL_COMMIT)")
			}
			return nil
		}
		if failAt > 0 {
			log.Warn("fault injection: a commit will fail", "commit", failAt)
		}
		if stallAt > 0 {
			log.Warn("fault injection: a commit will hang", "commit", stallAt)
		}
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
	sd := newNotifier(log)
	a := app.New(cfg, app.Options{Logger: log, Version: Version, FailCommit: failCommit, CrashAt: crashAt, Kill: kill,
		MQTTGrace: sd.mqttGrace()})
	if err := a.Start(ctx); err != nil {
		if errors.Is(err, app.ErrConfig) {
			return configErr(err)
		}
		return err
	}
	// READY=1 and the watchdog pings; they go on while the agent drains
	// (systemd's watchdog stays armed while a unit stops) and end with it.
	sdCtx, sdStop := context.WithCancel(context.Background())
	defer sdStop()
	go sd.run(sdCtx, a)
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
			sd.send(daemon.SdNotifyStopping)
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
