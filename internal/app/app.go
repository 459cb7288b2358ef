// Package app wires one edge-agent process together: store, embedded
// broker, device drivers, policy host, agent, MQTT session and admin API.
// cmd/edge-agent calls it, and so do the end-to-end tests that run the agent
// in-process.
package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/edge-agent/edge-agent/internal/agent"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/device"
	"github.com/edge-agent/edge-agent/internal/mqtt"
	"github.com/edge-agent/edge-agent/internal/policy"
	"github.com/edge-agent/edge-agent/internal/store"
	"github.com/edge-agent/edge-agent/wire"
)

// ErrConfig wraps errors the CLI reports with exit status 2.
var ErrConfig = config.ErrInvalid

// Options tune an App. Zero values mean defaults.
type Options struct {
	Logger     *slog.Logger
	Version    string
	FailCommit func() error             // store fault injection (tests)
	CrashAt    string                   // armed crash point (tests): see agent.Options
	Kill       func(point, opID string) // called at the armed crash point
	// MQTTGrace is how long Live tolerates a lost MQTT connection. Zero
	// means DefaultMQTTGrace.
	MQTTGrace time.Duration
}

// App is one running agent process.
type App struct {
	cfg  *config.Config
	o    Options
	log  *slog.Logger
	st   *store.Store
	brk  *mqtt.Embedded
	host *policy.Host
	http *device.HTTP
	ag   *agent.Agent
	mc   *mqtt.Client
	adm  *http.Server
	ln   net.Listener
	reg  *prometheus.Registry
	pub  lateClient

	mqttErr chan error
	live    liveness
}

// New validates the wiring; it does no I/O.
func New(cfg *config.Config, o Options) *App {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Version == "" {
		o.Version = "dev"
	}
	if o.MQTTGrace == 0 {
		o.MQTTGrace = DefaultMQTTGrace
	}
	return &App{cfg: cfg, o: o, log: o.Logger, mqttErr: make(chan error, 1)}
}

// Start opens everything and begins serving; the MQTT connection is made in
// the background (MQTTErr reports a failure to connect). On error,
// everything opened so far is closed.
func (a *App) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			a.closeAll()
		}
	}()
	cfg := a.cfg
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return fmt.Errorf("data_dir %s: %w", cfg.DataDir, err)
	}
	a.st, err = store.Open(filepath.Join(cfg.DataDir, "agent.db"), &store.Options{FailCommit: a.o.FailCommit, Logger: a.log})
	if err != nil {
		return err
	}
	a.st.Start()
	a.reg = prometheus.NewRegistry()
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	drv, hd, err := buildDrivers(cfg, a.log)
	if err != nil {
		return err
	}
	a.http = hd
	if a.host, err = buildPolicy(ctx, cfg, a.log, a.reg); err != nil {
		return err
	}
	brokerURL := cfg.MQTT.Broker
	if cfg.MQTT.Broker == "embedded" {
		a.brk, err = mqtt.NewEmbedded(mqtt.EmbeddedOptions{Listen: cfg.MQTT.EmbeddedListen,
			DataDir: filepath.Join(cfg.DataDir, "broker"), Logger: a.log})
		if err != nil {
			return fmt.Errorf("%w: mqtt.embedded_listen: %v", ErrConfig, err)
		}
		if err := a.brk.Start(ctx); err != nil {
			return fmt.Errorf("embedded broker on %s: %w", cfg.MQTT.EmbeddedListen, err)
		}
		brokerURL = a.brk.URL()
	}
	var ev policy.Evaluator
	if a.host != nil {
		ev = a.host
	}
	a.ag, err = agent.New(agent.Options{Config: cfg, Store: a.st, Publisher: &a.pub, Drivers: drv,
		Policy: ev, Logger: a.log, Registry: a.reg, CrashAt: a.o.CrashAt, Kill: a.o.Kill})
	if err != nil {
		return err
	}
	if err := a.ag.Start(ctx); err != nil {
		return err
	}
	statusTopic := wire.StatusTopic(cfg.MQTT.TopicPrefix, cfg.GatewayID)
	online := mustJSON(wire.GatewayStatus{State: "online", Version: a.o.Version})
	offline := mustJSON(wire.GatewayStatus{State: "offline", Version: a.o.Version})
	a.mc, err = mqtt.New(mqtt.Options{
		Broker: brokerURL, ClientID: cfg.MQTT.ClientID,
		Username: cfg.MQTT.Username, Password: cfg.MQTT.Password,
		TLS:           mqtt.TLSOptions{CAFile: cfg.MQTT.TLS.CAFile, CertFile: cfg.MQTT.TLS.CertFile, KeyFile: cfg.MQTT.TLS.KeyFile},
		Subscriptions: []string{wire.CmdFilter(cfg.MQTT.TopicPrefix, cfg.GatewayID)},
		Handler: func(m *mqtt.Message) {
			a.ag.Deliver(agent.Delivery{Topic: m.Topic, Payload: m.Payload, Retained: m.Retained, Ack: m.Ack})
		},
		WillTopic: statusTopic, WillPayload: offline, OnlinePayload: online, OfflinePayload: offline,
		Logger: a.log,
	})
	if err != nil {
		return fmt.Errorf("%w: mqtt: %v", ErrConfig, err)
	}
	a.pub.set(a.mc)
	if *cfg.Admin.Listen != "" {
		a.ln, err = net.Listen("tcp", *cfg.Admin.Listen)
		if err != nil {
			return fmt.Errorf("admin.listen %s: %w", *cfg.Admin.Listen, err)
		}
		a.adm = &http.Server{Handler: a.ag.AdminHandler(agent.AdminOptions{Token: cfg.Admin.Token, Gatherer: a.reg,
			Ready: a.Ready}), ReadHeaderTimeout: 5 * time.Second}
		go a.adm.Serve(a.ln)
		a.log.Info("admin API listening", "addr", a.ln.Addr().String())
	}
	go func() { a.mqttErr <- a.mc.Start(ctx) }()
	if a.host != nil {
		go a.host.Watch(ctx)
	}
	a.log.Info("edge-agent running", "gateway", cfg.GatewayID, "broker", brokerURL, "devices", len(cfg.Devices), "version", a.o.Version)
	return nil
}

// Ready is nil once the store is open, plugins are loaded and MQTT is
// subscribed.
func (a *App) Ready() error {
	if a.mc == nil || !a.mc.Subscribed() {
		return errors.New("MQTT not subscribed")
	}
	return nil
}

// MQTTErr receives the result of the first MQTT connect (nil: connected).
func (a *App) MQTTErr() <-chan error { return a.mqttErr }

// Failed is closed on a fatal error (the process must exit 1 at once).
func (a *App) Failed() <-chan struct{} { return a.ag.Failed() }

// Err is the fatal error.
func (a *App) Err() error { return a.ag.Err() }

// BrokerURL is the broker the agent is connected to (the embedded one's
// actual address when broker: embedded).
func (a *App) BrokerURL() string {
	if a.brk != nil {
		return a.brk.URL()
	}
	return a.cfg.MQTT.Broker
}

// Agent returns the running agent.
func (a *App) Agent() *agent.Agent { return a.ag }

// Store returns the open store.
func (a *App) Store() *store.Store { return a.st }

// AdminAddr is the admin API's address, "" when disabled.
func (a *App) AdminAddr() string {
	if a.ln == nil {
		return ""
	}
	return a.ln.Addr().String()
}

// Reload reloads the policy plugins (SIGHUP).
func (a *App) Reload(ctx context.Context) error {
	if a.host == nil {
		return nil
	}
	return a.host.Reload(ctx)
}

// Stop drains within ctx (shutdown_timeout) and closes everything. A
// failure of the store's final commit is its error too (invariant 5: a
// failed commit never ends in a clean stop).
func (a *App) Stop(ctx context.Context) error {
	err := a.ag.Stop(ctx)
	return errors.Join(err, a.closeAll())
}

// closeAll closes what is open; its error is the store's Close error.
func (a *App) closeAll() error {
	if a.adm != nil {
		sctx, c := context.WithTimeout(context.Background(), time.Second)
		a.adm.Shutdown(sctx)
		c()
	}
	if a.mc != nil {
		a.mc.Close()
	}
	if a.brk != nil {
		a.brk.Close()
	}
	if a.host != nil {
		a.host.Close(context.Background())
	}
	if a.http != nil {
		a.http.Close()
	}
	if a.st != nil {
		if err := a.st.Close(); err != nil {
			return fmt.Errorf("closing the store: %w", err)
		}
	}
	return nil
}

// lateClient lets the agent be built before the MQTT client exists (the
// client's handler needs the agent).
type lateClient struct{ c atomic.Pointer[mqtt.Client] }

func (l *lateClient) set(c *mqtt.Client) { l.c.Store(c) }

func (l *lateClient) PublishAsync(ctx context.Context, topic string, payload []byte, retained bool) (agent.Pending, error) {
	c := l.c.Load()
	if c == nil {
		return nil, errors.New("mqtt client not built yet")
	}
	p, err := c.PublishAsync(ctx, topic, payload, retained)
	if errors.Is(err, mqtt.ErrInvalidTopic) {
		return nil, fmt.Errorf("%w: %w", agent.ErrUnpublishable, err)
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

func buildDrivers(cfg *config.Config, log *slog.Logger) (map[string]device.Driver, *device.HTTP, error) {
	h, err := device.NewHTTP(device.HTTPOptions{Logger: log})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	out := map[string]device.Driver{}
	for i, d := range cfg.Devices {
		err := h.Add(d.ID, device.HTTPDevice{URL: d.Driver.URL, Timeout: d.Driver.Timeout.D(),
			Retries: *d.Driver.Retries, Idempotent: d.Driver.Idempotent, Queryable: d.Driver.Queryable})
		if err != nil {
			return nil, nil, fmt.Errorf("%w: devices[%d] (%s).driver: %v", ErrConfig, i, d.ID, err)
		}
		out[d.ID] = h
	}
	return out, h, nil
}

// buildPolicy loads every plugin a device binds; nil when none does. A load
// error (missing export, wrong ABI, config rejected) is a configuration
// error: exit 2.
func buildPolicy(ctx context.Context, cfg *config.Config, log *slog.Logger, reg prometheus.Registerer) (*policy.Host, error) {
	var bound bool
	for _, d := range cfg.Devices {
		bound = bound || d.Policy != nil
	}
	if !bound {
		return nil, nil
	}
	h := policy.NewHost(policy.HostOptions{CacheDir: filepath.Join(cfg.DataDir, "wazero-cache"), Logger: log, Registerer: reg})
	for i, d := range cfg.Devices {
		if d.Policy == nil {
			continue
		}
		b := policy.Binding{Plugin: d.Policy.Plugin, Path: filepath.Join(cfg.Plugins.Dir, d.Policy.Plugin+".wasm"), Config: d.Policy.ConfigJSON}
		if l := d.Policy.Limits; l != nil {
			b.Limits = policy.Limits{Timeout: l.Timeout.D(), Memory: int64(l.MemoryMiB) << 20, MaxInput: l.MaxInput,
				MaxOutput: l.MaxOutput, Instances: l.Instances, InitTimeout: l.InitTimeout.D()}
		}
		if err := h.Bind(d.ID, b); err != nil {
			return nil, fmt.Errorf("%w: devices[%d] (%s).policy: %v", ErrConfig, i, d.ID, err)
		}
	}
	if err := h.Start(ctx); err != nil {
		h.Close(context.Background())
		var le *policy.LoadError
		if errors.As(err, &le) { // a plugin or its config is wrong: exit 2
			return nil, fmt.Errorf("%w: policy: %v", ErrConfig, err)
		}
		return nil, fmt.Errorf("policy: %w", err)
	}
	return h, nil
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
