package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/edge-agent/edge-agent/internal/chaos"
	"github.com/edge-agent/edge-agent/internal/rig"
)

const (
	gatewayID = "chaos"
	prefix    = "edge"
)

// options of one campaign (edge-chaos run's flags).
type options struct {
	seed         uint64
	duration     time.Duration
	embedded     bool
	controllers  int
	ttl          time.Duration
	out          string
	keep         bool
	ha           bool   // two agents for the gateway, one active (-ha)
	fleet        int    // -fleet N: N gateways on a NATS cluster (0: one gateway)
	nats         bool   // -broker nats (with -fleet)
	natsBin      string // "": rig.FindNATS
	mutant       string // the agent is this mutant (mutants/NAME.patch)
	overlay      string // go build -overlay file of the mutant's sources
	agentBin     string // prebuilt agent (failpoints build); "": built
	firmwareBin  string
	self         string // this binary, re-executed as the controllers
	etcdBin      string
	mosquittoBin string
	devices      []chaos.DeviceSpec
	settle       time.Duration
	porcupineTO  time.Duration
	log          io.Writer // progress lines
}

var defaultDevices = []chaos.DeviceSpec{
	{ID: "hot", Type: "relay", Queryable: true, Hot: true},
	{ID: "pump-a", Type: "pump", Queryable: true},
	{ID: "valve-n", Type: "valve", Queryable: false},
	{ID: "pump-g", Type: "pump", Group: "g1", Queryable: true},
	{ID: "relay-g", Type: "relay", Group: "g1", Queryable: true},
	{ID: "gen-a", Type: "generic", Queryable: true},
}

// campaign is one run: its world, its schedule, its observer.
type campaign struct {
	o     options
	w     *world
	obs   *observer
	meta  chaos.RunMeta
	start time.Time

	faultsWG sync.WaitGroup
	injected map[string]int
	injMu    sync.Mutex

	slowMu     sync.Mutex
	slowActive int
	slowUntil  time.Time // the firmware may still apply a delayed write until then

	invoked   atomic.Int64
	resolved  atomic.Int64
	refusals  map[string]string // dev/op -> the kind of the last refusal of its resolve recorded (the operator's goroutine only)
	takeovers atomic.Int64
	lostAt    atomic.Int64 // when the agent's store last lost its memory (wipe, restore)
	stopOp    chan struct{}
	opDone    chan struct{}

	stopRegWatch func() // -ha: ends watchRegistration (nil without)
}

func (c *campaign) logf(format string, a ...any) {
	fmt.Fprintf(c.o.log, "[%6.1fs] "+format+"\n", append([]any{time.Since(c.start).Seconds()}, a...)...)
}

// runCampaign runs one campaign and checks it; it returns the check's
// result (nil when the run could not be set up: err says why).
func runCampaign(o options) (*chaos.CheckResult, string, error) {
	dir := o.out
	if dir == "" {
		d, err := os.MkdirTemp("", fmt.Sprintf("edge-chaos-%d-", o.seed))
		if err != nil {
			return nil, "", err
		}
		dir = d
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	for _, sub := range []string{"plugins", "bin", "etcd"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return nil, dir, err
		}
	}
	c := &campaign{o: o, start: time.Now(), injected: map[string]int{}, stopOp: make(chan struct{}), opDone: make(chan struct{})}
	const tags = "failpoints"
	if o.agentBin == "" || o.firmwareBin == "" {
		what := ""
		if o.mutant != "" {
			what = ", mutant " + o.mutant
		}
		c.logf("building edge-agent (-tags %s%s) and firmware-sim", tags, what)
		a, f, err := build(filepath.Join(dir, "bin"), tags, o.overlay)
		if err != nil {
			return nil, dir, err
		}
		if o.agentBin == "" {
			o.agentBin = a
		}
		if o.firmwareBin == "" {
			o.firmwareBin = f
		}
		c.o = o
	}
	broker := "mosquitto"
	if o.embedded {
		broker = "embedded"
	}
	var fleet []string
	if o.fleet > 0 {
		broker = "nats (3 nodes)"
		for k := 0; k < o.fleet; k++ {
			fleet = append(fleet, gatewayName(k))
		}
	}
	c.meta = chaos.RunMeta{Seed: o.seed, Duration: o.duration.String(), Broker: broker, Tags: tags, Mutant: o.mutant, Devices: o.devices, HA: o.ha, Fleet: fleet}
	logf, err := os.OpenFile(filepath.Join(dir, "procs.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, dir, err
	}
	defer logf.Close()
	faults, err := chaos.OpenLines(filepath.Join(dir, "faults.jsonl"))
	if err != nil {
		return nil, dir, err
	}
	w := &world{o: o, dir: dir, out: logf, links: newLinks(), fault: faults}
	c.w = w
	defer w.stopAll()
	defer func() {
		if c.stopRegWatch != nil {
			c.stopRegWatch()
		}
	}()
	if err := c.setup(); err != nil {
		return nil, dir, err
	}
	c.start = time.Now()
	c.meta.Start = c.start.UnixNano()
	if err := c.writeMeta(); err != nil {
		return nil, dir, err
	}
	sched := schedule(o.seed, o.duration, o.controllers, o.devices, o.ttl, o.embedded, o.ha, o.fleet)
	c.logf("seed %d: %d faults scheduled over %v; history in %s", o.seed, len(sched), o.duration, dir)
	go c.operator()
	progressDone := make(chan struct{})
	go c.progress(progressDone)
	watchDone := make(chan struct{})
	floorsDone := make(chan struct{})
	go func() {
		defer close(floorsDone)
		c.floorWatch(watchDone)
	}()
	go c.backupLoop(progressDone)
	for _, f := range sched {
		if d := time.Until(c.start.Add(f.At)); d > 0 {
			time.Sleep(d)
		}
		c.faultsWG.Add(1)
		go func() {
			defer c.faultsWG.Done()
			c.inject(f)
		}()
	}
	if d := time.Until(c.start.Add(o.duration)); d > 0 {
		time.Sleep(d)
	}
	c.meta.End = time.Now().UnixNano()
	c.logf("faults stop; waiting for the ones in progress")
	c.faultsWG.Wait()
	c.settle()
	close(progressDone)
	close(c.stopOp)
	<-c.opDone
	c.meta.Settled = time.Now().UnixNano()
	close(watchDone)
	<-floorsDone
	for _, a := range w.agents {
		a.close()
	}
	c.obs.close()
	w.stopAll()
	faults.Close()
	if err := c.writeMeta(); err != nil {
		return nil, dir, err
	}
	c.logf("checking the history")
	h, err := chaos.LoadHistory(dir)
	if err != nil {
		return nil, dir, err
	}
	res := chaos.Check(h, dir, o.porcupineTO)
	return res, dir, nil
}

func (c *campaign) writeMeta() error {
	b, err := json.MarshalIndent(c.meta, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.w.dir, "run.json"), b, 0o644)
}

// setup starts every process and link and waits until the agent is ready
// and every controller runs.
func (c *campaign) setup() error {
	w, o := c.w, c.o
	if err := w.startEtcd(); err != nil {
		return err
	}
	for i, m := range w.etcd {
		addr, err := w.links.add(fmt.Sprintf("etcd-%d", i), strings.TrimPrefix(m.client, "http://"))
		if err != nil {
			return err
		}
		w.etcdProxies = append(w.etcdProxies, "http://"+addr)
	}
	if o.fleet > 0 {
		// the NATS cluster: setupFleet
	} else if o.embedded {
		a, err := rig.FreeAddr()
		if err != nil {
			return err
		}
		w.mosqAddr = a
	} else {
		if err := w.startMosquitto(); err != nil {
			return err
		}
		addr, err := w.links.add("broker", w.mosqAddr)
		if err != nil {
			return err
		}
		w.agentBrokerURL = "tcp://" + addr
	}
	w.brokerURL = "tcp://" + w.mosqAddr
	if err := w.startFirmware(); err != nil {
		return err
	}
	if o.fleet > 0 {
		if err := c.setupFleet(); err != nil {
			return err
		}
		return c.startObserverAndControllers()
	}
	fwp, err := w.links.add("firmware", w.fwAddr)
	if err != nil {
		return err
	}
	w.fwProxy = fwp
	names := []string{""}
	if o.ha {
		names = []string{"a", "b"}
		if err := c.watchRegistration(); err != nil {
			return err
		}
	}
	for i, name := range names {
		admin, err := rig.FreeAddr()
		if err != nil {
			return err
		}
		data := filepath.Join(w.dir, "agent-data")
		var eps []string // nil: each etcd member directly
		if name != "" {
			data += "-" + name
			// Each of the pair reaches etcd through links of its own,
			// so either can be partitioned from it (ha_partition).
			for k, m := range w.etcd {
				addr, err := w.links.add(fmt.Sprintf("agent-%s-etcd-%d", name, k), strings.TrimPrefix(m.client, "http://"))
				if err != nil {
					return err
				}
				eps = append(eps, "http://"+addr)
			}
		}
		cfg := agentConfigPath(w.dir, name)
		if err := os.WriteFile(cfg, []byte(w.agentConfig(admin, data, eps)), 0o644); err != nil {
			return err
		}
		a := newAgentSup(w, name, "http://"+admin, data, cfg, o.seed+uint64(i)*1000)
		w.agents = append(w.agents, a)
		if err := a.start(""); err != nil {
			return err
		}
		a.running.Store(true) // before the goroutine: close must wait for it
		go a.run()
		// The first serves; the second of a pair waits as its standby.
		if !rig.WaitFor(30*time.Second, map[bool]func() bool{true: a.ready, false: a.up}[i == 0]) {
			return fmt.Errorf("edge-agent %s not ready on %s within 30s (%s); see %s", name, admin, a.proc().Ended(), filepath.Join(w.dir, "procs.log"))
		}
	}
	w.agent = w.agents[0]
	if _, err := w.takeBackup(w.agent); err != nil {
		return err
	}
	return c.startObserverAndControllers()
}

// startObserverAndControllers starts the observer and the controllers.
func (c *campaign) startObserverAndControllers() error {
	w, o := c.w, c.o
	obsLog, err := chaos.OpenLines(filepath.Join(w.dir, "observer.jsonl"))
	if err != nil {
		return err
	}
	if o.fleet > 0 {
		c.obs = newObserver(obsLog, w.brokerURLs, prefix, "+")
	} else {
		c.obs = newObserver(obsLog, []string{w.brokerURL}, prefix, gatewayID)
	}
	c.obs.start()
	for i := 0; i < o.controllers; i++ {
		s, err := w.startController(i, 0)
		if err != nil {
			return err
		}
		w.ctls = append(w.ctls, s)
	}
	return nil
}

func (c *campaign) count(kind string) {
	c.injMu.Lock()
	c.injected[kind]++
	c.injMu.Unlock()
}

// slow marks a fault that delays writes on their way to the firmware from
// now until its end (the operator waits that out before it resolves a
// held write from the journal).
func (c *campaign) slow(on bool, extra time.Duration) {
	c.slowMu.Lock()
	defer c.slowMu.Unlock()
	if on {
		c.slowActive++
		return
	}
	c.slowActive--
	if u := time.Now().Add(extra + 3*time.Second); u.After(c.slowUntil) {
		c.slowUntil = u
	}
}

func (c *campaign) quiet() bool {
	c.slowMu.Lock()
	defer c.slowMu.Unlock()
	return c.slowActive == 0 && time.Now().After(c.slowUntil)
}

// operator resolves the writes held unknown on devices that cannot be
// asked (queryable: false: those whose last Result was unknown, and those
// the agent lists as held, GET /v1/ops?status=unknown), from the firmware
// journal's truth, once nothing can still land: the held write's unknown
// Result (or its listing) is 3s old and no fault that delays writes
// (firmware latency, network latency or black hole) has been active since
// a while. The firmware's hang never applies a write.
func (c *campaign) operator() {
	defer close(c.opDone)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	listed := map[string]int64{} // dev/op -> first seen in GET /v1/ops?status=unknown
	for {
		select {
		case <-c.stopOp:
			return
		case <-tick.C:
		}
		now := time.Now().UnixNano()
		var agentHeld map[string]bool
		if c.o.fleet > 0 {
			agentHeld = c.w.heldUnknownFleet()
		} else {
			agentHeld = c.w.heldUnknown()
		}
		for k := range listed {
			if !agentHeld[k] {
				delete(listed, k)
			}
		}
		for k := range agentHeld {
			if listed[k] == 0 {
				listed[k] = now
			}
		}
		for _, d := range c.o.devices {
			if d.Queryable {
				continue
			}
			held := c.obs.held(d.ID)
			// A store restored from a backup holds again what it held
			// then, with no new Result: the agent's list says so.
			for k, at := range listed {
				if dev, op, _ := strings.Cut(k, "/"); dev == d.ID {
					if _, ok := held[op]; !ok {
						held[op] = at
					}
				}
			}
			for op, at := range held {
				if time.Since(time.Unix(0, at)) < 3*time.Second || !c.quiet() {
					continue
				}
				c.resolve(d.ID, op)
			}
		}
	}
}

func (c *campaign) resolve(dev, op string) {
	entries, err := chaos.ReadLines[struct {
		Device string `json:"device"`
		OpID   string `json:"op_id"`
	}](filepath.Join(c.w.dir, "journal.jsonl"))
	if err != nil {
		return
	}
	applied := false
	for _, e := range entries {
		if e.Device == dev && e.OpID == op {
			applied = true
		}
	}
	body := `{"applied":false}`
	if applied {
		st, err := c.w.firmwareState(dev)
		if err != nil {
			return
		}
		body = fmt.Sprintf(`{"applied":true,"state":%s}`, bytes.TrimSpace(st))
	}
	resp, err := c.w.adminFor(dev, http.MethodPost, "/v1/devices/"+dev+"/ops/"+op+"/resolve", body, 3*time.Second)
	if err != nil {
		c.refused(dev, op, err.Error())
		return
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		c.resolved.Add(1)
		c.w.record("operator_resolve", "start", dev+"/"+op, fmt.Sprintf("applied=%v (from the journal)", applied))
	} else {
		c.refused(dev, op, fmt.Sprintf("%s: %s", resp.Status, bytes.TrimSpace(msg)))
	}
}

// refused records why a resolve did not end dev/op (409 too early or not
// unknown, 404 no record, 503 starting, the agent not answering), once per
// kind of answer (the gateway asked and the answer's first words: a too
// early answer counts down), so that a write left held at the end says in
// the history why the operator did not end it. The operator's goroutine
// only.
func (c *campaign) refused(dev, op, why string) {
	why = "not resolved at " + c.w.gatewayNameOf(dev) + ": " + why
	kind := why
	if len(kind) > 80 {
		kind = kind[:80]
	}
	if c.refusals == nil {
		c.refusals = map[string]string{}
	}
	if c.refusals[dev+"/"+op] != kind {
		c.refusals[dev+"/"+op] = kind
		c.w.record("operator_resolve", "error", dev+"/"+op, why)
	}
}

// progress prints a line every 5 seconds.
func (c *campaign) progress(done <-chan struct{}) {
	cnt := &invokedCounter{dir: c.w.dir, off: map[string]int64{}}
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		n := cnt.count()
		c.invoked.Store(n)
		results, final := c.obs.counts()
		c.injMu.Lock()
		total := 0
		for _, v := range c.injected {
			total += v
		}
		c.injMu.Unlock()
		starts := int64(0)
		for _, a := range c.w.agents {
			starts += a.starts.Load()
		}
		if c.o.ha {
			c.logf("commands %d, final %d, results %d, faults %d, agent starts %d, takeovers %d, resolved by the operator %d",
				n, final, results, total, starts, c.takeovers.Load(), c.resolved.Load())
			continue
		}
		c.logf("commands %d, final %d, results %d, faults %d, agent starts %d, resolved by the operator %d",
			n, final, results, total, starts, c.resolved.Load())
	}
}

// invokedCounter counts "invoked" lines in the controllers' files, reading
// only what was appended since the last count.
type invokedCounter struct {
	dir string
	off map[string]int64
	n   int64
}

func (k *invokedCounter) count() int64 {
	files, _ := filepath.Glob(filepath.Join(k.dir, "ctl-*.jsonl"))
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		fh.Seek(k.off[f], io.SeekStart)
		b, _ := io.ReadAll(fh)
		fh.Close()
		b = b[:bytes.LastIndexByte(b, '\n')+1]
		k.off[f] += int64(len(b))
		k.n += int64(bytes.Count(b, []byte(`"ev":"invoked"`)))
	}
	return k.n
}

// settle ends the faults, lets the controllers finish, and waits until
// every published command has its final Result (the operator resolving
// held writes meanwhile), or o.settle passes.
func (c *campaign) settle() {
	w := c.w
	c.logf("healing: links, firmware faults, paused controllers, dead processes")
	_ = w.links.heal("")
	_ = w.setFirmwareFaults(`{}`)
	w.ctlMu.Lock()
	for _, s := range w.ctls {
		_ = s.p.Signal(syscall.SIGUSR2)
		_ = s.p.Signal(syscall.SIGCONT)
	}
	w.ctlMu.Unlock()
	w.mosqMu.Lock()
	mosqDead := !c.o.embedded && (w.mosq == nil || !w.mosq.Running())
	w.mosqMu.Unlock()
	if mosqDead && w.nats == nil {
		_ = w.runMosquitto()
	}
	if w.nats != nil {
		w.natsMu.Lock()
		for i, n := range w.nats.Nodes {
			if !n.Running() {
				_ = w.nats.Restart(i)
			}
		}
		w.natsMu.Unlock()
	}
	if p := w.firmwareProc(); p == nil || !p.Running() {
		_ = w.startFirmware()
	}
	for i, m := range w.etcd {
		if p := w.etcdMemberProc(i); p == nil || !p.Running() {
			_ = w.runEtcd(m, w.etcdInitial(), "existing")
		}
	}
	for _, a := range w.agents {
		if !a.plain() {
			a.restart(agentCmd{sig: syscall.SIGTERM, down: 200 * time.Millisecond, kind: "settle"})
		}
	}
	c.logf("stopping the controllers (each finishes the operation in hand)")
	var wg sync.WaitGroup
	w.ctlMu.Lock()
	for _, s := range w.ctls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.p.Stop(syscall.SIGTERM, 30*time.Second)
		}()
	}
	w.ctlMu.Unlock()
	wg.Wait()
	deadline := time.Now().Add(c.o.settle)
	for {
		missing := c.unfinished()
		if len(missing) == 0 {
			c.logf("settled: every published command has a final Result")
			return
		}
		if time.Now().After(deadline) {
			c.logf("not settled within %v: %d published commands without a final Result (e.g. %s)", c.o.settle, len(missing), missing[0])
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// unfinished lists published operations without a final Result yet.
func (c *campaign) unfinished() []string {
	files, _ := filepath.Glob(filepath.Join(c.w.dir, "ctl-*.jsonl"))
	var out []string
	lost := c.lostAt.Load()
	ctlFinal := map[string]bool{} // a fleet's: the controllers are witnesses too (chaos.Check)
	for _, f := range files {
		evs, _ := chaos.ReadLines[chaos.Event](f)
		for _, e := range evs {
			if c.o.fleet > 0 && e.Ev == chaos.EvResult && e.Result != nil && e.Result.Final() {
				ctlFinal[e.Op] = true
			}
		}
	}
	for _, f := range files {
		evs, _ := chaos.ReadLines[chaos.Event](f)
		for _, e := range evs {
			if ctlFinal[e.Op] {
				continue
			}
			// One published before the store lost its memory may have
			// lost its Result with it (the checker's "lost" operations).
			if e.Ev == chaos.EvPublished && e.T >= lost && !c.obs.finalSeen(e.Op) {
				out = append(out, e.Dev+"/"+e.Op)
			}
		}
	}
	return dedup(out)
}

func dedup(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}
