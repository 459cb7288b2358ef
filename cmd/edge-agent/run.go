package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/spf13/cobra"

	"github.com/edge-agent/edge-agent/configs"
	"github.com/edge-agent/edge-agent/internal/app"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/failpoint"
	"github.com/edge-agent/edge-agent/internal/mqtt"
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
			if err == nil {
				err = cfg.CheckFiles()
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

func run(cfg *config.Config, log *slog.Logger) error {
	// Fault injection exists only in builds with -tags failpoints
	// (tests and the chaos campaign); in a released binary this is a
	// no-op, and no environment variable can make the agent crash.
	if err := failpoint.FromEnv(); err != nil {
		return configErr(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	sd := newNotifier(log, cfg.HA.Enabled)
	a := app.New(cfg, app.Options{Logger: log, Version: Version, Revision: Commit, MQTTGrace: sd.mqttGrace()})
	// READY=1 and the watchdog pings (systemd.go), from before Start: a
	// standby (ha) waits inside Start, and is ready as a standby. They go
	// on while the agent drains (systemd's watchdog stays armed while a
	// unit stops) and end with it.
	var started atomic.Bool
	sdCtx, sdStop := context.WithCancel(context.Background())
	defer sdStop()
	go sd.run(sdCtx, a, &started)
	if err := a.Start(ctx); err != nil {
		sdStop()
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			log.Info("stopped before start-up finished (with ha: while standby)")
			return nil
		}
		if errors.Is(err, app.ErrConfig) {
			return configErr(err)
		}
		return err
	}
	started.Store(true)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	mqttErr := a.MQTTErr()
	for {
		select {
		case err := <-mqttErr:
			mqttErr = nil
			if errors.Is(err, mqtt.ErrClosed) {
				// Stood down (ha) before the first connect: a new client
				// connects when this agent is active again.
			} else if err != nil && ctx.Err() == nil {
				log.Error("mqtt: could not connect", "broker", strings.Join(cfg.MQTT.BrokerURLs(), ","), "err", err)
			} else if err == nil {
				log.Info("mqtt: connected and subscribed")
			}
		case <-hup:
			// Keys and plugins, each all or nothing: what was refused
			// keeps serving as loaded.
			if err := a.Reload(ctx); err != nil {
				log.Error("reload refused; what was loaded keeps serving", "err", err)
			} else {
				log.Info("keys and policy plugins reloaded")
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
