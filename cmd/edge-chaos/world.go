package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/edge-agent/edge-agent/configs"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/chaos"
	"github.com/edge-agent/edge-agent/internal/rig"
)

// world is every process of one campaign: a 3-member etcd, mosquitto
// (or the agent's embedded broker), firmware-sim with its journal, the
// agent, the controllers, and the toxiproxy links between them. Each is
// started by the campaign and stopped by its PID.
type world struct {
	o     options
	dir   string
	out   io.Writer // the processes' output (procs.log)
	links *links
	fault *chaos.LineWriter

	etcd []*etcdMember

	nats       *rig.NATSCluster // -fleet: the broker cluster
	natsMu     sync.Mutex       // one node down at a time
	brokerURLs []string         // -fleet: every node, directly (controllers, the observer)
	gws        []*gwSpec        // -fleet: the gateways

	mosqMu   sync.Mutex
	mosq     *rig.Proc
	mosqAddr string

	fwMu   sync.Mutex
	fw     *rig.Proc
	fwAddr string

	fwProxy     string   // the agent's firmware URL: through toxiproxy
	etcdProxies []string // the controllers' etcd endpoints: through toxiproxy

	brokerURL      string       // controllers and the observer: the broker itself
	agentBrokerURL string       // the agent: through toxiproxy (mosquitto mode)
	agent          *agentSup    // the agent (-ha: the first of the pair)
	agents         []*agentSup  // every agent: one, or the pair (-ha)
	asked          atomic.Int32 // the agent that answered the admin API last (-ha)

	regMu      sync.Mutex
	registered *agentSup // the agent holding the gateway's registration (-ha), nil: none seen yet

	ctlMu sync.Mutex
	ctls  []*ctlSlot

	bakMu   sync.Mutex
	backups []backup
}

type etcdMember struct {
	name, client, peer, data string
	mu                       sync.Mutex
	p                        *rig.Proc
}

type ctlSlot struct {
	slot, gen int
	id        string
	p         *rig.Proc
}

func (w *world) record(kind, phase, target, detail string) {
	w.fault.Write(chaos.FaultRecord{T: time.Now().UnixNano(), Kind: kind, Phase: phase, Target: target, Detail: detail})
}

// --- etcd

func (w *world) startEtcd() error {
	var initial []string
	for i := 0; i < 3; i++ {
		c, err := rig.FreeAddr()
		if err != nil {
			return err
		}
		p, err := rig.FreeAddr()
		if err != nil {
			return err
		}
		m := &etcdMember{name: fmt.Sprintf("m%d", i), client: "http://" + c, peer: "http://" + p, data: filepath.Join(w.dir, "etcd", fmt.Sprintf("m%d", i))}
		w.etcd = append(w.etcd, m)
		initial = append(initial, m.name+"="+m.peer)
	}
	for _, m := range w.etcd {
		if err := w.runEtcd(m, strings.Join(initial, ","), "new"); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, m := range w.etcd {
		cli, err := etcdClient([]string{m.client})
		if err != nil {
			return err
		}
		for {
			rctx, c2 := context.WithTimeout(ctx, time.Second)
			_, err = cli.Get(rctx, "health")
			c2()
			if err == nil || ctx.Err() != nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		cli.Close()
		if err != nil {
			return fmt.Errorf("etcd member %s not healthy within 30s: %w", m.name, err)
		}
	}
	return nil
}

func (w *world) etcdInitial() string {
	var parts []string
	for _, m := range w.etcd {
		parts = append(parts, m.name+"="+m.peer)
	}
	return strings.Join(parts, ",")
}

func (w *world) runEtcd(m *etcdMember, initial, state string) error {
	p, err := rig.Start(rig.Options{Out: w.out}, w.o.etcdBin,
		"--name", m.name, "--data-dir", m.data,
		"--listen-client-urls", m.client, "--advertise-client-urls", m.client,
		"--listen-peer-urls", m.peer, "--initial-advertise-peer-urls", m.peer,
		"--initial-cluster", initial, "--initial-cluster-state", state,
		"--initial-cluster-token", "edge-chaos", "--heartbeat-interval", "50", "--election-timeout", "500",
		"--log-level", "error")
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.p = p
	m.mu.Unlock()
	return nil
}

func etcdClient(eps []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
}

// etcdLeader returns the index of the member that leads now.
func (w *world) etcdLeader() int {
	for _, m := range w.etcd {
		cli, err := etcdClient([]string{m.client})
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := cli.Status(ctx, m.client)
		cancel()
		cli.Close()
		if err != nil || st.Leader == 0 {
			continue
		}
		if st.Header.MemberId == st.Leader {
			return indexOf(w.etcd, m)
		}
		for i, o := range w.etcd {
			c2, err := etcdClient([]string{o.client})
			if err != nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			ost, err := c2.Status(ctx, o.client)
			cancel()
			c2.Close()
			if err == nil && ost.Header.MemberId == st.Leader {
				return i
			}
		}
	}
	return -1
}

func indexOf(ms []*etcdMember, m *etcdMember) int {
	for i, o := range ms {
		if o == m {
			return i
		}
	}
	return -1
}

func (w *world) etcdMemberProc(i int) *rig.Proc {
	m := w.etcd[i]
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.p
}

// --- mosquitto

func (w *world) startMosquitto() error {
	addr, err := rig.FreeAddr()
	if err != nil {
		return err
	}
	w.mosqAddr = addr
	_, port, _ := net.SplitHostPort(addr)
	var n int
	fmt.Sscan(port, &n)
	data := filepath.Join(w.dir, "mosquitto")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return err
	}
	conf, err := configs.LocalMosquittoConf(n, data, "stderr", os.Geteuid() == 0, "log_type error")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(data, "mosquitto.conf"), conf, 0o600); err != nil {
		return err
	}
	return w.runMosquitto()
}

func (w *world) runMosquitto() error {
	p, err := rig.Start(rig.Options{Out: w.out}, w.o.mosquittoBin, "-c", filepath.Join(w.dir, "mosquitto", "mosquitto.conf"))
	if err != nil {
		return err
	}
	w.mosqMu.Lock()
	w.mosq = p
	w.mosqMu.Unlock()
	if !rig.WaitFor(10*time.Second, func() bool { return dialable(w.mosqAddr) }) {
		return fmt.Errorf("mosquitto does not accept connections on %s within 10s (%s)", w.mosqAddr, p.Ended())
	}
	return nil
}

func dialable(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// --- firmware

func (w *world) fwArgs() []string {
	var devs []string
	for _, d := range w.o.devices {
		devs = append(devs, d.ID+":"+d.Type)
	}
	return []string{"--listen", w.fwAddr, "--journal", filepath.Join(w.dir, "journal.jsonl"), "--log-level", "warn", "--devices", strings.Join(devs, ",")}
}

func (w *world) startFirmware() error {
	if w.fwAddr == "" {
		a, err := rig.FreeAddr()
		if err != nil {
			return err
		}
		w.fwAddr = a
	}
	p, err := rig.Start(rig.Options{Out: w.out, Env: []string{"GOMAXPROCS=1"}}, w.o.firmwareBin, w.fwArgs()...)
	if err != nil {
		return err
	}
	w.fwMu.Lock()
	w.fw = p
	w.fwMu.Unlock()
	if !rig.WaitFor(10*time.Second, func() bool { return dialable(w.fwAddr) }) {
		return fmt.Errorf("firmware-sim does not listen on %s within 10s (%s)", w.fwAddr, p.Ended())
	}
	return nil
}

func (w *world) firmwareProc() *rig.Proc {
	w.fwMu.Lock()
	defer w.fwMu.Unlock()
	return w.fw
}

// setFirmwareFaults posts faults to firmware-sim (docs/protocol.md §2).
func (w *world) setFirmwareFaults(body string) error {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Post("http://"+w.fwAddr+"/v1/faults", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("POST /v1/faults %s: %s: %s", body, resp.Status, b)
	}
	return nil
}

// firmwareState is a device's state as the firmware has it.
func (w *world) firmwareState(dev string) (json.RawMessage, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + w.fwAddr + "/v1/devices/" + dev + "/state")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET state of %s: %s %v", dev, resp.Status, err)
	}
	return b, nil
}

// --- agent configuration

// agentConfig is the agent's configuration with its admin API on admin and
// its store in data (a clone's differ in those two only). Its
// coordination.etcd is the campaign's etcd, each member directly, or eps
// (-ha: each agent through toxiproxy links of its own), and with -ha the
// pair's ha block.
func (w *world) agentConfig(admin, data string, eps []string) string {
	return w.agentConfigGW(nil, admin, data, eps)
}

// agentConfigGW is agentConfig for gateway g of a fleet (nil: the
// campaign's one gateway): its gateway_id, its mqtt.brokers, client ID and
// firmware link, and the devices it fronts now.
func (w *world) agentConfigGW(g *gwSpec, admin, data string, eps []string) string {
	var b strings.Builder
	gw := gatewayID
	if g != nil {
		gw = g.id
	}
	fmt.Fprintf(&b, "gateway_id: %s\ndata_dir: %s\n", gw, data)
	if eps == nil {
		for _, m := range w.etcd {
			eps = append(eps, m.client)
		}
	}
	fmt.Fprintf(&b, "coordination:\n  etcd:\n    endpoints: [%s]\n    dial_timeout: 2s\n    session_ttl: %s\n", strings.Join(eps, ", "), sessionTTL)
	if w.o.ha {
		fmt.Fprintf(&b, "ha:\n  enabled: true\n  safety_margin: %s\n", haSafetyMargin)
	}
	if g != nil {
		fmt.Fprintf(&b, "mqtt:\n  brokers: [%s]\n  client_id: edge-agent-%s\n  topic_prefix: %s\n", strings.Join(g.brokers, ", "), g.id, prefix)
	} else if w.o.embedded {
		fmt.Fprintf(&b, "mqtt:\n  broker: embedded\n  embedded_listen: %s\n  client_id: edge-agent-chaos\n  topic_prefix: %s\n", w.mosqAddr, prefix)
	} else {
		fmt.Fprintf(&b, "mqtt:\n  broker: %s\n  client_id: edge-agent-chaos\n  topic_prefix: %s\n", w.agentBrokerURL, prefix)
	}
	fmt.Fprintf(&b, "admin:\n  listen: %s\nplugins:\n  dir: %s\nshutdown_timeout: 5s\ndevices:\n", admin, filepath.Join(w.dir, "plugins"))
	fwURL := "http://" + w.fwProxy
	devs := w.o.devices
	if g != nil {
		fwURL = g.fwURL
		devs = nil
		for _, d := range w.o.devices {
			if g.has(d.ID) {
				devs = append(devs, d)
			}
		}
	}
	for _, d := range devs {
		fmt.Fprintf(&b, "  - id: %s\n    type: %s\n    lock: locks/device/%s\n    queue: 64\n", d.ID, d.Type, d.ID)
		if d.Group != "" {
			fmt.Fprintf(&b, "    group: %s\n", d.Group)
		}
		fmt.Fprintf(&b, "    driver:\n      url: %s\n      timeout: 500ms\n      retries: 1\n      idempotent: true\n      queryable: %v\n", fwURL, d.Queryable)
	}
	return b.String()
}

// --- controllers

func (w *world) startController(slot, gen int) (*ctlSlot, error) {
	id := fmt.Sprintf("ctl%d-%d", slot, gen)
	devs, _ := json.Marshal(w.o.devices)
	args := []string{"controller", "--id", id, "--out", filepath.Join(w.dir, "ctl-"+id+".jsonl"),
		"--broker", w.brokerURL, "--gateway", gatewayID, "--etcd", strings.Join(w.etcdProxies, ","),
		"--devices", string(devs), "--seed", fmt.Sprint(w.o.seed*1000 + uint64(slot)*37 + uint64(gen)),
		"--ttl", w.o.ttl.String(), fmt.Sprintf("--eager=%v", slot%2 == 0)}
	if w.o.fleet > 0 {
		// Every gateway, through the device directory; every node, its
		// own first (the slot's).
		var nodes []string
		for j := range w.brokerURLs {
			nodes = append(nodes, w.brokerURLs[(slot+j)%len(w.brokerURLs)])
		}
		args = append(args, "--brokers", strings.Join(nodes, ","), "--fleet")
	}
	p, err := rig.Start(rig.Options{Out: w.out}, w.o.self, args...)
	if err != nil {
		return nil, err
	}
	return &ctlSlot{slot: slot, gen: gen, id: id, p: p}, nil
}

func (w *world) ctl(slot int) *ctlSlot {
	w.ctlMu.Lock()
	defer w.ctlMu.Unlock()
	return w.ctls[slot]
}

// replaceController starts a new controller in slot after the old one died.
func (w *world) replaceController(slot int) error {
	old := w.ctl(slot)
	c, err := w.startController(slot, old.gen+1)
	if err != nil {
		return err
	}
	w.ctlMu.Lock()
	w.ctls[slot] = c
	w.ctlMu.Unlock()
	return nil
}

// lastPaused reads the controller's history for its last self-pause.
func (w *world) lastPaused(c *ctlSlot) (chaos.Event, bool) {
	evs, _ := chaos.ReadLines[chaos.Event](filepath.Join(w.dir, "ctl-"+c.id+".jsonl"))
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Ev == chaos.EvPaused {
			return evs[i], true
		}
	}
	return chaos.Event{}, false
}

// device asks the agent's admin API for a device's view
// (GET /v1/devices/{dev}: last_fence, fence_floor, ...): the serving
// agent's (-ha: whichever of the pair answers).
func (w *world) device(dev string) (wire.DeviceInfo, bool) {
	return deviceView(w.adminFor(dev, http.MethodGet, "/v1/devices/"+dev, "", time.Second))
}

// device is the device's view asked of this agent only.
func (a *agentSup) device(dev string) (wire.DeviceInfo, bool) {
	c := http.Client{Timeout: time.Second}
	return deviceView(c.Get(a.admin + "/v1/devices/" + dev))
}

// deviceView decodes a GET /v1/devices/{dev} answer; false unless 200.
func deviceView(resp *http.Response, err error) (wire.DeviceInfo, bool) {
	if err != nil {
		return wire.DeviceInfo{}, false
	}
	defer resp.Body.Close()
	var d wire.DeviceInfo
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&d) != nil {
		return wire.DeviceInfo{}, false
	}
	return d, true
}

// adminDo sends a request to the serving agent's admin API. With -ha it
// asks the agent that answered last first, and the other when that one
// cannot be reached or answers 503 (a standby serves only /v1/status and
// the probes); the answer of the last one asked is returned.
func (w *world) adminDo(method, path, body string, timeout time.Duration) (*http.Response, error) {
	c := http.Client{Timeout: timeout}
	first := int(w.asked.Load())
	var resp *http.Response
	var err error
	for i := range w.agents {
		k := (first + i) % len(w.agents)
		if resp != nil {
			resp.Body.Close()
		}
		var req *http.Request
		req, err = http.NewRequest(method, w.agents[k].admin+path, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err = c.Do(req)
		if err == nil && resp.StatusCode != http.StatusServiceUnavailable {
			w.asked.Store(int32(k))
			return resp, nil
		}
	}
	return resp, err
}

// serving is the agent holding the gateway's registration (-ha; the
// agent itself without), nil when none was seen yet.
func (w *world) serving() *agentSup {
	if !w.o.ha {
		return w.agent
	}
	w.regMu.Lock()
	defer w.regMu.Unlock()
	return w.registered
}

// build compiles the agent (with tags and, for a mutant, its go build
// -overlay file) and firmware-sim into dir.
func build(dir, tags, overlay string) (agent, firmware string, err error) {
	agent, firmware = filepath.Join(dir, "edge-agent"), filepath.Join(dir, "firmware-sim")
	for _, b := range []struct{ out, pkg, tags, overlay string }{{agent, "./cmd/edge-agent", tags, overlay}, {firmware, "./firmware-sim", "", ""}} {
		args := []string{"build", "-o", b.out}
		if b.tags != "" {
			args = append(args, "-tags", b.tags)
		}
		if b.overlay != "" {
			args = append(args, "-overlay", b.overlay)
		}
		cmd := exec.Command("go", append(args, b.pkg)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("go build -tags %q %s (run from the repository root): %v\n%s", b.tags, b.pkg, err, out)
		}
	}
	return agent, firmware, nil
}

// stopAll stops every process the campaign started, by PID.
func (w *world) stopAll() {
	w.ctlMu.Lock()
	for _, c := range w.ctls {
		if c != nil {
			c.p.Kill()
		}
	}
	w.ctlMu.Unlock()
	for _, a := range w.agents {
		a.close()
	}
	if p := w.firmwareProc(); p != nil {
		p.Stop(syscall.SIGTERM, 5*time.Second)
	}
	w.mosqMu.Lock()
	if w.mosq != nil {
		w.mosq.Stop(syscall.SIGTERM, 5*time.Second)
	}
	w.mosqMu.Unlock()
	if w.nats != nil {
		w.nats.Stop()
	}
	for i := range w.etcd {
		if p := w.etcdMemberProc(i); p != nil {
			p.Kill()
		}
	}
	if w.links != nil {
		w.links.close()
	}
}
