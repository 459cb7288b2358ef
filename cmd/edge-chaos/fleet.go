package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/chaos"
	"github.com/edge-agent/edge-agent/internal/rig"
)

// The fleet (-fleet N -broker nats, docs/testing.md "A fleet"): N
// gateways gw1..gwN, each an agent process with its own gateway_id,
// data_dir, admin API and devices, on a 3-node NATS cluster (JetStream
// and its MQTT interface, internal/rig.StartNATS) and the campaign's
// 3-member etcd. Each agent's mqtt.brokers lists the three nodes through
// toxiproxy links of its own, its first node gwK's (K-1)%3th. One
// firmware-sim serves every device; each agent reaches it through a link
// of its own. The controllers command devices on every gateway: each
// looks the device's gateway up in the device directory
// ({cp}/devices/{dev}/gateway) before each Send and keeps one Conn per
// gateway, on every node (its own first node).
//
// Beside the single agent's faults (each on one gateway, drawn by the
// schedule) a fleet has broker node kills (SIGKILL of one NATS node,
// restarted after a while), etcd member kills (any member, not only the
// leader) and device moves: a device the gateway fronts leaves its
// configuration (the agent restarted without it) and joins another's
// (that agent restarted with it), which must take the fence floor for it
// (PROTOCOL §7, "a device new to this gateway"; invariant 7). A move, and
// a gateway's wipe or restore, is a loss of memory of that gateway's
// devices only (memory_lost with the devices: the checker's epochs are
// per device).

const (
	fNATSKill       = "broker_node_kill" // SIGKILL of one NATS node, restarted after a while (-fleet)
	fEtcdMemberKill = "etcd_member_kill" // SIGKILL of any etcd member, restarted (-fleet)
	fDeviceMove     = "device_move"      // a device leaves one gateway's configuration and joins another's (-fleet)
)

// fleetKinds replace the mosquitto restart in a fleet's round: node kills
// twice, moves twice.
var fleetKinds = []string{fNATSKill, fNATSKill, fEtcdMemberKill, fDeviceMove, fDeviceMove}

// movers are the devices that move between gateways, and the gateway
// each starts on (index).
var movers = []struct {
	spec chaos.DeviceSpec
	home int
}{
	{chaos.DeviceSpec{ID: "mv-pump", Type: "pump", Queryable: true}, 0},
	{chaos.DeviceSpec{ID: "mv-relay", Type: "relay", Queryable: true}, 1},
}

// fleetDevices are the fleet's devices: per gateway gK a hot relay, a pump
// and a valve that cannot be asked; gw1 also a group of two; and the
// movers.
func fleetDevices(n int) []chaos.DeviceSpec {
	var out []chaos.DeviceSpec
	for k := 1; k <= n; k++ {
		out = append(out,
			chaos.DeviceSpec{ID: fmt.Sprintf("g%d-hot", k), Type: "relay", Queryable: true, Hot: true},
			chaos.DeviceSpec{ID: fmt.Sprintf("g%d-pump", k), Type: "pump", Queryable: true},
			chaos.DeviceSpec{ID: fmt.Sprintf("g%d-valve", k), Type: "valve", Queryable: false})
		if k == 1 {
			out = append(out,
				chaos.DeviceSpec{ID: "g1-pump-g", Type: "pump", Group: "g1", Queryable: true},
				chaos.DeviceSpec{ID: "g1-relay-g", Type: "relay", Group: "g1", Queryable: true})
		}
	}
	for _, m := range movers {
		out = append(out, m.spec)
	}
	return out
}

// homeOf is the gateway (index) a fleet device starts on.
func homeOf(dev string, n int) int {
	for _, m := range movers {
		if m.spec.ID == dev {
			return m.home % n
		}
	}
	var k int
	fmt.Sscanf(dev, "g%d-", &k)
	return k - 1
}

func gatewayName(k int) string { return fmt.Sprintf("gw%d", k+1) }

// gwSpec is one gateway of the fleet: its ID, its agent's links, and the
// devices it fronts now (a move changes them).
type gwSpec struct {
	id      string
	brokers []string // the agent's mqtt.brokers: its own links to the nodes, its first node first
	fwURL   string   // the agent's firmware: its own link

	mu      sync.Mutex
	devs    []string
	changed time.Time // the last move in or out
}

func (g *gwSpec) devices() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.devs)
}

func (g *gwSpec) has(dev string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Contains(g.devs, dev)
}

func (g *gwSpec) set(dev string, in bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.devs = slices.DeleteFunc(g.devs, func(d string) bool { return d == dev })
	if in {
		g.devs = append(g.devs, dev)
	}
	g.changed = time.Now()
}

func (g *gwSpec) changedAt() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.changed
}

// setupFleet starts the NATS cluster and the gateways' agents (after etcd
// and firmware-sim).
func (c *campaign) setupFleet() error {
	w, o := c.w, c.o
	c.logf("starting a 3-node NATS cluster (JetStream, MQTT)")
	nc, err := rig.StartNATS(rig.NATSOptions{Dir: filepath.Join(w.dir, "nats"), Binary: o.natsBin})
	if err != nil {
		return err
	}
	w.nats = nc
	w.brokerURLs = nc.URLs()
	w.brokerURL = w.brokerURLs[0]
	for k := 0; k < o.fleet; k++ {
		g := &gwSpec{id: gatewayName(k)}
		for j := range nc.Nodes {
			n := nc.Nodes[(k+j)%len(nc.Nodes)]
			addr, err := w.links.add(fmt.Sprintf("%s-broker-%s", g.id, n.Name), n.MQTTAddr())
			if err != nil {
				return err
			}
			g.brokers = append(g.brokers, "tcp://"+addr)
		}
		fwp, err := w.links.add(g.id+"-firmware", w.fwAddr)
		if err != nil {
			return err
		}
		g.fwURL = "http://" + fwp
		for _, d := range o.devices {
			if homeOf(d.ID, o.fleet) == k {
				g.devs = append(g.devs, d.ID)
			}
		}
		w.gws = append(w.gws, g)
	}
	for k, g := range w.gws {
		admin, err := rig.FreeAddr()
		if err != nil {
			return err
		}
		data := filepath.Join(w.dir, "agent-data-"+g.id)
		a := newAgentSup(w, g.id, "http://"+admin, data, agentConfigPath(w.dir, g.id), o.seed+uint64(k)*1000)
		a.gw = g
		w.agents = append(w.agents, a)
		if err := a.start(""); err != nil {
			return err
		}
		a.running.Store(true)
		go a.run()
	}
	for _, a := range w.agents {
		if !rig.WaitFor(60*time.Second, a.ready) {
			return fmt.Errorf("edge-agent %s not ready on %s within 60s (%s); see %s", a.name, a.admin, a.proc().Ended(), filepath.Join(w.dir, "procs.log"))
		}
	}
	w.agent = w.agents[0]
	for _, a := range w.agents {
		if _, err := w.takeBackup(a); err != nil {
			return err
		}
	}
	return nil
}

// gatewayOf is the agent that fronts dev now (-fleet; the agent itself
// without), nil while it moves.
func (w *world) gatewayOf(dev string) *agentSup {
	if w.o.fleet == 0 {
		return w.agent
	}
	for _, a := range w.agents {
		if a.gw.has(dev) {
			return a
		}
	}
	return nil
}

// gatewayNameOf names the gateway that fronts dev now ("agent" outside
// a fleet, "none" while it moves).
func (w *world) gatewayNameOf(dev string) string {
	if w.o.fleet == 0 {
		return "agent"
	}
	if a := w.gatewayOf(dev); a != nil {
		return a.name
	}
	return "none"
}

// agentNamed is the fleet's agent of gateway name (the first when none).
func (w *world) agentNamed(name string) *agentSup {
	for _, a := range w.agents {
		if a.name == name {
			return a
		}
	}
	return w.agents[0]
}

// adminFor sends a request about dev to the admin API of the agent that
// fronts it (-fleet), else as adminDo.
func (w *world) adminFor(dev, method, path, body string, timeout time.Duration) (*http.Response, error) {
	if w.o.fleet == 0 {
		return w.adminDo(method, path, body, timeout)
	}
	a := w.gatewayOf(dev)
	if a == nil {
		return nil, fmt.Errorf("%s is moving", dev)
	}
	req, err := http.NewRequest(method, a.admin+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return (&http.Client{Timeout: timeout}).Do(req)
}

// heldUnknownFleet is every gateway's list of held writes.
func (w *world) heldUnknownFleet() map[string]bool {
	out := map[string]bool{}
	for _, a := range w.agents {
		resp, err := (&http.Client{Timeout: time.Second}).Get(a.admin + "/v1/ops?status=unknown")
		if err != nil {
			continue
		}
		var page struct {
			Ops []struct {
				Device string `json:"device"`
				OpID   string `json:"op_id"`
			} `json:"ops"`
		}
		if resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&page) == nil {
			for _, o := range page.Ops {
				out[o.Device+"/"+o.OpID] = true
			}
		}
		resp.Body.Close()
	}
	return out
}

// natsKill kills one NATS node and starts it again after f.For (and
// waits until it accepts MQTT clients again).
func (c *campaign) natsKill(f fault) {
	w := c.w
	i := f.Slot % len(w.nats.Nodes)
	n := w.nats.Nodes[i]
	w.natsMu.Lock() // one node down at a time: a kill waits for the last one's restart
	defer w.natsMu.Unlock()
	target := fmt.Sprintf("%s:%d", n.Name, n.PID())
	w.record(f.Kind, "start", target, f.String())
	if !n.Running() {
		w.record(f.Kind, "end", target, "not done: the node was down")
		return
	}
	w.nats.Kill(i)
	time.Sleep(f.For)
	t0 := time.Now()
	if err := w.nats.Restart(i); err != nil {
		w.record(f.Kind, "end", target, "restart failed: "+err.Error())
		return
	}
	w.record(f.Kind, "end", fmt.Sprintf("%s:%d", n.Name, n.PID()), fmt.Sprintf("accepts MQTT clients %.1fs after its restart", time.Since(t0).Seconds()))
}

// etcdMemberKill kills any etcd member (f.Slot) and restarts it.
func (c *campaign) etcdMemberKill(f fault) {
	w := c.w
	i := f.Slot % len(w.etcd)
	target := w.etcd[i].name
	w.record(f.Kind, "start", target, f.String())
	p := w.etcdMemberProc(i)
	if p == nil || !p.Running() {
		w.record(f.Kind, "end", target, "not done: the member was down")
		return
	}
	p.Kill()
	time.Sleep(f.For)
	if err := w.runEtcd(w.etcd[i], w.etcdInitial(), "existing"); err != nil {
		w.record(f.Kind, "end", target, "restart failed: "+err.Error())
		return
	}
	w.record(f.Kind, "end", target, "")
}

// moveMu: one move at a time.
var moveMu sync.Mutex

// moveDevice moves f.Device from the gateway that fronts it to another
// (f.N chooses which): the old agent is stopped (SIGTERM), started
// without it and must be ready again; then the new one is stopped and
// started with it, and must report a fence floor for it. When the old
// agent cannot start without the device (an unresolved write of it
// refuses the start: docs/operations.md) the device is given back and
// the move is recorded as not done.
func (c *campaign) moveDevice(f fault) {
	w := c.w
	moveMu.Lock()
	defer moveMu.Unlock()
	dev := f.Device
	from := w.gatewayOf(dev)
	if from == nil {
		w.record(f.Kind, "start", dev, f.String())
		w.record(f.Kind, "end", dev, "not done: the device has no gateway")
		return
	}
	k := slices.Index(w.agents, from)
	to := w.agents[(k+1+f.N%(len(w.agents)-1))%len(w.agents)]
	target := fmt.Sprintf("%s %s->%s", dev, from.name, to.name)
	w.record(f.Kind, "start", target, f.String())
	// Nothing held unknown on the device (the agent could not start
	// without it) and nothing delaying writes.
	if !rig.WaitFor(15*time.Second, func() bool {
		for k := range w.heldUnknownFleet() {
			if strings.HasPrefix(k, dev+"/") {
				return false
			}
		}
		return c.quiet()
	}) {
		w.record(f.Kind, "end", target, "not done: a write of the device was held, or writes were delayed, for 15s")
		return
	}
	up := make(chan struct{})
	starts := from.starts.Load()
	from.restart(agentCmd{sig: syscall.SIGTERM, down: 200 * time.Millisecond, kind: f.Kind, up: up, prepare: func() {
		from.gw.set(dev, false)
		c.lostAt.Store(time.Now().UnixNano())
		w.record(chaos.KindMemoryLost, "start", "move", chaos.LostDevicesDetail([]string{dev}, ""))
	}})
	select {
	case <-up:
	case <-time.After(45 * time.Second):
		from.gw.set(dev, true)
		w.record(f.Kind, "end", target, "not done: the old gateway's agent did not stop within 45s")
		return
	}
	if !rig.WaitFor(20*time.Second, from.ready) {
		// Given back: the supervisor's next start has it again.
		from.gw.set(dev, true)
		w.record(f.Kind, "end", target, fmt.Sprintf("given back: %s not ready without it within 20s (%d starts)", from.name, from.starts.Load()-starts))
		rig.WaitFor(30*time.Second, from.ready)
		return
	}
	up = make(chan struct{})
	to.restart(agentCmd{sig: syscall.SIGTERM, down: 200 * time.Millisecond, kind: f.Kind, up: up, prepare: func() {
		to.gw.set(dev, true)
	}})
	select {
	case <-up:
	case <-time.After(45 * time.Second):
		to.gw.set(dev, true) // the supervisor starts it with the device when it can
		w.record(f.Kind, "end", target, "the new gateway's agent did not stop within 45s")
		return
	}
	var info wire.DeviceInfo
	ok := rig.WaitFor(30*time.Second, func() bool {
		var got bool
		info, got = to.device(dev)
		return got && to.ready()
	})
	w.record(f.Kind, "end", target, fmt.Sprintf("%s fronts it: %v; its fence floor %d, last_fence %d", to.name, ok, info.FenceFloor, info.LastFence))
}

// writeFleetConfig writes a fleet agent's configuration from its
// gateway's devices now (before each start).
func (a *agentSup) writeFleetConfig() error {
	return os.WriteFile(a.cfg, []byte(a.w.agentConfigGW(a.gw, strings.TrimPrefix(a.admin, "http://"), a.data, nil)), 0o644)
}
