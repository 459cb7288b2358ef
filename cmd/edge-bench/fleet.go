package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/edge-agent/edge-agent/controller"
)

// The fleet run (-fleet, issue 21): for each gateway count G of
// -fleet-gateways, G edge-agent processes (each its own gateway_id,
// data_dir and firmware-sim of -fleet-devices devices, coordination.etcd
// on one etcd member) on one broker (-fleet-broker: mosquitto, or a
// 3-node NATS cluster through its MQTT interface), and one controller per
// device: it looks its device's gateway up in the directory
// (controller.LookupGateway), takes the device's lock in etcd
// (controller.Acquire: the time it took is the lock acquire time), sends
// a barrier and then commands with its fence, one in flight, for
// -duration. Per G: commands/s, p50/p99 end to end, lock acquire p50/p99,
// and CPU per command of every agent (median and max over the agents,
// each over its own commands), of the broker, etcd, the simulators and
// the controllers (this process).
//
// The controllers are goroutines of this process (a controller.Holder and
// a controller.Sender each): the machine's cores are shared by all the
// processes of the run either way, so controller processes of their own
// would add no CPU, only scheduling; this process's CPU per command is
// reported, so it shows when it is the larger share. Each controller has
// its own lock, lease and fence; with -fleet-conn gateway (the default)
// the controllers of one gateway's devices share one MQTT connection (a
// controller service per gateway), with -fleet-conn device each has its
// own.

var (
	fleetOn       = flag.Bool("fleet", false, "the fleet run (fleet.go): -fleet-gateways edge-agent processes of -fleet-devices devices each on one broker and one etcd, one controller per device taking its lock in etcd; commands/s, latency, lock acquire time and CPU per command per process")
	fleetGateways = flag.String("fleet-gateways", "1,5,20", "with -fleet: the gateway counts, each a run of its own")
	fleetDevices  = flag.Int("fleet-devices", 16, "with -fleet: devices per gateway (one firmware-sim each)")
	fleetBrokers  = flag.String("fleet-broker", "mosquitto,nats", "with -fleet: the brokers, each a series of runs (mosquitto; nats: a 3-node NATS cluster, JetStream and MQTT)")
	fleetConnMode = flag.String("fleet-conn", "gateway", "with -fleet: the controllers' MQTT connections: gateway (one per gateway, shared by its devices' controllers) or device (one per controller)")
)

// fleetResult is one run's figures.
type fleetResult struct {
	broker            string
	gateways, devices int
	n                 int // commands measured
	perSec            float64
	p50, p99          time.Duration
	acqP50, acqP99    time.Duration
	acqMax            time.Duration
	agentCPU          []time.Duration // per agent, per command of its own
	brokerCPU         time.Duration   // per command of all, every node
	etcdCPU           time.Duration
	simCPU            time.Duration        // every simulator
	benchCPU          time.Duration        // this process: the controllers
	agentIdle         []time.Duration      // per agent, CPU per second idle (fleetIdle)
	commitsPerCmd     []float64            // per agent, store commits per command of its own
	commitTime        []time.Duration      // per agent, mean time of a commit (fsync included)
	updatesPerCmd     []float64            // per agent, store updates per command of its own
	sends             controller.SendStats // every controller's, barriers and the warm-up included
	etcdIdle          time.Duration        // CPU per second idle
	brokerIdle        time.Duration        // CPU per second idle, every node
	benchIdle         time.Duration        // the controllers' CPU per second idle
	load              string               // /proc/loadavg before the run
}

func runFleet(dur time.Duration, out string) error {
	counts, err := parseCounts(*fleetGateways)
	if err != nil {
		return fmt.Errorf("-fleet-gateways: %w", err)
	}
	kinds, err := parseBrokerKinds(*fleetBrokers)
	if err != nil {
		return fmt.Errorf("-fleet-broker: %w", err)
	}
	if *fleetDevices < 1 {
		return fmt.Errorf("-fleet-devices %d: want at least 1", *fleetDevices)
	}
	if *fleetConnMode != "gateway" && *fleetConnMode != "device" {
		return fmt.Errorf("-fleet-conn %q: want gateway or device", *fleetConnMode)
	}
	tmp, err := os.MkdirTemp("", "edge-bench-fleet")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bins, err := buildBinaries(tmp)
	if err != nil {
		return err
	}
	var results []fleetResult
	for _, kind := range kinds {
		for _, g := range counts {
			dir := filepath.Join(tmp, fmt.Sprintf("%s-%d", kind, g))
			r, err := fleetRun(kind, bins, dir, g, *fleetDevices, dur)
			if err != nil {
				return fmt.Errorf("%s, %d gateways: %w", kind, g, err)
			}
			results = append(results, r)
			med, mx := medianMax(r.agentCPU)
			idle, idleMax := medianMax(r.agentIdle)
			fmt.Printf("%-9s %2d gateways x %d devices: %6.0f cmds/s, p50 %s, p99 %s; lock acquire p50 %s, p99 %s, max %s\n"+
				"          CPU per command: agents median %d µs, max %d µs; broker %d, etcd %d, firmware-sim %d, controllers %d µs; load before %s\n"+
				"          store: commits per command median %.2f, updates per command %.2f, a commit (fsync included) median %s\n"+
				"          controllers: %d publishes, %d resends after 10 s without a Result, %d busy, %d unknown Results\n"+
				"          idle (%s, locks held, no command): agents median %.1f, max %.1f ms CPU/s; broker %.1f, etcd %.1f, controllers %.1f ms/s\n",
				kind, g, r.devices, r.perSec, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond),
				r.acqP50.Round(time.Millisecond), r.acqP99.Round(time.Millisecond), r.acqMax.Round(time.Millisecond),
				med.Microseconds(), mx.Microseconds(), r.brokerCPU.Microseconds(), r.etcdCPU.Microseconds(),
				r.simCPU.Microseconds(), r.benchCPU.Microseconds(), r.load,
				median(r.commitsPerCmd), median(r.updatesPerCmd), medianDurOf(r.commitTime),
				r.sends.Published, r.sends.Resends, r.sends.Busy, r.sends.Unknown,
				fleetIdle, msOf(idle), msOf(idleMax), msOf(r.brokerIdle), msOf(r.etcdIdle), msOf(r.benchIdle))
		}
	}
	if out == "" {
		return nil
	}
	f, err := os.OpenFile(out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(f, "\n`go run ./cmd/edge-bench -fleet -fleet-gateways %s -fleet-devices %d -fleet-broker %s -fleet-conn %s -duration %s`, %s, load average after: %s:\n\n",
		*fleetGateways, *fleetDevices, *fleetBrokers, *fleetConnMode, dur, time.Now().UTC().Format("2006-01-02"), loadavg())
	writeFleetTable(f, results)
	return nil
}

// writeFleetTable writes the results as a Markdown table, each row's
// growth against the first row of its broker.
func writeFleetTable(f interface{ Write([]byte) (int, error) }, results []fleetResult) {
	fmt.Fprintln(f, "| broker | gateways x devices | cmds/s | per gateway | growth | p50 | p99 | lock acquire p50 | p99 | agent CPU µs/cmd median | max | agent idle ms/s median | agent commits/cmd median | commit ms median | broker µs/cmd | etcd | firmware-sim | controllers | load before |")
	fmt.Fprintln(f, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	var base *fleetResult
	for i := range results {
		r := &results[i]
		if base == nil || base.broker != r.broker {
			base = r
		}
		fmt.Fprintln(f, fleetRow(*r, *base))
	}
}

// fleetRow is one result's table row; base is the run its growth is
// measured against.
func fleetRow(r, base fleetResult) string {
	med, mx := medianMax(r.agentCPU)
	idle, _ := medianMax(r.agentIdle)
	return fmt.Sprintf("| %s | %d x %d | %.0f | %.0f | %s | %s | %s | %s | %s | %d | %d | %.1f | %.2f | %.2f | %d | %d | %d | %d | %s |",
		r.broker, r.gateways, r.devices, r.perSec, r.perSec/float64(max(r.gateways, 1)), growth(r, base),
		fmtLatency(r.p50), fmtLatency(r.p99),
		r.acqP50.Round(time.Millisecond), r.acqP99.Round(time.Millisecond),
		med.Microseconds(), mx.Microseconds(), float64(idle.Microseconds())/1000, median(r.commitsPerCmd), msOf(medianDurOf(r.commitTime)), r.brokerCPU.Microseconds(), r.etcdCPU.Microseconds(),
		r.simCPU.Microseconds(), r.benchCPU.Microseconds(), r.load)
}

// medianDurOf is the median of d (the upper one of an even count),
// rounded to 10 µs.
func medianDurOf(d []time.Duration) time.Duration {
	m, _ := medianMax(d)
	return m.Round(10 * time.Microsecond)
}

// fmtLatency rounds a latency for the table: to the µs below 10 ms, to
// 0.1 ms above.
func fmtLatency(d time.Duration) string {
	if d < 10*time.Millisecond {
		return d.Round(time.Microsecond).String()
	}
	return d.Round(100 * time.Microsecond).String()
}

// growth is r's throughput against base's, beside the growth in devices:
// "x3.1 for x5 devices"; "1" for base itself.
func growth(r, base fleetResult) string {
	bd, rd := base.gateways*base.devices, r.gateways*r.devices
	if base.perSec == 0 || bd == 0 || rd == bd {
		return "1"
	}
	return fmt.Sprintf("x%.2f for x%s devices", r.perSec/base.perSec, strconv.FormatFloat(float64(rd)/float64(bd), 'f', -1, 64))
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// parseCounts reads a list of positive integers ("1,5,20").
func parseCounts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want positive integers separated by commas", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%q: no count", s)
	}
	return out, nil
}

// parseBrokerKinds reads -fleet-broker: mosquitto and/or nats.
func parseBrokerKinds(s string) ([]string, error) {
	var out []string
	for _, f := range splitList(s) {
		if f != "mosquitto" && f != "nats" {
			return nil, fmt.Errorf("%q: want mosquitto or nats", f)
		}
		out = append(out, f)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%q: no broker", s)
	}
	return out, nil
}

// quantile is the q-quantile (0..1) of d as latencies takes p99: the
// element at len*q of the sorted values. d is sorted in place.
func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	i := int(float64(len(d)) * q)
	if i >= len(d) {
		i = len(d) - 1
	}
	return d[i]
}

// medianMax is the median (the upper one of an even count) and the
// largest of d.
func medianMax(d []time.Duration) (time.Duration, time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2], s[len(s)-1]
}

// loadavg is the first three fields of /proc/loadavg ("1.02 0.88 0.61"),
// or "?".
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return parseLoadavg(string(b))
}

func parseLoadavg(s string) string {
	f := strings.Fields(s)
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// fleetIdle is how long the idle CPU is measured, before the commands.
const fleetIdle = 5 * time.Second

// schedTimes is the CPU time each process (0: this one) has run so far,
// to the nanosecond: the sum over its threads of /proc/PID/task/TID/
// schedstat's first field. A thread that ended is not counted, so it is
// for the idle stretch (Go's threads live as long as the process), where
// the ticks of /proc/PID/stat (10 ms) are too coarse for a few ms/s.
func schedTimes(pids []int) []time.Duration {
	out := make([]time.Duration, len(pids))
	for i, pid := range pids {
		p := "self"
		if pid != 0 {
			p = strconv.Itoa(pid)
		}
		tasks, _ := os.ReadDir("/proc/" + p + "/task")
		for _, t := range tasks {
			b, err := os.ReadFile("/proc/" + p + "/task/" + t.Name() + "/schedstat")
			if err == nil {
				out[i] += parseSchedstat(string(b))
			}
		}
	}
	return out
}

// parseSchedstat reads the time on the CPU (ns, the first field) of a
// schedstat line.
func parseSchedstat(s string) time.Duration {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.ParseInt(f[0], 10, 64)
	return time.Duration(n)
}

// perSecond is d spent over took, per second.
func perSecond(d, took time.Duration) time.Duration {
	if took <= 0 {
		return 0
	}
	return time.Duration(float64(d) / took.Seconds())
}

// spent is each process's CPU since begin, in the order they were added.
func (m *cpuMeter) spent() []time.Duration {
	out := make([]time.Duration, len(m.pids))
	for i, p := range m.pids {
		if m.start != nil {
			out[i] = cpuTime(p) - m.start[i]
		}
	}
	return out
}

// fleetRun is one run: g gateways of devices devices each on the broker
// kind, for dur after the controllers took their locks.
func fleetRun(kind, bins, dir string, g, devices int, dur time.Duration) (fleetResult, error) {
	res := fleetResult{broker: kind, gateways: g, devices: devices, load: loadavg()}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return res, err
	}
	br, err := startFleetBroker(kind, dir)
	if err != nil {
		return res, err
	}
	defer br.stop()
	etcd, etcdPID, stopEtcd, err := startFleetEtcd(dir)
	if err != nil {
		return res, err
	}
	defer stopEtcd()

	// The gateways, a few starting at a time.
	gws := make([]*fleetGateway, g)
	defer func() {
		var wg sync.WaitGroup
		for _, gw := range gws {
			if gw != nil {
				wg.Add(1)
				go func() { defer wg.Done(); gw.stop() }()
			}
		}
		wg.Wait()
	}()
	var startErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			gw, err := startFleetGateway(bins, filepath.Join(dir, fleetGatewayID(i)), i, devices, br.urls, etcd)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				startErr = errors.Join(startErr, err)
				return
			}
			gws[i] = gw
		}()
	}
	wg.Wait()
	if startErr != nil {
		return res, startErr
	}

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return res, err
	}
	defer cli.Close()

	ctx, cancel := context.WithTimeout(context.Background(), dur+5*time.Minute)
	defer cancel()
	// The controllers' connections: one per gateway, or one per device.
	var conns []*controller.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	dial := func(gi int, id string) (*controller.Conn, error) {
		c, err := controller.Dial(ctx, controller.ConnOptions{Brokers: rotate(br.urls, gi+1), Gateway: fleetGatewayID(gi),
			ControllerID: id, ConnectTimeout: 30 * time.Second})
		if err == nil {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
		return c, err
	}
	gwConn := make([]*controller.Conn, g)
	if *fleetConnMode == "gateway" {
		for i := range g {
			if gwConn[i], err = dial(i, "fleet-"+fleetGatewayID(i)); err != nil {
				return res, err
			}
		}
	}

	m := &cpuMeter{}
	for _, gw := range gws {
		m.add("agent-"+gw.id, gw.agentPID)
	}
	for _, gw := range gws {
		m.add("sim-"+gw.id, gw.simPID)
	}
	for i, p := range br.pids {
		m.add(fmt.Sprintf("%s-%d", kind, i), p)
	}
	m.add("etcd", etcdPID)
	m.add("edge-bench", 0)

	var (
		n       = g * devices
		acq     = make([]time.Duration, n)
		lat     = make([][]time.Duration, n)
		perGw   = make([]atomic.Int64, g)
		ready   sync.WaitGroup
		done    sync.WaitGroup
		start   = make(chan struct{})
		errMu   sync.Mutex
		errs    []error
		failed  atomic.Int64
		end     time.Time
		warm    time.Time
		holders = make([]*controller.Holder, n)
		senders = make([]*controller.Sender, n)
	)
	fail := func(err error) {
		failed.Add(1)
		errMu.Lock()
		if len(errs) < 5 {
			errs = append(errs, err)
		}
		errMu.Unlock()
	}
	pad := strings.Repeat("x", 120)
	for gi := range g {
		for d := range devices {
			k := gi*devices + d
			dev := fleetDeviceID(gi, d)
			ready.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				readied := false
				defer func() {
					if !readied {
						ready.Done()
					}
				}()
				// The directory says which gateway fronts the device.
				gwID, err := controller.LookupGateway(ctx, cli, "", dev)
				if err != nil || gwID != fleetGatewayID(gi) {
					fail(fmt.Errorf("device %s: directory: %q, %v", dev, gwID, err))
					return
				}
				conn := gwConn[gi]
				if conn == nil {
					if conn, err = dial(gi, "fleet-"+dev); err != nil {
						fail(err)
						return
					}
				}
				t0 := time.Now()
				h, err := controller.Acquire(ctx, cli, []string{fleetLock(dev)}, &controller.LockOptions{
					Name: "ctl-" + dev, AcquireTimeout: 2 * time.Minute, RequestTimeout: 10 * time.Second})
				if err != nil {
					fail(fmt.Errorf("device %s: acquire: %w", dev, err))
					return
				}
				acq[k] = time.Since(t0)
				holders[k] = h
				s := controller.NewSender(conn, h, &controller.SendOptions{ResultTimeout: 10 * time.Second})
				senders[k] = s
				if err := s.Barrier(h.Context(), dev); err != nil {
					fail(fmt.Errorf("device %s: barrier: %w", dev, err))
					return
				}
				readied = true
				ready.Done()
				<-start
				for i := 0; time.Now().Before(end); i++ {
					params := json.RawMessage(fmt.Sprintf(`{"seq":%d,"pad":"%s"}`, i, pad))
					t := time.Now()
					sctx, scancel := context.WithTimeout(h.Context(), 30*time.Second)
					r, err := s.Send(sctx, dev, "set", params)
					scancel()
					if err != nil {
						fail(fmt.Errorf("device %s: send: %w (%s/%s)", dev, err, r.Status, r.Code))
						return
					}
					if t.After(warm) {
						lat[k] = append(lat[k], time.Since(t))
						perGw[gi].Add(1)
					}
				}
			}()
		}
	}
	ready.Wait()
	release := func() {
		var rw sync.WaitGroup
		for _, h := range holders {
			if h != nil {
				rw.Add(1)
				go func() {
					defer rw.Done()
					rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer rcancel()
					h.Release(rctx)
				}()
			}
		}
		rw.Wait()
	}
	if failed.Load() > 0 {
		close(start)
		done.Wait()
		release()
		return res, fmt.Errorf("%d controllers failed before the run: %w", failed.Load(), errors.Join(errs...))
	}
	// Idle first: every agent ready, every controller holding its lock
	// (its lease renewed) and no command: what a gateway costs without
	// commands, which its CPU per command carries when each gateway
	// gets few of them.
	idle0, t0 := schedTimes(m.pids), time.Now()
	time.Sleep(fleetIdle)
	idle, took := schedTimes(m.pids), time.Since(t0)
	for i := range idle {
		idle[i] -= idle0[i]
	}
	for i := range g {
		res.agentIdle = append(res.agentIdle, perSecond(idle[i], took))
	}
	res.etcdIdle = perSecond(idle[2*g+len(br.pids)], took)
	res.benchIdle = perSecond(idle[2*g+len(br.pids)+1], took)
	for i := range br.pids {
		res.brokerIdle += perSecond(idle[2*g+i], took)
	}
	warm, end = time.Now().Add(dur/10), time.Now().Add(dur)
	close(start)
	meterStarted := make(chan struct{})
	commits0 := make([]storeCommits, g)
	go func() {
		time.Sleep(time.Until(warm))
		m.begin()
		for i, gw := range gws {
			commits0[i], _ = gw.storeCommits()
		}
		close(meterStarted)
	}()
	done.Wait()
	<-meterStarted
	spent := m.spent()
	for i, gw := range gws {
		c, err := gw.storeCommits()
		if err != nil {
			return res, fmt.Errorf("gateway %s: /metrics: %w", gw.id, err)
		}
		n, cmds := c.commits-commits0[i].commits, float64(perGw[i].Load())
		if cmds > 0 && n > 0 {
			res.commitsPerCmd = append(res.commitsPerCmd, n/cmds)
			res.updatesPerCmd = append(res.updatesPerCmd, (c.updates-commits0[i].updates)/cmds)
			res.commitTime = append(res.commitTime, time.Duration((c.seconds-commits0[i].seconds)/n*float64(time.Second)))
		}
	}
	release()
	if failed.Load() > 0 {
		return res, fmt.Errorf("%d controllers failed: %w", failed.Load(), errors.Join(errs...))
	}

	for _, s := range senders {
		if s != nil {
			st := s.Stats()
			res.sends.Published += st.Published
			res.sends.Resends += st.Resends
			res.sends.Busy += st.Busy
			res.sends.Unknown += st.Unknown
		}
	}
	st, err := latencies(lat, dur-dur/10)
	if err != nil {
		return res, err
	}
	res.n, res.perSec, res.p50, res.p99 = st.n, st.perSec, st.p50, st.p99
	res.acqP50, res.acqP99, res.acqMax = quantile(acq, 0.5), quantile(acq, 0.99), acq[len(acq)-1]
	per := func(d time.Duration, cmds int64) time.Duration {
		if cmds == 0 {
			return 0
		}
		return d / time.Duration(cmds)
	}
	total := int64(st.n)
	for i := range g {
		res.agentCPU = append(res.agentCPU, per(spent[i], perGw[i].Load()))
		res.simCPU += per(spent[g+i], total)
	}
	for i := range br.pids {
		res.brokerCPU += per(spent[2*g+i], total)
	}
	res.etcdCPU = per(spent[2*g+len(br.pids)], total)
	res.benchCPU = per(spent[2*g+len(br.pids)+1], total)
	return res, nil
}
