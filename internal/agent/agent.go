// Package agent is edge-agent's command path: intake (checks on arrival,
// the durable inbox, acknowledgements in arrival order), one worker per
// device or device group (lock, expiry, fence, policy, the device write,
// unknown outcomes), recovery at start-up, and the outbox of Results.
// The invariants it keeps are docs/design.md's; the code that keeps each one
// says so where it does.
package agent

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/auth"
	"github.com/edge-agent/edge-agent/internal/device"
	"github.com/edge-agent/edge-agent/internal/failpoint"
	"github.com/edge-agent/edge-agent/internal/policy"
	"github.com/edge-agent/edge-agent/internal/store"
	"github.com/edge-agent/edge-agent/internal/wirefast"
)

// Publisher is the seam over the MQTT session: PublishAsync hands a QoS 1
// publish over without waiting for its PUBACK (calls from one goroutine go
// out in call order). An error that wraps ErrUnpublishable says the
// message can never be published; any other is taken as transient.
type Publisher interface {
	PublishAsync(ctx context.Context, topic string, payload []byte, retained bool) (Pending, error)
}

// Pending is one QoS 1 publish in flight.
type Pending interface {
	// Done is closed once the publish completed: acknowledged or failed.
	Done() <-chan struct{}
	// Err is nil once the broker acknowledged the publish.
	Err() error
}

// Delivery is one message from the broker. Ack sends its PUBACK; the agent
// calls it exactly once, in arrival order, after the command is durable in
// the inbox or has been answered without entering it.
type Delivery struct {
	Topic    string
	Payload  []byte
	Retained bool
	Ack      func()
}

// Options configure an Agent. Gateway, Devices, Store, Publisher and
// Drivers are required; zero values of the rest mean the documented
// defaults.
type Options struct {
	Gateway   Gateway
	Devices   []Device
	Store     *store.Store             // started
	Publisher Publisher                // the MQTT session
	Drivers   map[string]device.Driver // per device ID
	Policy    policy.Evaluator         // nil: allow everything
	// Auth checks signed commands (docs/protocol.md §6). Nil: no keys,
	// signatures not required (a signed command is then invalid).
	Auth *auth.Verifier
	// ResultKey, when set, signs every Result and DeviceState the agent
	// publishes (a JWS with kid = gateway_id, docs/protocol.md §6). Nil:
	// they are published as plain JSON.
	ResultKey ed25519.PrivateKey
	Logger    *slog.Logger                    // nil: slog.Default()
	Registry  prometheus.Registerer           // nil: metrics are not registered
	Now       func() time.Time                // nil: time.Now
	KeyRand   func() string                   // nil: 8 random hex digits
	QueryWait func(attempt int) time.Duration // wait between ops queries; nil: 100ms doubling to 5s
	// Fences says whether a device's fences are confirmed
	// (docs/protocol.md §7). Nil: always (no coordination).
	Fences FenceMemory
	// Proven says whether this agent's coordination session is proven
	// alive (docs/protocol.md §8: with ha, the active's). No write is
	// sent to a device while it is false. Nil: always.
	Proven func() bool
	// ResendWait is the pause before the n-th resend of an operation the
	// device confirmed unapplied (n >= 1). Nil: 200ms doubling to 10s,
	// with jitter.
	ResendWait func(n int) time.Duration
}

// FenceMemory is the seam over internal/fencemem: whether a device's
// fences are known complete, and its last floor (the admin API).
type FenceMemory interface {
	Confirmed(dev string) bool
	Device(dev string) (floor int64, confirmed bool)
}

// Gateway is what the agent needs of the gateway's configuration, with
// its defaults applied.
type Gateway struct {
	GatewayID   string
	TopicPrefix string        // mqtt.topic_prefix
	Retention   time.Duration // dedup.retention: how long final op records are kept
	KeepLast    int           // dedup.keep_last: each device's last final op records kept regardless
}

// Device is one device as the agent runs it: its configuration resolved,
// defaults applied.
type Device struct {
	ID    string
	Type  string
	Group string
	Lock  string
	// Worker is the worker (and inbox) the device's commands go through:
	// its group's, or its own.
	Worker string
	Queue  int // the inbox's share of this device
	// Timeout bounds one request of its driver; Retries is how many
	// extra tries one write may make (for a driver that is not
	// device.Bounded).
	Timeout time.Duration
	Retries int
	// Resends is how many times a write the device confirmed unapplied is
	// sent again under a new key.
	Resends int
	// ResolveSettle is how long after a write to the device ended an
	// operator's answer about it is refused (settle.go).
	ResolveSettle time.Duration
}

// Agent is one running command path.
type Agent struct {
	o       Options
	cfg     Gateway
	st      *store.Store
	log     *slog.Logger
	m       *metrics
	now     func() time.Time
	devs    map[string]*devRT
	workers map[string]*worker
	pub     *publisher
	auth    *authState

	incoming chan Delivery
	opened   chan opened // from the verification lanes (lanes.go)
	acks     chan *arrival

	ctx      context.Context // cancelled at the hard stop
	cancel   context.CancelFunc
	stopping chan struct{} // closed when draining starts
	stopOnce sync.Once
	wg       sync.WaitGroup // intake, acker, workers
	bg       sync.WaitGroup // publisher, sweeper

	failOnce sync.Once
	failed   chan struct{}
	failErr  error

	started atomic.Bool

	ev    hub          // GET /v1/events
	stats *statRing    // GET /v1/stats, the status page's charts
	held  atomic.Int64 // writes recorded unknown and not yet final
	begun time.Time    // for uptime
}

// devRT is a device's runtime state.
type devRT struct {
	cfg       *Device
	w         *worker
	lastFence atomic.Int64
	pending   atomic.Int32 // 1 while the device has an unresolved write
	drv       device.Driver
	// rb is drv as a ReadBacker when the device is read back (verify:
	// readback), else nil.
	rb device.ReadBacker
	// held is the op_id of a write a read-back could not decide, while
	// the worker holds it for an operator ("": none).
	held atomic.Pointer[string]
	outc [maxCodes]atomic.Pointer[prometheus.Counter] // metrics.byDevice

	// unknown counts the device's writes recorded unknown now (the
	// device's share of Agent.held: its DeviceState's held_writes).
	unknown atomic.Int32
	// stateMu orders the device's DeviceStates: each is built (with
	// held_writes as it is then) and handed to the publisher under it,
	// so the latest one handed over carries the latest count.
	stateMu sync.Mutex
	pubHeld int32 // held_writes of the last DeviceState handed over (under stateMu)

	// wrote is when the last write to the device ended (settle.go).
	wrote atomic.Pointer[time.Time]
	// contact is the device's last try (contact.go); nil before any.
	contact atomic.Pointer[contactState]
}

// heldOp is the write held for an operator after a read-back, "" if none.
func (rt *devRT) heldOp() string {
	if p := rt.held.Load(); p != nil {
		return *p
	}
	return ""
}

// New builds an Agent; it does no I/O.
func New(o Options) (*Agent, error) {
	if o.Gateway.GatewayID == "" || o.Store == nil || o.Publisher == nil {
		return nil, errors.New("agent: Gateway, Store and Publisher are required")
	}
	if o.Policy == nil {
		o.Policy = policy.AllowAll{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.QueryWait == nil {
		o.QueryWait = func(n int) time.Duration {
			d := 100 * time.Millisecond << min(n, 6)
			return min(d, 5*time.Second)
		}
	}
	a := &Agent{o: o, cfg: o.Gateway, st: o.Store, log: o.Logger, m: newMetrics(o.Registry), now: o.Now,
		devs: map[string]*devRT{}, workers: map[string]*worker{},
		incoming: make(chan Delivery, 8192), opened: make(chan opened), acks: make(chan *arrival, 8192),
		stopping: make(chan struct{}), failed: make(chan struct{}), stats: &statRing{}, begun: time.Now()}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	for i := range o.Devices {
		d := &o.Devices[i]
		drv := o.Drivers[d.ID]
		if drv == nil {
			return nil, fmt.Errorf("agent: device %s: no driver", d.ID)
		}
		wid := d.Worker
		w := a.workers[wid]
		if w == nil {
			w = newWorker(a, wid)
			a.workers[wid] = w
		}
		w.devs = append(w.devs, d.ID)
		w.limit += int64(d.Queue) // a group's limit is the sum of its members' queues
		rt := &devRT{cfg: d, w: w, drv: drv}
		if rb, ok := drv.(device.ReadBacker); ok && rb.ReadsBack(d.ID) {
			rt.rb = rb
		}
		a.devs[d.ID] = rt
	}
	if o.Auth == nil {
		v, err := auth.New(auth.Options{Gateway: o.Gateway.GatewayID})
		if err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
		o.Auth = v
		a.o.Auth = v
	}
	a.auth = newAuthState(o.Auth, a.DeviceIDs(), o.Registry)
	for _, w := range a.workers {
		dev, group := workerLabels(w.id)
		w.gauge = a.m.queueDepth.WithLabelValues(dev, group)
		a.m.queueLimit.WithLabelValues(dev, group).Set(float64(w.limit))
	}
	a.m.gauges(a)
	a.pub = newPublisher(a)
	return a, nil
}

// Start recovers from the store (recover) and starts the workers and the
// outbox publisher. Deliver may be called once Start returned.
func (a *Agent) Start(ctx context.Context) error {
	if !a.started.CompareAndSwap(false, true) {
		return errors.New("agent: already started")
	}
	if err := a.recover(ctx); err != nil {
		return err
	}
	failpoint.Hit(failpoint.Recovery, "")
	for _, w := range a.workers {
		w.gauge.Set(float64(w.depth.Load()))
		a.wg.Add(1)
		go w.run()
	}
	a.wg.Add(2)
	go a.intakeLoop()
	go a.ackLoop()
	a.pub.run()
	a.bg.Add(2)
	go a.sweepLoop()
	go func() {
		defer a.bg.Done()
		select {
		case <-a.st.Failed():
			a.fail(a.st.Err())
		case <-a.ctx.Done():
		}
	}()
	return nil
}

// Deliver hands one broker delivery to the intake, in arrival order. It
// blocks while the intake's bounded queue is full (the broker's in-flight
// window bounds how long), and drops nothing: after Stop began, the
// delivery is left unacknowledged for the broker to redeliver.
func (a *Agent) Deliver(d Delivery) {
	select {
	case <-a.stopping:
	case a.incoming <- d:
	}
}

// Failed is closed when the agent hit a fatal error (a store commit
// failed): it then sends, publishes and acknowledges nothing more, and the
// process must exit non-zero (invariant 5).
func (a *Agent) Failed() <-chan struct{} { return a.failed }

// Err returns the fatal error, if any.
func (a *Agent) Err() error {
	select {
	case <-a.failed:
		return a.failErr
	default:
		return nil
	}
}

func (a *Agent) fail(err error) {
	a.failOnce.Do(func() {
		if err == nil {
			err = errors.New("agent: store failed")
		}
		a.failErr = err
		a.log.Error("agent: fatal; stopping", "err", err)
		close(a.failed)
		a.stopOnce.Do(func() { close(a.stopping) })
		a.cancel()
	})
}

// Stop drains: intake stops (unacknowledged deliveries stay with the
// broker), workers finish the write in hand (a write still running at ctx's
// deadline is cancelled and recorded unknown), and the outbox is published
// until ctx ends. Every operation is left with a record.
func (a *Agent) Stop(ctx context.Context) error {
	a.stopOnce.Do(func() { close(a.stopping) })
	done := make(chan struct{})
	go func() { a.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		a.cancel() // hard stop: in-flight writes end unknown and are recorded
		<-done
	}
	a.pub.flush(ctx)
	a.cancel()
	a.pub.stop()
	a.bg.Wait()
	return a.Err()
}

func (a *Agent) stoppingNow() bool {
	select {
	case <-a.stopping:
		return true
	default:
		return false
	}
}

// waitPublished waits (bounded) until op has a final record whose Result
// left the outbox: the before_ack crash point kills after the Result went
// out, so the broker's redelivery meets a recorded outcome.
func (a *Agent) waitPublished(dev, op string, within time.Duration) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		var o store.Op
		var held bool
		a.st.View(func(tx *store.Tx) error {
			o, _, _ = tx.Op(dev, op)
			held, _ = tx.OutboxHolds(dev, op)
			return nil
		})
		if o.Status == store.OpFinal && !held {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (a *Agent) destination(replyTo, dev string) string {
	if replyTo != "" {
		return replyTo
	}
	return wire.ResultTopic(a.cfg.TopicPrefix, a.cfg.GatewayID, dev)
}

// resultOf builds the Result of a record.
func resultOf(o store.Op, lastFence int64, dup bool) wire.Result {
	r := wire.Result{V: wire.Version, OpID: o.OpID, Device: o.Device, Fence: o.Fence,
		Status: o.Result, Code: o.Code, Reason: o.Reason, LastFence: lastFence,
		Duplicate: dup, At: o.DecidedAt.UTC()}
	if o.Result == wire.StatusApplied {
		r.Output = o.Output
	}
	r.RewrittenParams = rewrittenOf(&o)
	return r
}

// rewrittenOf is a record's rewritten_params: the params sent to the
// device when its policy rewrote them, else nil.
func rewrittenOf(o *store.Op) json.RawMessage {
	if o.Rewritten && o.Action != wire.ActionFence {
		return o.ParamsSent
	}
	return nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own wire types are marshalled
	}
	return b
}

// resultJSON encodes a Result (wirefast.MarshalResult: json.Marshal's bytes,
// without reflection; it runs inside the group commit).
func resultJSON(r wire.Result) []byte {
	b, err := wirefast.MarshalResult(r)
	if err != nil {
		panic(err) // only a time outside years 0-9999, which the agent never stamps
	}
	return b
}

// publishState publishes a device's retained DeviceState (after the commit
// that changed it), with held_writes as it is now.
func (a *Agent) publishState(dev string, d store.Device) {
	st := d.State
	if len(st) == 0 {
		st = json.RawMessage("{}")
	}
	ds := wire.DeviceState{Device: dev, LastFence: d.LastFence, LastOpID: d.LastOpID, State: st, At: a.now().UTC()}
	rt := a.devs[dev]
	if rt != nil {
		rt.stateMu.Lock()
		defer rt.stateMu.Unlock()
		ds.HeldWrites = int(rt.unknown.Load())
		rt.pubHeld = int32(ds.HeldWrites)
	}
	a.pub.push(pubItem{topic: wire.StateTopic(a.cfg.TopicPrefix, a.cfg.GatewayID, dev),
		payload: stateJSON(ds), dev: dev, retained: true})
}

// heldBy counts a write of rt's device entering (n = 1) or leaving (-1)
// unknown: the gateway's count (edge_agent_writes_held_unknown) and the
// device's (its DeviceState's held_writes). rt is nil for a device no
// longer configured. Called from the commit's hooks.
func (a *Agent) heldBy(rt *devRT, n int32) {
	a.held.Add(int64(n))
	if rt != nil {
		rt.unknown.Add(n)
	}
}

// heldChanged publishes dev's DeviceState (d: its record as committed)
// when its held_writes differs from the last one handed to the
// publisher: a write became unknown, or stopped being unknown, without
// the device's record changing.
func (a *Agent) heldChanged(rt *devRT, dev string, d store.Device) {
	rt.stateMu.Lock()
	changed := rt.unknown.Load() != rt.pubHeld
	rt.stateMu.Unlock()
	if changed {
		a.publishState(dev, d)
	}
}

func stateJSON(ds wire.DeviceState) []byte {
	b, err := wirefast.MarshalDeviceState(ds)
	if err != nil {
		panic(err) // as resultJSON
	}
	return b
}

func (a *Agent) sweepLoop() {
	defer a.bg.Done()
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-t.C:
		}
		var n int
		err := a.st.Update(a.ctx, func(tx *store.Tx) error {
			var err error
			n, err = tx.Sweep(a.now(), a.cfg.Retention, uint64(a.cfg.KeepLast), 1000)
			return err
		})
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				a.fail(err)
			}
			return
		}
		if n > 0 {
			a.log.Info("retention: deleted final op records", "count", n)
		}
	}
}

// rules is the part of rt's configuration decide.go reads.
func (a *Agent) rules(rt *devRT) DeviceRules {
	return DeviceRules{ID: rt.cfg.ID, Lock: rt.cfg.Lock, Policy: a.bound(rt.cfg.ID),
		Queryable: rt.drv.Queryable(rt.cfg.ID), Resends: rt.cfg.Resends,
		Unconfirmed: a.o.Fences != nil && !a.o.Fences.Confirmed(rt.cfg.ID)}
}

// FloorTaken is told of a fence floor taken while the agent runs (d: the
// device's record after it): last_fence in memory and the retained state
// follow it.
func (a *Agent) FloorTaken(dev string, d store.Device) {
	if rt := a.devs[dev]; rt != nil {
		a.fenceKnown(rt, dev, d)
	}
}

// bound reports whether a policy may do anything but allow dev's commands
// unchanged (when the evaluator cannot say, it may).
func (a *Agent) bound(dev string) bool {
	b, ok := a.o.Policy.(policy.Binder)
	return !ok || b.Bound(dev)
}

// DeviceIDs returns the configured devices, sorted.
func (a *Agent) DeviceIDs() []string {
	ids := make([]string, 0, len(a.devs))
	for id := range a.devs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}
