package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/edge-agent/edge-agent/agent"
	"github.com/edge-agent/edge-agent/config"
	"github.com/edge-agent/edge-agent/configs"
	"github.com/edge-agent/edge-agent/device"
	"github.com/edge-agent/edge-agent/mqtt"
	"github.com/edge-agent/edge-agent/policy"
	"github.com/edge-agent/edge-agent/store"
	"github.com/edge-agent/edge-agent/wire"
)

func runCmd() *cobra.Command {
	var cfgPath, logLevel string
	c := &cobra.Command{
		Use:   "run",
		Short: "Serve until SIGINT/SIGTERM, then drain and close cleanly",
		Args:  cobra.NoArgs,
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
				cfgPath = "(embedded configs/agent.yaml)"
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
// EDGE_AGENT_CRASH=POINT[:OP_ID] SIGKILLs the process at a crash point
// (after_pending, after_write), optionally only for one op_id.
func faults(log *slog.Logger) (failCommit func() error, crash func(point, op string), err error) {
	if v := os.Getenv("EDGE_AGENT_FAULT_FAIL_COMMIT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return nil, nil, fmt.Errorf("EDGE_AGENT_FAULT_FAIL_COMMIT=%q: want a positive integer", v)
		}
		var count atomic.Int64
		failCommit = func() error {
			if count.Add(1) == int64(n) {
				return errors.New("injected commit failure (EDGE_AGENT_FAULT_FAIL_COMMIT)")
			}
			return nil
		}
		log.Warn("fault injection: commit will fail", "commit", n)
	}
	if v := os.Getenv("EDGE_AGENT_CRASH"); v != "" {
		point, op, _ := strings.Cut(v, ":")
		if point != "after_pending" && point != "after_write" {
			return nil, nil, fmt.Errorf("EDGE_AGENT_CRASH=%q: want after_pending or after_write, optionally :OP_ID", v)
		}
		crash = func(p, o string) {
			if p == point && (op == "" || op == o) {
				log.Warn("fault injection: SIGKILL at crash point", "point", p, "op_id", o)
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // never returns
			}
		}
		log.Warn("fault injection: crash point armed", "point", point, "op_id", op)
	}
	return failCommit, crash, nil
}

func run(cfg *config.Config, log *slog.Logger) error {
	failCommit, crash, err := faults(log)
	if err != nil {
		return configErr(err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return fmt.Errorf("data_dir %s: %w", cfg.DataDir, err)
	}
	st, err := store.Open(filepath.Join(cfg.DataDir, "agent.db"), &store.Options{FailCommit: failCommit, Logger: log})
	if err != nil {
		return err
	}
	defer st.Close()
	st.Start()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	drv, err := buildDrivers(cfg, log)
	if err != nil {
		return configErr(err)
	}
	host, err := buildPolicy(ctx, cfg, log, reg)
	if err != nil {
		return err
	}
	if host != nil {
		defer host.Close(context.Background())
	}

	var broker *mqtt.Embedded
	brokerURL := cfg.MQTT.Broker
	if cfg.MQTT.Broker == "embedded" {
		broker, err = mqtt.NewEmbedded(mqtt.EmbeddedOptions{Listen: cfg.MQTT.EmbeddedListen,
			DataDir: filepath.Join(cfg.DataDir, "broker"), Logger: log})
		if err != nil {
			return configErr(fmt.Errorf("mqtt.embedded_listen: %w", err))
		}
		if err := broker.Start(ctx); err != nil {
			return fmt.Errorf("embedded broker on %s: %w", cfg.MQTT.EmbeddedListen, err)
		}
		defer broker.Close()
		brokerURL = broker.URL()
	}

	var pub lateClient
	var evaluator policy.Evaluator
	if host != nil {
		evaluator = host
	}
	a, err := agent.New(agent.Options{Config: cfg, Store: st, Publisher: &pub, Drivers: drv,
		Policy: evaluator, Logger: log, Registry: reg, Crash: crash})
	if err != nil {
		return err
	}
	if err := a.Start(ctx); err != nil {
		return err
	}

	statusTopic := wire.StatusTopic(cfg.MQTT.TopicPrefix, cfg.GatewayID)
	online := mustJSON(wire.GatewayStatus{State: "online", Version: Version})
	offline := mustJSON(wire.GatewayStatus{State: "offline", Version: Version})
	mc, err := mqtt.New(mqtt.Options{
		Broker: brokerURL, ClientID: cfg.MQTT.ClientID,
		Username: cfg.MQTT.Username, Password: cfg.MQTT.Password,
		TLS:           mqtt.TLSOptions{CAFile: cfg.MQTT.TLS.CAFile, CertFile: cfg.MQTT.TLS.CertFile, KeyFile: cfg.MQTT.TLS.KeyFile},
		Subscriptions: []string{wire.CmdFilter(cfg.MQTT.TopicPrefix, cfg.GatewayID)},
		Handler: func(m *mqtt.Message) {
			a.Deliver(agent.Delivery{Topic: m.Topic, Payload: m.Payload, Retained: m.Retained, Ack: m.Ack})
		},
		WillTopic: statusTopic, WillPayload: offline, OnlinePayload: online, OfflinePayload: offline,
		Logger: log,
	})
	if err != nil {
		return configErr(fmt.Errorf("mqtt: %w", err))
	}
	pub.set(mc)

	var adminSrv *http.Server
	if *cfg.Admin.Listen != "" {
		ln, err := net.Listen("tcp", *cfg.Admin.Listen)
		if err != nil {
			return fmt.Errorf("admin.listen %s: %w", *cfg.Admin.Listen, err)
		}
		adminSrv = &http.Server{Handler: a.AdminHandler(agent.AdminOptions{Token: cfg.Admin.Token, Gatherer: reg,
			Ready: func() error {
				if !mc.Subscribed() {
					return errors.New("MQTT not subscribed")
				}
				return nil
			}}), ReadHeaderTimeout: 5 * time.Second}
		go adminSrv.Serve(ln)
		log.Info("admin API listening", "addr", ln.Addr().String())
	}

	startErr := make(chan error, 1)
	go func() { startErr <- mc.Start(ctx) }()
	if host != nil {
		go host.Watch(ctx)
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	log.Info("edge-agent running", "gateway", cfg.GatewayID, "broker", brokerURL, "devices", len(cfg.Devices), "version", Version)

	for {
		select {
		case err := <-startErr:
			if err != nil && ctx.Err() == nil {
				log.Error("mqtt: could not connect", "broker", brokerURL, "err", err)
				return fmt.Errorf("mqtt broker %s: %w", brokerURL, err)
			}
			if err == nil {
				log.Info("mqtt: connected and subscribed", "broker", brokerURL)
			}
			startErr = nil
		case <-hup:
			if host != nil {
				if err := host.Reload(ctx); err != nil {
					log.Error("policy reload refused; the loaded plugins keep serving", "err", err)
				} else {
					log.Info("policy plugins reloaded")
				}
			}
		case <-a.Failed():
			// Invariant 5: exit non-zero at once; nothing more is acknowledged.
			log.Error("stopping after a fatal error", "err", a.Err())
			os.Exit(1)
		case <-ctx.Done():
			log.Info("draining", "shutdown_timeout", cfg.ShutdownTimeout.D().String())
			dctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout.D())
			err := a.Stop(dctx)
			cancel()
			if adminSrv != nil {
				sctx, c2 := context.WithTimeout(context.Background(), time.Second)
				adminSrv.Shutdown(sctx)
				c2()
			}
			mc.Close()
			if err != nil {
				return err
			}
			log.Info("stopped cleanly")
			return nil
		}
	}
}

// lateClient lets the agent be built before the MQTT client exists (the
// client's handler needs the agent).
type lateClient struct{ c atomic.Pointer[mqtt.Client] }

func (l *lateClient) set(c *mqtt.Client) { l.c.Store(c) }

func (l *lateClient) Publish(ctx context.Context, topic string, payload []byte, retained bool) error {
	c := l.c.Load()
	if c == nil {
		return errors.New("mqtt client not built yet")
	}
	return c.Publish(ctx, topic, payload, retained)
}

func buildDrivers(cfg *config.Config, log *slog.Logger) (map[string]device.Driver, error) {
	h := device.NewHTTP(device.HTTPOptions{Logger: log})
	out := map[string]device.Driver{}
	for i, d := range cfg.Devices {
		err := h.Add(d.ID, device.HTTPDevice{URL: d.Driver.URL, Timeout: d.Driver.Timeout.D(),
			Retries: *d.Driver.Retries, Idempotent: d.Driver.Idempotent, Queryable: d.Driver.Queryable})
		if err != nil {
			return nil, fmt.Errorf("%w: devices[%d] (%s).driver: %v", config.ErrInvalid, i, d.ID, err)
		}
		out[d.ID] = h
	}
	return out, nil
}
