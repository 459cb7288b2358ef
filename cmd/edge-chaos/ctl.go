package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/chaos"
)

// A controller process (edge-chaos controller ...) is an honest controller
// built on package controller: it takes a device's lock in etcd, sends a
// barrier and then a few commands with the lock's fence, resends with the
// same op_id when no Result comes (the Sender does; it also retries busy
// and fence_unconfirmed, the only Results that are not final), retries an
// operation answered on arrival without a record (docs/protocol.md, "What
// is recorded") with the same op_id while it holds the lock, releases, and
// starts over. A final Result (device_unreachable and policy_error
// included) ends the operation: the next one is a new op_id. It writes every
// invocation, publish, Result and lock event to its history file.
//
// Signals from the campaign: SIGUSR1 arms a stale-holder pause (the next
// ownership check that passes stops the process with SIGSTOP, right
// before it publishes: the GC pause between check and write that fencing
// exists for; the campaign resumes it with SIGCONT after the lease ran
// out), SIGUSR2 disarms it, SIGTERM stops it after the operation in hand.

type ctlConfig struct {
	id, out, broker, gateway string
	etcd                     []string
	devices                  []chaos.DeviceSpec
	seed                     uint64
	ttl                      time.Duration
	eager                    bool // resend after a short ResultTimeout (dedup is exercised); else wait patiently
	brokers                  []string
	fleet                    bool // every device's gateway from the device directory (-fleet)
}

func runController(args []string) int {
	fs := flag.NewFlagSet("controller", flag.ContinueOnError)
	var c ctlConfig
	var etcd, devs string
	fs.StringVar(&c.id, "id", "", "controller ID (MQTT client ID and reply topic)")
	fs.StringVar(&c.out, "out", "", "history file (JSON lines)")
	fs.StringVar(&c.broker, "broker", "", "MQTT broker URL")
	fs.StringVar(&c.gateway, "gateway", "", "the agent's gateway_id")
	fs.StringVar(&etcd, "etcd", "", "etcd endpoints, comma separated")
	fs.StringVar(&devs, "devices", "", "devices as JSON (DeviceSpec list)")
	fs.Uint64Var(&c.seed, "seed", 1, "seed of this controller's choices")
	fs.DurationVar(&c.ttl, "ttl", 2*time.Second, "lock lease TTL")
	fs.BoolVar(&c.eager, "eager", false, "resend after a short ResultTimeout")
	brokers := fs.String("brokers", "", "the broker cluster's nodes, comma separated (instead of --broker)")
	fs.BoolVar(&c.fleet, "fleet", false, "look every device's gateway up in the device directory; a Conn per gateway")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *brokers != "" {
		c.brokers = strings.Split(*brokers, ",")
		c.broker = c.brokers[0]
	}
	c.etcd = strings.Split(etcd, ",")
	if err := json.Unmarshal([]byte(devs), &c.devices); err != nil || c.id == "" || c.out == "" || c.broker == "" || len(c.devices) == 0 {
		fmt.Fprintf(os.Stderr, "edge-chaos controller: --id, --out, --broker, --etcd and --devices (JSON) are required (devices: %v)\n", err)
		return 2
	}
	if err := controllerLoop(c); err != nil {
		fmt.Fprintf(os.Stderr, "edge-chaos controller %s: %v\n", c.id, err)
		return 1
	}
	return 0
}

type ctl struct {
	c     ctlConfig
	rec   *chaos.LineWriter
	rng   *rand.Rand
	conn  *controller.Conn
	conns map[string]*controller.Conn // -fleet: by gateway
	cli   *clientv3.Client
	stop  atomic.Bool
	armed atomic.Bool
	cont  chan struct{} // a SIGCONT arrived
	n     int           // operations invoked
}

func (k *ctl) event(e chaos.Event) {
	e.T, e.Src = time.Now().UnixNano(), k.c.id
	k.rec.Write(e)
}

func controllerLoop(c ctlConfig) error {
	rec, err := chaos.OpenLines(c.out)
	if err != nil {
		return err
	}
	defer rec.Close()
	k := &ctl{c: c, rec: rec, rng: rand.New(rand.NewPCG(c.seed, c.seed^0x5eed)), cont: make(chan struct{}, 1)}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCONT)
	go func() {
		for s := range sigs {
			switch s {
			case syscall.SIGUSR1:
				k.armed.Store(true)
			case syscall.SIGUSR2:
				k.armed.Store(false)
			case syscall.SIGCONT:
				select {
				case k.cont <- struct{}{}:
				default:
				}
			default:
				k.stop.Store(true)
			}
		}
	}()
	k.cli, err = clientv3.New(clientv3.Config{Endpoints: c.etcd, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	defer k.cli.Close()
	if c.fleet {
		k.conns = map[string]*controller.Conn{}
		defer func() {
			for _, cn := range k.conns {
				cn.Close()
			}
		}()
		for !k.stop.Load() {
			k.hold()
			k.sleep(time.Duration(k.rng.IntN(50)) * time.Millisecond)
		}
		return nil
	}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		k.conn, err = controller.Dial(ctx, controller.ConnOptions{Broker: c.broker, Gateway: c.gateway, ControllerID: c.id})
		cancel()
		if err == nil {
			break
		}
		if k.stop.Load() {
			return nil
		}
		k.event(chaos.Event{Ev: chaos.EvNote, Err: "dial: " + err.Error()})
		time.Sleep(500 * time.Millisecond)
	}
	defer k.conn.Close()
	for !k.stop.Load() {
		k.hold()
		k.sleep(time.Duration(k.rng.IntN(50)) * time.Millisecond)
	}
	return nil
}

func (k *ctl) sleep(d time.Duration) { time.Sleep(d) }

// pick chooses a device: the hot one often, else any.
func (k *ctl) pick() chaos.DeviceSpec {
	if k.c.fleet {
		var hot []chaos.DeviceSpec
		for _, d := range k.c.devices {
			if d.Hot {
				hot = append(hot, d)
			}
		}
		if len(hot) > 0 && k.rng.IntN(100) < 40 {
			return hot[k.rng.IntN(len(hot))]
		}
		return k.c.devices[k.rng.IntN(len(k.c.devices))]
	}
	for _, d := range k.c.devices {
		if d.Hot && k.rng.IntN(100) < 40 {
			return d
		}
	}
	return k.c.devices[k.rng.IntN(len(k.c.devices))]
}

// hold is one ownership generation: acquire, barrier, a few commands,
// release.
func (k *ctl) hold() {
	d := k.pick()
	lock := "locks/device/" + d.ID
	h := controller.NewHolder(k.cli, []string{lock}, &controller.LockOptions{
		TTL: k.c.ttl, AcquireTimeout: 10 * time.Second, AttemptWait: 2 * time.Second,
		RequestTimeout: time.Second, Name: k.c.id,
	})
	if err := h.Acquire(context.Background()); err != nil {
		k.event(chaos.Event{Ev: chaos.EvNote, Dev: d.ID, Lock: lock, Err: "acquire: " + err.Error()})
		return
	}
	k.event(chaos.Event{Ev: chaos.EvAcquired, Dev: d.ID, Lock: lock, Fence: h.Fence()})
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		err := h.Release(ctx)
		e := chaos.Event{Ev: chaos.EvReleased, Dev: d.ID, Lock: lock, Fence: h.Fence()}
		if err != nil {
			e.Err = err.Error()
		}
		k.event(e)
	}()
	rt, deadline := 60*time.Second, 20*time.Second
	if k.c.eager {
		rt, deadline = time.Duration(300+k.rng.IntN(400))*time.Millisecond, 10*time.Second
	}
	owner := &pausingOwner{Holder: h, k: k}
	so := &controller.SendOptions{ResultTimeout: rt,
		OnPublish: func(cmd wire.Command, err error) {
			if err == nil {
				k.event(chaos.Event{Ev: chaos.EvPublished, Dev: d.ID, Op: cmd.OpID, Fence: cmd.Fence})
			} else {
				k.event(chaos.Event{Ev: chaos.EvNote, Dev: d.ID, Op: cmd.OpID, Err: "publish: " + err.Error()})
			}
		}}
	var s sender
	if k.c.fleet {
		s = &routed{k: k, owner: owner, opts: so, senders: map[string]*controller.Sender{}}
	} else {
		s = controller.NewSender(k.conn, owner, so)
	}
	if !k.send(s, h, d, wire.ActionFence, nil, deadline) {
		return
	}
	for n := 1 + k.rng.IntN(20); n > 0 && !k.stop.Load(); n-- {
		if h.Check() != nil {
			return
		}
		action, params := k.command(d)
		if !k.send(s, h, d, action, params, deadline) {
			return
		}
		k.sleep(time.Duration(k.rng.IntN(5)) * time.Millisecond)
	}
}

// command makes a random command the device's hardware accepts (and, now
// and then, one it refuses: device_error).
func (k *ctl) command(d chaos.DeviceSpec) (string, json.RawMessage) {
	r := k.rng.IntN(100)
	switch d.Type {
	case "pump":
		switch {
		case r < 3:
			return "set", json.RawMessage(`{"rpm":7000}`) // refused by the hardware
		case r < 80:
			return "set", json.RawMessage(fmt.Sprintf(`{"rpm":%d}`, k.rng.IntN(6001)))
		}
		return "stop", nil
	case "valve":
		switch {
		case r < 3:
			return "set", json.RawMessage(`{"open":150}`)
		case r < 80:
			return "set", json.RawMessage(fmt.Sprintf(`{"open":%d}`, k.rng.IntN(101)))
		}
		return "close", nil
	case "relay":
		if r < 50 {
			return "toggle", nil
		}
		return "set", json.RawMessage(fmt.Sprintf(`{"on":%v}`, r%2 == 0))
	}
	return "set", json.RawMessage(fmt.Sprintf(`{"n":%d}`, k.rng.IntN(1000000)))
}

// send runs one operation to its end; false when the holder should stop
// (ownership lost, or the campaign is stopping).
func (k *ctl) send(s sender, h *controller.Holder, d chaos.DeviceSpec, action string, params json.RawMessage, deadline time.Duration) bool {
	k.n++
	op := fmt.Sprintf("%s-%d", k.c.id, k.n)
	fence := h.Fence()
	k.event(chaos.Event{Ev: chaos.EvInvoked, Dev: d.ID, Op: op, Fence: fence, Action: action, Params: params, Lock: "locks/device/" + d.ID})
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		r, err := s.Send(ctx, d.ID, action, params, controller.WithOpID(op))
		cancel()
		if r.OpID != "" {
			rr := r
			k.event(chaos.Event{Ev: chaos.EvResult, Dev: d.ID, Op: op, Fence: fence, Result: &rr})
		}
		var re *controller.ResultError
		switch {
		case err == nil:
			return !(action == wire.ActionFence && r.LastFence < fence)
		case errors.Is(err, controller.ErrLost), errors.Is(err, controller.ErrNotActive):
			k.event(chaos.Event{Ev: chaos.EvLost, Dev: d.ID, Op: op, Fence: fence, Err: err.Error()})
			return false
		case errors.As(err, &re) && !wire.Recorded(re.Result.Code) && attempt < 3 && !k.stop.Load():
			// Not recorded: a resend with the same op_id is handled
			// afresh (docs/protocol.md). Retry while the lock is held.
			k.sleep(time.Duration(100+k.rng.IntN(300)) * time.Millisecond)
			continue
		case errors.As(err, &re):
			return action != wire.ActionFence
		case (errors.Is(err, controller.ErrNoGateway) || errors.Is(err, controller.ErrConnect) || errors.Is(err, errLookup)) && attempt < 60 && !k.stop.Load():
			// -fleet: the device is moving between gateways, or its
			// gateway's Conn cannot be dialled now: the same op_id again.
			k.sleep(250 * time.Millisecond)
			continue
		case errors.Is(err, controller.ErrPublish) && attempt < 20 && !k.stop.Load():
			k.sleep(200 * time.Millisecond) // the broker is away: the same op_id again
			continue
		default:
			k.event(chaos.Event{Ev: chaos.EvGaveUp, Dev: d.ID, Op: op, Fence: fence, Err: err.Error()})
			return false
		}
	}
}

// pausingOwner is the holder as the Sender sees it, with one addition: when
// the campaign armed it (SIGUSR1), the first ownership check that passes
// stops the process (SIGSTOP) right after, before the publish it
// guards. After SIGCONT the publish goes out with the old fence: a stale
// holder that wakes, which only the fence can stop.
type pausingOwner struct {
	*controller.Holder
	k *ctl
}

func (o *pausingOwner) Check() error {
	err := o.Holder.Check()
	if err == nil && o.k.armed.CompareAndSwap(true, false) {
		o.k.event(chaos.Event{Ev: chaos.EvPaused, Fence: o.Holder.Fence(), Lock: o.Holder.Locks()[0]})
		// SIGSTOP takes effect some time after kill(2) returns: wait
		// here for the SIGCONT that ends the pause, so nothing is
		// published in between.
		select {
		case <-o.k.cont:
		default:
		}
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		select {
		case <-o.k.cont:
		case <-time.After(2 * time.Minute):
		}
	}
	return err
}

// errLookup: the device directory could not be read.
var errLookup = errors.New("device directory")

// sender is a Sender, or (-fleet) routed.
type sender interface {
	Send(ctx context.Context, device, action string, params any, opts ...controller.CallOption) (wire.Result, error)
}

// routed sends each command to the gateway that fronts the device now
// (controller.LookupGateway before each Send, so a moved device is
// followed), through a Sender of that gateway on the controller's Conn of
// it (dialled the first time, kept across holds): what
// controller.FleetSender does, with Conns that outlive one owner.
type routed struct {
	k       *ctl
	owner   controller.Owner
	opts    *controller.SendOptions
	senders map[string]*controller.Sender
}

func (r *routed) Send(ctx context.Context, device, action string, params any, opts ...controller.CallOption) (wire.Result, error) {
	gw, err := controller.LookupGateway(ctx, r.k.cli, "", device)
	if err != nil {
		if !errors.Is(err, controller.ErrNoGateway) {
			err = fmt.Errorf("%w: %w", errLookup, err) // etcd away: again
		}
		return wire.Result{}, err
	}
	s := r.senders[gw]
	if s == nil {
		cn := r.k.conns[gw]
		if cn == nil {
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			cn, err = controller.Dial(dctx, controller.ConnOptions{Brokers: r.k.c.brokers, Gateway: gw, ControllerID: r.k.c.id + "-" + gw})
			cancel()
			if err != nil {
				return wire.Result{}, err
			}
			r.k.conns[gw] = cn
		}
		s = controller.NewSender(cn, r.owner, r.opts)
		r.senders[gw] = s
	}
	return s.Send(ctx, device, action, params, opts...)
}
