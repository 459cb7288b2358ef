package policy

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// pool holds the warm instances of one plugin version for one
// configuration: instances are interchangeable only when policy_init got
// the same config, so devices that bind the same file with the same config
// (and limits) share a pool, and every other binding has its own.
//
// A pool is retired when a reload replaces it: calls already inside finish
// on it, new calls go to its successor, and its instances are closed once
// the last call leaves.
type pool struct {
	h       *Host
	plugin  *plugin // nil for an error pool
	name    string
	config  []byte
	lim     Limits
	devices []string // the devices it was created for (error messages)
	loadErr error    // error pool: every call fails with it
	sink    *sink
	pm      *poolMetrics

	idle chan *instance
	sem  chan struct{} // one token per live instance

	mu      sync.Mutex
	active  int // calls and refills inside
	retired bool
	drained bool
	done    chan struct{} // closed when drained

	consecutive atomic.Int32 // failures in a row
}

type poolKey struct {
	plugin *plugin
	config string
	lim    Limits
}

func (h *Host) newPool(p *plugin, name string, config []byte, lim Limits) *pool {
	pl := &pool{
		h: h, plugin: p, name: name, config: config, lim: lim,
		sink: &sink{log: h.log, plugin: name, path: p.key.path},
		pm:   h.m.forPlugin(name),
		idle: make(chan *instance, lim.Instances),
		sem:  make(chan struct{}, lim.Instances),
		done: make(chan struct{}),
	}
	p.ref()
	return pl
}

func (h *Host) errorPool(name string, err error) *pool {
	p := &pool{h: h, name: name, loadErr: err, pm: h.m.forPlugin(name), done: make(chan struct{}), drained: true}
	close(p.done)
	return p
}

// enter admits a call (or a refill); false once the pool is retired.
func (p *pool) enter() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.retired {
		return false
	}
	p.active++
	return true
}

func (p *pool) exit() {
	p.mu.Lock()
	p.active--
	if p.retired && p.active == 0 {
		p.drainLocked()
	}
	p.mu.Unlock()
}

// retire stops admitting calls; the pool drains when the last one leaves.
func (p *pool) retire() {
	p.mu.Lock()
	if !p.retired {
		p.retired = true
		if p.active == 0 {
			p.drainLocked()
		}
	}
	p.mu.Unlock()
}

func (p *pool) drainLocked() {
	if p.drained {
		return
	}
	p.drained = true
	for {
		select {
		case inst := <-p.idle:
			inst.close()
			<-p.sem
			p.pm.instances.Dec()
			continue
		default:
		}
		break
	}
	if p.plugin != nil {
		p.plugin.unref()
	}
	close(p.done)
}

// get returns an idle instance, or instantiates one while the pool is
// below its size, or waits for one to come back.
func (p *pool) get(ctx context.Context) (*instance, error) {
	select {
	case inst := <-p.idle:
		return inst, nil
	default:
	}
	select {
	case inst := <-p.idle:
		return inst, nil
	case p.sem <- struct{}{}:
		inst, err := p.instantiate(ctx)
		if err != nil {
			<-p.sem
			return nil, err
		}
		return inst, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// instantiate makes a new instance; the caller holds a sem token.
func (p *pool) instantiate(ctx context.Context) (*instance, error) {
	inst, err := p.h.eng.newInstance(ctx, p.plugin, p.config, p.sink, p.lim)
	if err != nil {
		return nil, err
	}
	p.pm.instances.Inc()
	return inst, nil
}

// put gives an instance back (it is inside the pool: active > 0).
func (p *pool) put(inst *instance) {
	p.idle <- inst // never blocks: idle has room for every sem token
}

// discard throws a failed instance away and starts a replacement, so the
// next call finds a warm one.
func (p *pool) discard(inst *instance) {
	inst.close()
	<-p.sem
	p.pm.instances.Dec()
	p.pm.replaced.Inc()
	if len(p.idle) == 0 {
		p.h.refill(p)
	}
}

// evaluate runs one call on one instance. The caller is inside the pool.
func (p *pool) evaluate(ctx context.Context, device string, in *Input) (Decision, error) {
	start := time.Now()
	defer func() { p.pm.seconds.Observe(time.Since(start).Seconds()) }()
	if p.loadErr != nil {
		p.pm.errs.Inc()
		return Decision{}, &EvalError{Device: device, Plugin: p.name, Err: p.loadErr}
	}
	inst, err := p.get(ctx)
	if err != nil {
		if ctx.Err() == nil {
			p.failed(device, "init", err)
		}
		return Decision{}, &EvalError{Device: device, Plugin: p.name, Err: err}
	}
	d, fault, err := inst.evaluate(ctx, in, &p.lim)
	if err != nil {
		if fault {
			p.discard(inst)
			if ctx.Err() == nil || !errors.Is(err, ErrTimeout) {
				p.failed(device, failureKind(err), err)
			}
		} else {
			p.put(inst)
			p.pm.errs.Inc()
		}
		return Decision{}, &EvalError{Device: device, Plugin: p.name, Err: err}
	}
	p.put(inst)
	switch {
	case !d.Allow:
		p.pm.deny.Inc()
	case d.Params != nil:
		p.pm.rewrite.Inc()
	default:
		p.pm.allow.Inc()
	}
	if p.consecutive.Swap(0) >= int32(p.h.threshold) {
		p.pm.failing.Set(0)
		p.h.log.Info("policy: plugin recovered", "plugin", p.name, "path", p.plugin.key.path)
	}
	return d, nil
}

func failureKind(err error) string {
	switch {
	case errors.Is(err, ErrTimeout):
		return "timeout"
	case errors.Is(err, ErrMemoryLimit):
		return "memory"
	case errors.Is(err, ErrExit):
		return "exit"
	case errors.Is(err, ErrTrap):
		return "trap"
	case errors.Is(err, ErrPluginError):
		return "plugin_error"
	case errors.Is(err, ErrOutputTooLarge):
		return "output_too_large"
	case errors.Is(err, ErrBadOutput):
		return "bad_output"
	}
	return "other"
}

// failed counts a failure of the plugin. Every failure is logged; a plugin
// that fails threshold calls in a row is reported once more, at error
// level, and its edge_policy_failing gauge goes to 1 until it succeeds.
func (p *pool) failed(device, kind string, err error) {
	p.pm.failure(kind)
	n := p.consecutive.Add(1)
	p.h.log.Warn("policy: plugin failed; command rejected policy_error, instance replaced",
		"plugin", p.name, "device", device, "kind", kind, "err", err)
	if n == int32(p.h.threshold) {
		p.pm.failing.Set(1)
		p.h.log.Error("policy: plugin keeps failing", "plugin", p.name, "path", p.plugin.key.path,
			"consecutive_failures", n, "last_err", err)
	}
}

// refill instantiates a replacement in the background (owned by the Host:
// Close waits for it).
func (h *Host) refill(p *pool) {
	if !p.enter() {
		return
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer p.exit()
		select {
		case p.sem <- struct{}{}:
		default:
			return // full again
		}
		ctx, cancel := context.WithTimeout(h.base, p.lim.InitTimeout+time.Second)
		defer cancel()
		inst, err := p.instantiate(ctx)
		if err != nil {
			<-p.sem
			h.log.Log(ctx, slog.LevelWarn, "policy: cannot replace a plugin instance", "plugin", p.name, "err", err)
			return
		}
		p.put(inst)
	}()
}
