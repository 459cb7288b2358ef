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
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/admin"
	"github.com/edge-agent/edge-agent/internal/agent"
	"github.com/edge-agent/edge-agent/internal/buildinfo"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/device"
	"github.com/edge-agent/edge-agent/internal/failpoint"
	"github.com/edge-agent/edge-agent/internal/fencemem"
	"github.com/edge-agent/edge-agent/internal/mqtt"
	"github.com/edge-agent/edge-agent/internal/mqtt/mosq"
	"github.com/edge-agent/edge-agent/internal/policy"
	"github.com/edge-agent/edge-agent/internal/store"
)

// ErrConfig wraps errors the CLI reports with exit status 2.
var ErrConfig = config.ErrInvalid

// Options tune an App. Zero values mean defaults.
type Options struct {
	Logger  *slog.Logger
	Version string
	// Revision is the commit the binary was built from (edge_agent_build_info's
	// revision label); empty: read from the binary's build information.
	Revision string
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
	mb   *device.Modbus
	ag   *agent.Agent
	adm  *http.Server
	ln   net.Listener
	reg  *prometheus.Registry
	pub  lateClient // the MQTT client
	// mqttOpts are the MQTT client's options: with ha, a new client is
	// made with them each time this agent becomes active again.
	mqttOpts mqtt.Options
	runCtx   context.Context // Start's

	mqttErr chan error
	boot    startup       // what Start is doing (startup.go)
	handler handlerSwitch // the admin API's
	// wg is every goroutine the App starts (admin server, MQTT connect,
	// plugin watcher); Stop waits for them. stopWatch ends the watcher.
	wg        sync.WaitGroup
	stopWatch context.CancelFunc
	live      liveness

	fm *fencemem.Memory // the fence memory beyond this disk (coordination.go)
	// fmSeen is fm, published for Standby and StandbyLive, which may be
	// called while Start runs (the store is open before it is set).
	fmSeen   atomic.Pointer[fencemem.Memory]
	failed   chan struct{} // closed when the agent or the fence memory failed
	failErr  error         // why, set before failed is closed
	stopFail chan struct{}
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
	a := &App{cfg: cfg, o: o, log: o.Logger, mqttErr: make(chan error, 1), failed: make(chan struct{}), stopFail: make(chan struct{})}
	a.boot.set("not started")
	return a
}

// Start opens everything and begins serving; the MQTT connection is made in
// the background (MQTTErr reports a failure to connect). On error,
// everything opened so far is closed. The admin API serves from the
// beginning (/healthz, and /readyz saying what Start waits for, such as
// "compiling plugins 2/5"); the agent's workers and the MQTT session start
// only once every plugin is loaded (startup.go).
func (a *App) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			a.closeAll()
		}
	}()
	cfg := a.cfg
	a.runCtx = ctx
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return fmt.Errorf("data_dir %s: %w", cfg.DataDir, err)
	}
	a.reg = prometheus.NewRegistry()
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	pm := newProcessMetrics(a.reg, cfg.GatewayID, a.o.Version, buildinfo.Revision(a.o.Revision), a.mqttConnected)
	a.boot.set("opening the store")
	if cfg.Admin.Listen != "" {
		a.ln, err = net.Listen("tcp", cfg.Admin.Listen)
		if err != nil {
			return fmt.Errorf("admin.listen %s: %w", cfg.Admin.Listen, err)
		}
		a.handler.set(a.startingHandler())
		a.adm = &http.Server{Handler: admin.Guard(&a.handler, cfg.Admin.Listen, cfg.Admin.AllowedHosts), ReadHeaderTimeout: 5 * time.Second}
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.adm.Serve(a.ln)
		}()
		a.log.Info("admin API listening", "addr", a.ln.Addr().String())
	}
	a.st, err = store.Open(filepath.Join(cfg.DataDir, "agent.db"), &store.Options{Logger: a.log,
		ObserveCommit: pm.commit})
	if err != nil {
		return err
	}
	a.st.Start()
	if err := a.startFenceMemory(ctx); err != nil {
		return err
	}
	failpoint.Hit(failpoint.Startup, "")

	drv, devs, err := a.buildDrivers()
	if err != nil {
		return err
	}
	a.boot.set("loading plugins")
	if a.host, err = buildPolicy(ctx, cfg, a.log, a.reg, filepath.Join(cfg.DataDir, "wazero-cache"), &a.boot.host); err != nil {
		return err
	}
	a.boot.host.Store(nil)
	a.boot.set("starting the agent")
	brokers, username, password := cfg.MQTT.BrokerURLs(), cfg.MQTT.Username, cfg.MQTT.Password
	tlsOpts := mqtt.TLSOptions{CAFile: cfg.MQTT.TLS.CAFile, CertFile: cfg.MQTT.TLS.CertFile, KeyFile: cfg.MQTT.TLS.KeyFile}
	if cfg.MQTT.Broker == "embedded" {
		m := cfg.MQTT
		pw, acl, err := embeddedAuth(m.Embedded)
		if err != nil {
			return err
		}
		a.brk, err = mqtt.NewEmbedded(mqtt.EmbeddedOptions{Listen: m.EmbeddedListen,
			DataDir: filepath.Join(cfg.DataDir, "broker"), Logger: a.log,
			Passwords: pw, AllowAnonymous: m.EmbeddedAllowAnonymous,
			ACL: acl, TLS: m.Embedded.TLS, AgentClientID: m.ClientID})
		if err != nil {
			return fmt.Errorf("%w: mqtt.embedded_listen: %v", ErrConfig, err)
		}
		if err := a.brk.Start(ctx); err != nil {
			if inUse := addrInUse(err, cfg.MQTT.EmbeddedListen); inUse != nil {
				return inUse
			}
			return fmt.Errorf("embedded broker on %s: %w", cfg.MQTT.EmbeddedListen, err)
		}
		// The agent reaches its own broker on its own listener, whatever
		// the public one requires (internal/mqtt/embedauth.go).
		var agentURL string
		agentURL, username, password = a.brk.AgentURL()
		brokers = []string{agentURL}
		tlsOpts = mqtt.TLSOptions{}
	}
	var ev policy.Evaluator
	if a.host != nil {
		ev = a.host
	}
	ver, err := buildAuth(cfg)
	if err != nil {
		return err
	}
	gw := agent.Gateway{GatewayID: cfg.GatewayID, TopicPrefix: cfg.MQTT.TopicPrefix,
		Retention: cfg.Dedup.Retention.D(), KeepLast: cfg.Dedup.KeepLast}
	a.ag, err = agent.New(agent.Options{Gateway: gw, Devices: devs, Store: a.st, Publisher: &a.pub, Drivers: drv,
		Policy: ev, Auth: ver, ResultKey: cfg.Security.ResultKey,
		Logger: a.log, Registry: a.reg, Fences: a.fm, Proven: a.fm.Proven})
	if err != nil {
		return err
	}
	a.fm.OnFloor(a.ag.FloorTaken)
	if err := a.ag.Start(ctx); err != nil {
		return err
	}
	a.watchFailures()
	statusTopic := wire.StatusTopic(cfg.MQTT.TopicPrefix, cfg.GatewayID)
	// Only an agent that serves connects: single, or active (a standby
	// has no broker session). With ha the role is active whenever the
	// session is up (onRole closes it on a stand-down).
	role := fencemem.RoleSingle
	if cfg.HA.Enabled {
		role = fencemem.RoleActive
	}
	host, _ := os.Hostname()
	online, err := json.Marshal(wire.GatewayStatus{State: "online", Version: a.o.Version, Role: role, Host: host})
	if err != nil {
		return err
	}
	offline, err := json.Marshal(wire.GatewayStatus{State: "offline", Version: a.o.Version, Role: role, Host: host})
	if err != nil {
		return err
	}
	a.mqttOpts = mqtt.Options{
		Brokers: brokers, ClientID: cfg.MQTT.ClientID,
		Username: username, Password: password,
		TLS:           tlsOpts,
		Subscriptions: []string{wire.CmdFilter(cfg.MQTT.TopicPrefix, cfg.GatewayID)},
		Handler: func(m *mqtt.Message) {
			if cfg.HA.Enabled && !a.fm.Proven() {
				// A deposed active (ha) woken from a pause reconnects
				// before it stands down: what the broker delivers it
				// then is neither taken nor acknowledged, so the broker
				// gives it to the session's next holder, the active
				// (docs/protocol.md §8; invariant 4). Without ha the
				// session stays, and what comes while the session is not
				// proven is answered fence_unconfirmed (fencemem's lapse).
				a.log.Warn("ha: a command is not taken while the session is not proven alive; the broker keeps it for the active", "topic", m.Topic)
				return
			}
			a.ag.Deliver(agent.Delivery{Topic: m.Topic, Payload: m.Payload, Retained: m.Retained, Ack: m.Ack})
		},
		WillTopic: statusTopic, WillPayload: offline, OnlinePayload: online, OfflinePayload: offline,
		Logger: a.log,
	}
	if cfg.HA.Enabled {
		// A paused active, woken, must not take the gateway's broker
		// session back from the agent that took over before it has
		// noticed it is deposed: no connection, reconnects included,
		// while the session is not proven alive (docs/protocol.md §8).
		a.mqttOpts.MayConnect = a.fm.Proven
	}
	mc, err := mqtt.New(a.mqttOpts)
	if err != nil {
		return fmt.Errorf("%w: mqtt: %v", ErrConfig, err)
	}
	a.pub.set(mc)
	if a.adm != nil {
		a.handler.set(admin.Handler(a.ag, a.adminOptions()))
	}
	a.fm.OnRole(a.onRole)
	if r, _ := a.fm.Role(); r == fencemem.RoleStandby {
		// Stood down between the fence memory's start and OnRole (a
		// slow plugin compile and an etcd blip): that stand-down's
		// tell was not heard, so it is done here (the client is closed
		// and never connects); becoming active again makes a new one.
		a.onRole(false)
	}
	a.boot.step.Store(nil) // after every field Ready and the handler read
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.mqttErr <- mc.Start(ctx) // buffered: the first connect's result
	}()
	if a.host != nil {
		wctx, cancel := context.WithCancel(context.Background())
		a.stopWatch = cancel
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.host.Watch(wctx)
		}()
	}
	a.log.Info("edge-agent running", "gateway", cfg.GatewayID, "broker", a.BrokerURL(), "devices", len(cfg.Devices), "version", a.o.Version)
	return nil
}

// adminOptions are the admin API's options.
func (a *App) adminOptions() admin.Options {
	cfg := a.cfg
	return admin.Options{Token: cfg.Admin.Token, Gatherer: a.reg,
		Ready: a.Ready, OffLoopback: !config.IsLoopback(cfg.Admin.Listen), Version: a.o.Version, MQTTConnected: a.mqttConnected, Plugins: a.plugins,
		Coordination: a.coordination, Role: a.role}
}

// Ready is nil once the store is open, plugins are loaded and MQTT is
// subscribed; otherwise it says what the agent waits for.
func (a *App) Ready() error {
	if err := a.boot.err(); err != nil {
		return err
	}
	if mc := a.pub.c.Load(); mc == nil || !mc.Subscribed() {
		return errors.New("MQTT not subscribed")
	}
	return nil
}

// MQTTErr receives the result of the first MQTT connect (nil: connected).
func (a *App) MQTTErr() <-chan error { return a.mqttErr }

// Failed is closed on a fatal error (the process must exit 1 at once).
// That is a failed agent, or another live agent that took this gateway's
// registration in etcd.
func (a *App) Failed() <-chan struct{} { return a.failed }

// Err is the fatal error.
func (a *App) Err() error {
	select {
	case <-a.failed:
		return a.failErr
	default:
		return nil
	}
}

// BrokerURL is the broker the agent is connected to (the embedded one's
// actual address when broker: embedded; with mqtt.brokers, the node of the
// current connection or of the last attempt).
func (a *App) BrokerURL() string {
	if a.brk != nil {
		return a.brk.URL()
	}
	if mc := a.pub.c.Load(); mc != nil {
		return mc.Broker()
	}
	return a.cfg.MQTT.BrokerURLs()[0]
}

// Store returns the open store.
func (a *App) Store() *store.Store { return a.st }

// AdminAddr is the admin API's address, "" when disabled.
func (a *App) AdminAddr() string {
	if a.ln == nil {
		return ""
	}
	return a.ln.Addr().String()
}

// Reload reloads the controllers' public keys and the policy plugins
// (SIGHUP). Each is all or nothing: a key file that cannot be read keeps
// every key in use, and is an error naming the key; likewise for plugins.
func (a *App) Reload(ctx context.Context) error {
	err := a.reloadKeys()
	if a.host != nil {
		if perr := a.host.Reload(ctx); perr != nil {
			err = errors.Join(err, fmt.Errorf("policy: %w", perr))
		}
	}
	return err
}

// Stop drains within ctx (shutdown_timeout) and closes everything. A
// failure of the store's final commit is its error too (invariant 5: a
// failed commit never ends in a clean stop).
func (a *App) Stop(ctx context.Context) error {
	err := a.ag.Stop(ctx)
	return errors.Join(err, a.closeAll())
}

// closeAll closes what is open and waits for every goroutine the App
// started; its error is the store's Close error.
func (a *App) closeAll() error {
	if a.stopWatch != nil {
		a.stopWatch()
	}
	close(a.stopFail)
	if a.adm != nil {
		sctx, c := context.WithTimeout(context.Background(), time.Second)
		if a.adm.Shutdown(sctx) != nil {
			a.adm.Close() // a stream still open (GET /v1/events) is cut
		}
		c()
	}
	if mc := a.pub.c.Load(); mc != nil {
		mc.Close()
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
	if a.mb != nil {
		a.mb.Close()
	}
	a.wg.Wait()
	if a.fm != nil {
		a.fm.Close()
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

// embeddedAuth parses the embedded broker's password and ACL files, as
// config read (and checked) them; nil for a file not configured.
func embeddedAuth(e config.Embedded) (pw *mosq.Passwords, acl *mosq.ACL, err error) {
	if e.Passwords != nil {
		if pw, err = mosq.ParsePasswords(e.Passwords); err != nil {
			return nil, nil, fmt.Errorf("%w: mqtt.embedded_password_file: %v", ErrConfig, err)
		}
	}
	if e.ACL != nil {
		if acl, err = mosq.ParseACL(e.ACL); err != nil {
			return nil, nil, fmt.Errorf("%w: mqtt.embedded_acl_file: %v", ErrConfig, err)
		}
	}
	return pw, acl, nil
}

// buildDrivers builds the drivers of cfg's devices (a.http and a.mb), and
// the devices as the agent runs them: the one translation of a device's
// configuration into what its driver and the agent take.
func (a *App) buildDrivers() (map[string]device.Driver, []agent.Device, error) {
	var err error
	if a.http, err = device.NewHTTP(device.HTTPOptions{Logger: a.log}); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if a.mb, err = device.NewModbus(device.ModbusOptions{Logger: a.log}); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	drv := map[string]device.Driver{}
	devs := make([]agent.Device, 0, len(a.cfg.Devices))
	for i, d := range a.cfg.Devices {
		ad := agent.Device{ID: d.ID, Type: d.Type, Group: d.Group, Lock: d.Lock, Worker: d.WorkerID(),
			Queue: d.Queue, Resends: d.Driver.Resends, ResolveSettle: d.Driver.ResolveSettle.D()}
		switch dc := d.Driver.Config.(type) {
		case *device.HTTPConfig:
			hd := dc.Device()
			err = a.http.Add(d.ID, hd)
			drv[d.ID], ad.Timeout, ad.Retries = a.http, hd.Timeout, hd.Retries
		case *device.ModbusConfig:
			md := dc.Device()
			err = a.mb.Add(d.ID, md)
			drv[d.ID], ad.Timeout = a.mb, md.Timeout
		default:
			err = fmt.Errorf("kind %q has no driver", d.Driver.Kind)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%w: devices[%d] (%s).driver: %v", ErrConfig, i, d.ID, err)
		}
		devs = append(devs, ad)
	}
	return drv, devs, nil
}

// buildPolicy loads every plugin a device binds; nil when none does. A load
// error (missing export, wrong ABI, config rejected) is a configuration
// error: exit 2.
// loading, if not nil, receives the host while its plugins load (for
// Ready).
func buildPolicy(ctx context.Context, cfg *config.Config, log *slog.Logger, reg prometheus.Registerer, cacheDir string, loading *atomic.Pointer[policy.Host]) (*policy.Host, error) {
	var bound bool
	for _, d := range cfg.Devices {
		bound = bound || d.Policy != nil
	}
	if !bound {
		return nil, nil
	}
	h := policy.NewHost(policy.HostOptions{CacheDir: cacheDir, Logger: log, Registerer: reg})
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
	if loading != nil {
		loading.Store(h)
	}
	if err := h.Start(ctx); err != nil {
		h.Close(context.Background())
		var le *policy.LoadError
		if errors.As(err, &le) { // a plugin or its config is wrong: exit 2
			return nil, fmt.Errorf("%w: policy: %w", ErrConfig, err)
		}
		return nil, fmt.Errorf("policy: %w", err)
	}
	return h, nil
}
