package policy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// HostOptions configure a Host. The zero value is usable: no disk cache,
// the default logger, unregistered metrics, the ABI's default limits.
type HostOptions struct {
	// CacheDir holds wazero's compiled code across restarts (the agent
	// passes data_dir/wazero-cache). Empty: compile at every start.
	CacheDir string
	// Logger receives load, reload and failure reports, and what plugins
	// log. Nil: slog.Default().
	Logger *slog.Logger
	// Registerer receives the edge_policy_* metrics. Nil: they are kept
	// but not registered.
	Registerer prometheus.Registerer
	// Defaults fill the zero fields of each binding's Limits; their own
	// zero fields take the ABI's defaults (DefaultLimits).
	Defaults Limits
	// WatchInterval is how often Watch looks at the plugin files. Zero: 1s.
	WatchInterval time.Duration
	// FailureThreshold is the number of failed calls in a row after which
	// a plugin is reported as failing (log at error level, gauge
	// edge_policy_failing = 1). Zero: 3.
	FailureThreshold int
	// CloseOnContextDone makes the host use wazero's
	// WithCloseOnContextDone to stop runaway calls instead of its own
	// interrupt check (instrument.go). Slower; for comparison in
	// benchmarks. The interpreter fallback always uses it.
	CloseOnContextDone bool
}

// Binding attaches a plugin to a device.
type Binding struct {
	// Plugin names the plugin in logs and metrics (the config's
	// policy.plugin). Empty: the file name without .wasm.
	Plugin string
	// Path is the .wasm file.
	Path string
	// Config is the device's policy.config, passed to policy_init. Empty
	// or null: {}.
	Config json.RawMessage
	// Limits override HostOptions.Defaults field by field.
	Limits Limits
}

// Host runs policy plugins for devices. It implements Evaluator.
//
// Life cycle: NewHost, Bind each device, Start (compiles, instantiates and
// runs policy_init, before the agent serves), Evaluate concurrently, Reload
// (on SIGHUP, or from Watch), Close.
//
// Pooling: instances are pooled per (plugin file, config, limits): devices
// that bind the same file with the same config share warm instances,
// since policy_init sees only the config. A plugin must therefore not keep
// per-device state between calls (it could not anyway: an instance can be
// replaced at any time).
type Host struct {
	opts      HostOptions
	log       *slog.Logger
	m         *metrics
	defaults  Limits
	threshold int

	mu       sync.Mutex // bindings
	bindings map[string]Binding

	reloadMu sync.Mutex // Start, Reload, Close; guards the fields below
	eng      *engine
	plugins  map[pluginKey]*plugin // current versions
	seen     map[string]fileStat   // what the last load saw of each file
	started  bool
	closed   bool

	table atomic.Pointer[table]
	base  context.Context // canceled by Close: refills
	stop  context.CancelFunc
	done  chan struct{} // closed by Close: Watch returns
	wg    sync.WaitGroup

	// Start's progress (Progress): plugin files to compile, and done.
	loadTotal, loadDone atomic.Int32
}

var _ Evaluator = (*Host)(nil)

// table maps devices to pools; it is replaced whole, atomically.
type table struct {
	pools  map[string]*pool
	closed bool
}

type fileStat struct {
	size    int64
	modTime time.Time
	err     string
}

// NewHost returns a Host. It does no I/O.
func NewHost(opts HostOptions) *Host {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	th := opts.FailureThreshold
	if th <= 0 {
		th = 3
	}
	h := &Host{
		opts:      opts,
		log:       log,
		m:         newMetrics(opts.Registerer),
		defaults:  opts.Defaults.or(DefaultLimits()),
		threshold: th,
		bindings:  map[string]Binding{},
		plugins:   map[pluginKey]*plugin{},
		seen:      map[string]fileStat{},
		done:      make(chan struct{}),
	}
	h.base, h.stop = context.WithCancel(context.Background())
	return h
}

// Bind attaches a plugin to a device, replacing an earlier binding. It does
// no I/O: the file is read at Start, or at the next Reload once started.
func (h *Host) Bind(device string, b Binding) error {
	if device == "" {
		return fmt.Errorf("%w: empty device ID", ErrBinding)
	}
	if b.Path == "" {
		return fmt.Errorf("%w: device %s: empty plugin path", ErrBinding, device)
	}
	if err := b.Limits.validate(); err != nil {
		return fmt.Errorf("%w: device %s: %v", ErrBinding, device, err)
	}
	cfg := bytes.TrimSpace(b.Config)
	if len(cfg) == 0 || string(cfg) == "null" {
		cfg = emptyObject
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, cfg); err != nil {
		return fmt.Errorf("%w: device %s: policy.config is not valid JSON: %v", ErrBinding, device, err)
	}
	b.Config = compact.Bytes()
	if b.Plugin == "" {
		b.Plugin = strings.TrimSuffix(filepath.Base(b.Path), ".wasm")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.bindings[device] = b
	return nil
}

// Unbind removes a device's binding (effective at the next Reload).
func (h *Host) Unbind(device string) {
	h.mu.Lock()
	delete(h.bindings, device)
	h.mu.Unlock()
}

// Start compiles every bound plugin (once per file, through the
// compilation cache), instantiates one warm instance per pool and runs
// policy_init with each binding's config. Any failure is returned (joined
// *LoadErrors naming the file, the export or the devices) and nothing is
// served: the agent must refuse to start. ctx bounds the work; canceling
// it makes Start fail.
func (h *Host) Start(ctx context.Context) error {
	h.reloadMu.Lock()
	defer h.reloadMu.Unlock()
	switch {
	case h.closed:
		return ErrClosed
	case h.started:
		return ErrStarted
	}
	eng, err := newEngine(ctx, h.opts.CacheDir, h.log, h.opts.CloseOnContextDone)
	if err != nil {
		return err
	}
	h.eng = eng
	next, created, plugins, errs := h.reconcile(ctx, nil, true)
	if len(errs) > 0 {
		for _, p := range created {
			p.retire()
		}
		h.eng.close(ctx)
		h.eng = nil
		return errors.Join(errs...)
	}
	h.adopt(plugins, false)
	h.table.Store(next)
	h.started = true
	return nil
}

// Progress is how far Start has got.
type Progress struct {
	// Compiled of Total plugin files are compiled (or loaded from the
	// compilation cache); both are 0 before Start has looked at them.
	Compiled, Total int
	// Ready: Start has succeeded (every plugin is loaded and initialised,
	// and Evaluate decides) and Close has not been called.
	Ready bool
}

// Progress says how far Start has got; it may be called from any
// goroutine while Start runs (the agent's /readyz does).
func (h *Host) Progress() Progress {
	t := h.table.Load()
	return Progress{Compiled: int(h.loadDone.Load()), Total: int(h.loadTotal.Load()), Ready: t != nil && !t.closed}
}

// Evaluate decides one command for one device (Evaluator). A device with
// no binding is allowed unchanged. An error means the policy did not
// decide (an *EvalError): the caller rejects the command policy_error.
// Canceling ctx interrupts the call (and fails it).
func (h *Host) Evaluate(ctx context.Context, device string, in Input) (Decision, error) {
	for {
		t := h.table.Load()
		if t == nil {
			return Decision{}, ErrNotStarted
		}
		if t.closed {
			return Decision{}, ErrClosed
		}
		p, ok := t.pools[device]
		if !ok {
			return Decision{Allow: true}, nil
		}
		if !p.enter() {
			continue // retired by a reload: its successor is already published
		}
		d, err := p.evaluate(ctx, device, &in)
		p.exit()
		return d, err
	}
}

// Bound reports whether device has a policy binding (Binder). Before Start
// and after Close it says true: Evaluate would fail.
func (h *Host) Bound(device string) bool {
	t := h.table.Load()
	if t == nil || t.closed {
		return true
	}
	_, ok := t.pools[device]
	return ok
}

// Reload re-reads every bound plugin file and the current bindings. A file
// whose content changed is compiled and checked aside (exports, ABI
// version, policy_init with each bound device's config); then the new
// pools replace the old ones atomically. Calls in flight finish on the old
// version. A file that fails to load keeps its devices on the old version
// (a device that had none fails closed: every call is an error) and the
// failure is logged and returned. ctx bounds the compilation and
// initialisation.
func (h *Host) Reload(ctx context.Context) error {
	h.reloadMu.Lock()
	defer h.reloadMu.Unlock()
	switch {
	case h.closed:
		return ErrClosed
	case !h.started:
		return ErrNotStarted
	}
	old := h.table.Load()
	next, _, plugins, errs := h.reconcile(ctx, old, false)
	for _, err := range errs {
		h.log.Error("policy: reload failed; keeping the previous version", "err", err)
	}
	changed := len(next.pools) != len(old.pools)
	for d, p := range next.pools {
		if old.pools[d] != p {
			changed = true
		}
	}
	if changed {
		h.table.Store(next)
	}
	live := map[*pool]bool{}
	for _, p := range next.pools {
		live[p] = true
	}
	for _, p := range old.pools {
		if !live[p] {
			p.retire()
		}
	}
	h.adopt(plugins, true)
	return errors.Join(errs...)
}

// reconcile builds the table for the current bindings. Plugins whose file
// is unchanged and pools whose (plugin, config, limits) are unchanged are
// reused from old. It returns the new table, the pools it created, the
// plugin versions to keep as current (each holding its "current"
// reference), and the load errors. With strict (Start) a failure leaves no
// fallback; Start discards everything.
func (h *Host) reconcile(ctx context.Context, old *table, strict bool) (*table, []*pool, map[pluginKey]*plugin, []error) {
	h.mu.Lock()
	binds := make(map[string]Binding, len(h.bindings))
	for d, b := range h.bindings {
		binds[d] = b
	}
	h.mu.Unlock()
	devices := make([]string, 0, len(binds))
	for d := range binds {
		devices = append(devices, d)
	}
	sort.Strings(devices)

	var errs []error
	plugins := map[pluginKey]*plugin{} // versions in use after this reconcile
	fresh := map[pluginKey]*plugin{}   // compiled now
	failed := map[pluginKey]error{}
	lims := map[string]Limits{}
	if strict {
		keys := map[pluginKey]bool{}
		for _, d := range devices {
			keys[pluginKey{binds[d].Path, binds[d].Limits.or(h.defaults).pages()}] = true
		}
		h.loadTotal.Store(int32(len(keys)))
	}
	for _, d := range devices {
		b := binds[d]
		lim := b.Limits.or(h.defaults)
		lims[d] = lim
		k := pluginKey{b.Path, lim.pages()}
		if _, ok := fresh[k]; ok {
			continue
		}
		if _, ok := failed[k]; ok {
			continue
		}
		if _, ok := plugins[k]; ok {
			continue
		}
		p, err := h.load(ctx, b.Plugin, k)
		if strict {
			h.loadDone.Add(1)
		}
		switch {
		case err != nil:
			failed[k] = err
			errs = append(errs, err)
			if !strict {
				h.m.reloads.WithLabelValues(b.Plugin, "error").Inc()
			}
		case p == h.plugins[k]:
			plugins[k] = p
		default:
			fresh[k] = p
		}
	}

	// Old pools by key, to reuse.
	oldByKey := map[poolKey]*pool{}
	if old != nil {
		for _, p := range old.pools {
			if p.plugin != nil {
				oldByKey[poolKey{p.plugin, string(p.config), p.lim}] = p
			}
		}
	}
	next := &table{pools: map[string]*pool{}}
	var created []*pool
	pools := map[poolKey]*pool{}
	members := map[*pool][]string{}
	errPools := map[pluginKey]*pool{}
	fallback := func(d string, k pluginKey, err error) {
		if old != nil {
			if op, ok := old.pools[d]; ok && op.plugin != nil && op.plugin.key == k {
				next.pools[d] = op // keep the previous version
				if _, ok := plugins[k]; !ok {
					plugins[k] = op.plugin
				}
				return
			}
		}
		ep := errPools[k]
		if ep == nil {
			ep = h.errorPool(binds[d].Plugin, fmt.Errorf("%w: %w", ErrNotLoaded, err))
			errPools[k] = ep
		}
		next.pools[d] = ep
	}
	for _, d := range devices {
		b := binds[d]
		lim := lims[d]
		k := pluginKey{b.Path, lim.pages()}
		if err, bad := failed[k]; bad {
			fallback(d, k, err)
			continue
		}
		pl := fresh[k]
		if pl == nil {
			pl = plugins[k]
		}
		key := poolKey{pl, string(b.Config), lim}
		p := pools[key]
		if p == nil {
			if op := oldByKey[key]; op != nil {
				p = op
			} else {
				p = h.newPool(pl, b.Plugin, b.Config, lim)
				created = append(created, p)
			}
			pools[key] = p
		}
		members[p] = append(members[p], d)
		next.pools[d] = p
	}

	// Warm up every new pool: this runs policy_init with its config.
	for _, p := range created {
		p.devices = members[p]
		if !p.enter() {
			continue
		}
		p.sem <- struct{}{}
		inst, err := p.instantiate(ctx)
		if err != nil {
			<-p.sem
		} else {
			p.put(inst)
		}
		p.exit()
		if err != nil {
			lerr := loadErr(p.name, p.plugin.key.path, p.devices, "", err)
			if errors.Is(err, ErrABIVersion) {
				lerr.Export = "policy_abi_version"
			}
			errs = append(errs, lerr)
			if !strict {
				h.m.reloads.WithLabelValues(p.name, "error").Inc()
			}
			for _, d := range p.devices {
				fallback(d, p.plugin.key, lerr)
			}
			p.retire()
			continue
		}
		plugins[p.plugin.key] = p.plugin
	}
	// A fresh plugin that no pool ended up using has already been closed
	// by its last pool's retirement.
	return next, created, plugins, errs
}

// adopt makes plugins the current versions: each new one takes the
// "current" reference, each replaced or unbound one drops it (and is
// closed once its last pool has drained).
func (h *Host) adopt(plugins map[pluginKey]*plugin, reload bool) {
	for k, p := range plugins {
		cur := h.plugins[k]
		if cur == p {
			continue
		}
		p.ref()
		if cur != nil {
			cur.unref()
		}
		h.m.compile.WithLabelValues(p.name).Set(p.took.Seconds())
		if reload {
			h.m.reloads.WithLabelValues(p.name, "ok").Inc()
			h.log.Info("policy: plugin reloaded", "plugin", p.name, "path", k.path, "compile", p.took)
		} else {
			h.log.Info("policy: plugin loaded", "plugin", p.name, "path", k.path, "compile", p.took)
		}
	}
	for k, cur := range h.plugins {
		if _, ok := plugins[k]; !ok {
			cur.unref()
		}
	}
	h.plugins = plugins
}

// load returns the plugin version for k: the current one when the file is
// unchanged, else a freshly compiled and checked one.
func (h *Host) load(ctx context.Context, name string, k pluginKey) (*plugin, error) {
	f, err := os.Open(k.path)
	if err != nil {
		h.seen[k.path] = fileStat{err: err.Error()}
		return nil, loadErr(name, k.path, nil, "", fmt.Errorf("%w: %w", ErrRead, err))
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, loadErr(name, k.path, nil, "", fmt.Errorf("%w: %w", ErrRead, err))
	}
	h.seen[k.path] = fileStat{size: st.Size(), modTime: st.ModTime()}
	bin, err := io.ReadAll(f)
	if err != nil {
		return nil, loadErr(name, k.path, nil, "", fmt.Errorf("%w: %w", ErrRead, err))
	}
	if cur := h.plugins[k]; cur != nil && cur.digest == sha256.Sum256(bin) {
		return cur, nil
	}
	return h.eng.compile(ctx, name, k.path, bin, k.pages)
}

// Watch polls the bound plugin files every WatchInterval and calls Reload
// when one changed (size, modification time, or appearing/disappearing).
// It blocks until ctx is done or the Host is closed; the caller runs it in
// its own goroutine. Reload failures are logged (and keep the old
// version); Watch goes on.
func (h *Host) Watch(ctx context.Context) error {
	iv := h.opts.WatchInterval
	if iv <= 0 {
		iv = time.Second
	}
	tick := time.NewTicker(iv)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-h.done:
			return ErrClosed
		case <-tick.C:
		}
		if h.changed() {
			if err := h.Reload(ctx); errors.Is(err, ErrClosed) {
				return err
			}
		}
	}
}

// changed reports whether a bound file differs from what the last load saw.
func (h *Host) changed() bool {
	h.mu.Lock()
	paths := map[string]bool{}
	for _, b := range h.bindings {
		paths[b.Path] = true
	}
	h.mu.Unlock()
	h.reloadMu.Lock()
	defer h.reloadMu.Unlock()
	if !h.started || h.closed {
		return false
	}
	for p := range paths {
		var now fileStat
		if st, err := os.Stat(p); err != nil {
			now.err = err.Error()
		} else {
			now.size, now.modTime = st.Size(), st.ModTime()
		}
		if seen, ok := h.seen[p]; !ok || seen.size != now.size || !seen.modTime.Equal(now.modTime) || seen.err != now.err {
			return true
		}
	}
	return false
}

// Close stops Watch, lets calls in flight finish (until ctx is done), and
// releases every instance, the compiled code and the runtime. Calls after
// Close return ErrClosed; Close itself is idempotent.
func (h *Host) Close(ctx context.Context) error {
	h.reloadMu.Lock()
	defer h.reloadMu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	close(h.done)
	old := h.table.Swap(&table{closed: true})
	if old != nil {
		for _, p := range old.pools {
			p.retire()
		}
	}
	h.stop() // refills in progress give up
	var err error
	if old != nil {
		for _, p := range old.pools {
			select {
			case <-p.done:
			case <-ctx.Done():
				err = fmt.Errorf("policy: close: calls still in flight: %w", ctx.Err())
			}
			if err != nil {
				break
			}
		}
	}
	h.wg.Wait()
	for _, p := range h.plugins {
		p.unref()
	}
	h.plugins = nil
	if h.eng != nil {
		h.eng.close(ctx)
	}
	return err
}

// PluginInfo is one loaded plugin binding as an operator sees it.
type PluginInfo struct {
	Name    string   // the binding's plugin name
	Devices []string // the devices bound to it, sorted
	// State is "ok", "failing" (its last FailureThreshold calls failed)
	// or "error" (it could not be loaded: every call fails closed).
	State string
}

// Plugins lists the plugins in use now, by name.
func (h *Host) Plugins() []PluginInfo {
	t := h.table.Load()
	if t == nil {
		return nil
	}
	by := map[string]*PluginInfo{}
	for dev, p := range t.pools {
		pi := by[p.name]
		if pi == nil {
			pi = &PluginInfo{Name: p.name, State: "ok"}
			by[p.name] = pi
		}
		pi.Devices = append(pi.Devices, dev)
		switch {
		case p.loadErr != nil:
			pi.State = "error"
		case pi.State == "ok" && p.consecutive.Load() >= int32(h.threshold):
			pi.State = "failing"
		}
	}
	out := make([]PluginInfo, 0, len(by))
	for _, pi := range by {
		sort.Strings(pi.Devices)
		out = append(out, *pi)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
