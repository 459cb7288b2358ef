// Command edge-bench is the end-to-end benchmark of `make bench`: for 1, 8
// and 64 devices it measures commands per second and p50/p99 latency from
// publishing a command to receiving its Result through a real mosquitto
// (started with configs/mosquitto.conf), for edge-agent, for an echo
// baseline that answers each command without doing anything (same broker,
// same client library), and for a device-echo that only forwards each
// command to firmware-sim before answering; it prints the ratios and the
// CPU every process spent per command. Each device's controller keeps one
// command in flight, as an owner does (DESIGN.md: the next command only
// after the previous one has its final Result).
//
// With -footprint it measures the disk instead (footprint.go): bytes the
// agent process writes per command (/proc/PID/io write_bytes), with
// mosquitto or the embedded broker, and the store file's size after
// -commands commands with the default retention; -idle adds an idle stretch
// with systemd's watchdog on (its store probe's writes).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edge-agent/edge-agent/configs"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/app"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/device"
	"github.com/edge-agent/edge-agent/internal/mqtt"
	"github.com/edge-agent/edge-agent/wire"
)

const gw = "bench"

func main() {
	dur := flag.Duration("duration", 5*time.Second, "measuring time per run")
	devs := flag.String("devices", "1,8,64", "device counts")
	out := flag.String("out", "", "append a Markdown table to this file")
	prof := flag.String("cpuprofile", "", "write a CPU profile of this process here (with -inprocess: of everything but mosquitto)")
	inproc := flag.Bool("inprocess", false, "run the agent, the firmware simulator and the echo inside this process (for CPU profiles) instead of as processes of their own")
	flag.Func("agent-env", "KEY=VALUE added to the edge-agent process's environment, e.g. GOGC=200 (repeatable; not with -inprocess)", func(kv string) error {
		if !strings.Contains(kv, "=") {
			return fmt.Errorf("%q: want KEY=VALUE", kv)
		}
		agentEnv = append(agentEnv, kv)
		return nil
	})
	fp := flag.Bool("footprint", false, "measure bytes written per command and the store's size instead of speed (footprint.go)")
	fpBrokers := flag.String("brokers", "mosquitto,embedded", "with -footprint: the brokers to run with (mosquitto, embedded)")
	fpCommands := flag.Int("commands", 20000, "with -footprint: commands per run, after a warm-up of 20 per device")
	fpIdle := flag.Duration("idle", 0, "with -footprint: then measure the agent idle for this long, watchdog on (WATCHDOG_USEC=30s)")
	fpData := flag.String("data-dir", "", "with -footprint: put the agents' data here, on a block device nothing else writes to (a loop mount), and count the bytes that reach it")
	echoBroker := flag.String("echo", "", "internal: serve as the echo baseline on this broker until stdin closes")
	echoDevice := flag.String("echo-device", "", "internal, with -echo: forward each command to this firmware-sim")
	echoDevices := flag.Int("echo-devices", 0, "internal, with -echo-device: how many devices (d0..) it simulates")
	flag.Parse()
	if *echoBroker != "" {
		stop, err := startEcho(*echoBroker, *echoDevice, *echoDevices)
		if err != nil {
			fmt.Fprintln(os.Stderr, "edge-bench echo:", err)
			os.Exit(1)
		}
		fmt.Println("ready")
		io.Copy(io.Discard, os.Stdin)
		stop()
		return
	}
	if *fp {
		if err := runFootprint(*devs, *fpBrokers, *fpCommands, *fpIdle, *fpData, *out); err != nil {
			fmt.Fprintln(os.Stderr, "edge-bench:", err)
			os.Exit(1)
		}
		return
	}
	inProcess = *inproc
	if *prof != "" {
		f, err := os.Create(*prof)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if err := run(*dur, *devs, *out); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "edge-bench:", err)
		os.Exit(1)
	}
}

// inProcess: everything in this process (-inprocess); otherwise the echo,
// the agent and the firmware simulator each run as a process of their own,
// as they would be deployed, and this process is the load generator.
var inProcess bool

// agentEnv is added to the edge-agent process's environment (-agent-env).
var agentEnv []string

// mosquittoPid is the broker's process, for the CPU accounting.
var mosquittoPid int

type stats struct {
	n        int
	perSec   float64
	p50, p99 time.Duration
	cpu      string          // CPU per command by process (cpuMeter.perCommand)
	cpuParts []time.Duration // the same, per process, in the meter's order; total last
	cpuNames []string        // the processes of cpuParts
}

// cpuCell is a table cell of CPU per command: "mosquitto 50 + echo 44 +
// edge-bench 56 = 150 µs CPU".
func cpuCell(st stats) string {
	parts := st.cpuParts
	if len(parts) == 0 {
		return ""
	}
	var b strings.Builder
	for i, d := range parts[:len(parts)-1] {
		if i > 0 {
			b.WriteString(" + ")
		}
		fmt.Fprintf(&b, "%s %d", st.cpuNames[i], d.Microseconds())
	}
	fmt.Fprintf(&b, " = %d µs CPU", parts[len(parts)-1].Microseconds())
	return b.String()
}

func run(dur time.Duration, devList, out string) error {
	tmp, err := os.MkdirTemp("", "edge-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	broker, brokerPid, stop, err := startMosquitto(tmp)
	if err != nil {
		return err
	}
	mosquittoPid = brokerPid
	defer stop()
	var bins string
	if !inProcess {
		if bins, err = buildBinaries(tmp); err != nil {
			return err
		}
	}
	var rows []string
	fmt.Printf("%-8s %-12s %10s %9s %9s\n", "devices", "target", "cmds/s", "p50", "p99")
	for _, f := range strings.Split(devList, ",") {
		var n int
		fmt.Sscan(f, &n)
		var res [3]stats
		for _, k := range []kind{echoKind, deviceEchoKind, agentKind} {
			var err error
			// Labelled, so a CPU profile separates the runs: go tool
			// pprof -tagfocus target=edge-agent.
			pprof.Do(context.Background(), pprof.Labels("target", k.String()), func(context.Context) {
				res[k], err = measure(broker, n, dur, target{bins: bins, kind: k, dir: filepath.Join(tmp, fmt.Sprintf("agent-%d", n))})
			})
			if err != nil {
				return fmt.Errorf("%s, %d devices: %w", k, n, err)
			}
			r := res[k]
			ratio := ""
			if k == agentKind {
				ratio = fmt.Sprintf("   ratio %.2f of echo, %.2f of device-echo", r.perSec/res[echoKind].perSec, r.perSec/res[deviceEchoKind].perSec)
			}
			fmt.Printf("%-8d %-12s %10.0f %9s %9s%s\n         %s\n", n, k, r.perSec, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), ratio, r.cpu)
		}
		e, de, ag := res[echoKind], res[deviceEchoKind], res[agentKind]
		rows = append(rows, fmt.Sprintf("| %d | %.0f | %s | %.0f | %s | %.0f | %s | %s | **%.2f** | %.2f |", n,
			e.perSec, e.p50.Round(time.Microsecond), de.perSec, de.p50.Round(time.Microsecond),
			ag.perSec, ag.p50.Round(time.Microsecond), ag.p99.Round(time.Microsecond),
			ag.perSec/e.perSec, ag.perSec/de.perSec))
		rows = append(rows, fmt.Sprintf("|  | %s | | %s | | %s | | | | |", cpuCell(e), cpuCell(de), cpuCell(ag)))
	}
	if out != "" {
		f, err := os.OpenFile(out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		how := "agent, firmware-sim and echo as processes of their own"
		flags := ""
		if inProcess {
			how, flags = "everything in one process", " -inprocess"
		}
		fmt.Fprintf(f, "\nEnd to end through mosquitto (%s), %s per run, `go run ./cmd/edge-bench%s -duration %s -devices %s`, %s:\n\n", how, dur, flags, dur, devList, time.Now().UTC().Format("2006-01-02"))
		fmt.Fprintln(f, "| devices | echo cmds/s | echo p50 | device-echo cmds/s | device-echo p50 | agent cmds/s | agent p50 | agent p99 | agent/echo | agent/device-echo |")
		fmt.Fprintln(f, "|---|---|---|---|---|---|---|---|---|---|")
		for _, r := range rows {
			fmt.Fprintln(f, r)
		}
	}
	return nil
}

// agentTarget runs edge-agent in-process against the broker, with a
// firmware simulator for its devices (-inprocess).
type agentTarget struct {
	dir string
	a   *app.App
	fw  *sim.Sim
}

func (t *agentTarget) start(broker string, n int) error {
	var err error
	if t.fw, err = startSimInProcess(n); err != nil {
		return err
	}
	cfg, err := config.Parse([]byte(agentYAML(t.dir, broker, "", t.fw.URL(), n)))
	if err != nil {
		return err
	}
	t.a = app.New(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err := t.a.Start(context.Background()); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for t.a.Ready() != nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("agent not ready: %v", t.a.Ready())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

func (t *agentTarget) stop() {
	if os.Getenv("EDGE_BENCH_DEBUG") != "" {
		st := t.a.Store().Stats()
		fmt.Fprintf(os.Stderr, "store: %d commits, %d updates (%.1f/commit), %.2fms/commit\n", st.Commits, st.Updates,
			float64(st.Updates)/float64(st.Commits), st.CommitTime.Seconds()*1000/float64(st.Commits))
		ds := t.a.Store().DB().Stats()
		fmt.Fprintf(os.Stderr, "bbolt: %d writes, %.1f pages/commit, write %s, spill %s, rebalance %s, split %d\n",
			ds.TxStats.GetWrite(), float64(ds.TxStats.GetWrite())/float64(st.Commits), ds.TxStats.GetWriteTime(),
			ds.TxStats.GetSpillTime(), ds.TxStats.GetRebalanceTime(), ds.TxStats.GetSplit())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t.a.Stop(ctx)
	t.fw.Close()
}

// startEcho answers every command with an applied Result. With a device
// URL (firmware-sim of n generic devices d0..), it first sends the command
// there through the agent's HTTP driver, one write in flight per device as
// the agent's workers do, and answers with the device's outcome: what any
// gateway in front of an HTTP device pays, without a store, fences or
// deduplication. Without one it does nothing else.
func startEcho(broker, deviceURL string, n int) (func(), error) {
	var c paho.Client
	var drv *device.HTTP
	var lanes []chan paho.Message
	answer := func(m paho.Message) {
		var cmd wire.Command
		if json.Unmarshal(m.Payload(), &cmd) != nil {
			return
		}
		dev, _ := wire.DeviceFromCmdTopic(wire.DefaultPrefix, gw, m.Topic())
		r := wire.Result{V: 1, OpID: cmd.OpID, Device: dev, Fence: cmd.Fence, Status: wire.StatusApplied,
			Code: wire.CodeOK, Reason: "echo", LastFence: cmd.Fence, At: time.Now().UTC()}
		if drv != nil {
			wr := drv.Apply(context.Background(), device.Write{Device: dev, OpID: cmd.OpID, Key: cmd.OpID,
				Fence: cmd.Fence, Action: cmd.Action, Params: cmd.Params})
			if wr.Outcome != device.Applied {
				r.Status, r.Code, r.Reason = wire.StatusFailed, wire.CodeDeviceError, wr.Reason
			}
		}
		b, _ := json.Marshal(r)
		c.Publish(cmd.ReplyTo, 1, false, b) // not waited for: never block paho's handler
	}
	handler := func(_ paho.Client, m paho.Message) { answer(m) }
	if deviceURL != "" {
		devs := map[string]device.HTTPDevice{}
		for i := 0; i < n; i++ {
			devs[fmt.Sprintf("d%d", i)] = device.HTTPDevice{URL: deviceURL, Idempotent: true, Queryable: true}
		}
		var err error
		if drv, err = device.NewHTTP(device.HTTPOptions{Devices: devs}); err != nil {
			return nil, err
		}
		// One goroutine per device, as the agent's workers: paho's
		// handler only hands the command over.
		lanes = make([]chan paho.Message, n)
		for i := range lanes {
			lanes[i] = make(chan paho.Message, 16)
			go func(ch chan paho.Message) {
				for m := range ch {
					answer(m)
				}
			}(lanes[i])
		}
		handler = func(_ paho.Client, m paho.Message) {
			dev, _ := wire.DeviceFromCmdTopic(wire.DefaultPrefix, gw, m.Topic())
			i, err := strconv.Atoi(strings.TrimPrefix(dev, "d"))
			if err != nil || i < 0 || i >= n {
				return
			}
			lanes[i] <- m
		}
	}
	o := paho.NewClientOptions().AddBroker(broker).SetClientID("edge-bench-echo").SetCleanSession(true).
		SetCustomOpenConnectionFn(mqtt.OpenConnection). // the agent's connection (mqtt/conn.go)
		SetDefaultPublishHandler(handler)
	c = paho.NewClient(o)
	stop := func() {
		c.Disconnect(100)
		for _, l := range lanes {
			close(l)
		}
		if drv != nil {
			drv.Close()
		}
	}
	if t := c.Connect(); !t.WaitTimeout(5*time.Second) || t.Error() != nil {
		stop()
		return nil, fmt.Errorf("echo connect: %v", t.Error())
	}
	if t := c.Subscribe(wire.CmdFilter(wire.DefaultPrefix, gw), 1, nil); !t.WaitTimeout(5*time.Second) || t.Error() != nil {
		stop()
		return nil, fmt.Errorf("echo subscribe: %v", t.Error())
	}
	return stop, nil
}

// agentYAML is the agent's configuration for the benchmark: n generic
// devices d0.. at the firmware simulator simURL, every commit fsynced (the
// default), the admin API on admin ("": none).
func agentYAML(dataDir, broker, admin, simURL string, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "gateway_id: %s\ndata_dir: %s\nmqtt:\n  broker: %s\n  client_id: edge-bench-%d\nadmin:\n  listen: %q\ndevices:\n", gw, dataDir, broker, n, admin)
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - id: d%d\n    type: generic\n    driver: {url: %s, idempotent: true, queryable: true}\n", i, simURL)
	}
	return b.String()
}

// startSimInProcess runs a firmware simulator of n generic devices d0.. in
// this process.
func startSimInProcess(n int) (*sim.Sim, error) {
	types := map[string]string{}
	for i := 0; i < n; i++ {
		types[fmt.Sprintf("d%d", i)] = "generic"
	}
	fw, err := sim.New(sim.Options{Devices: types})
	if err != nil {
		return nil, err
	}
	if err := fw.Start(context.Background(), "127.0.0.1:0"); err != nil {
		return nil, err
	}
	return fw, nil
}

// target is what answers the commands: the echo baseline or edge-agent,
// in this process or as processes built into bins.
type target struct {
	bins string // "" with -inprocess
	kind kind
	dir  string
}

// kind is what answers the commands.
type kind int

const (
	echoKind       kind = iota // answers at once
	deviceEchoKind             // forwards each command to firmware-sim, then answers
	agentKind                  // edge-agent
)

func (k kind) String() string {
	return [...]string{"echo", "device-echo", "edge-agent"}[k]
}

func (t target) start(broker string, n int, m *cpuMeter) (func(), error) {
	switch {
	case inProcess && t.kind == agentKind:
		at := &agentTarget{dir: t.dir}
		if err := at.start(broker, n); err != nil {
			return nil, err
		}
		return at.stop, nil
	case inProcess && t.kind == deviceEchoKind:
		fw, err := startSimInProcess(n)
		if err != nil {
			return nil, err
		}
		stop, err := startEcho(broker, fw.URL(), n)
		if err != nil {
			fw.Close()
			return nil, err
		}
		return func() { stop(); fw.Close() }, nil
	case inProcess:
		return startEcho(broker, "", 0)
	case t.kind == agentKind:
		return startAgentProcesses(t.bins, t.dir, broker, n, m)
	case t.kind == deviceEchoKind:
		url, stopSim, err := startSimProcess(t.bins, n, m)
		if err != nil {
			return nil, err
		}
		stop, err := startEchoProcess(broker, url, n, m)
		if err != nil {
			stopSim()
			return nil, err
		}
		return func() { stop(); stopSim() }, nil
	}
	return startEchoProcess(broker, "", 0, m)
}

// measure runs n closed-loop controllers (one per device, one command in
// flight each) for dur and reports throughput and latency.
func measure(broker string, n int, dur time.Duration, t target) (stats, error) {
	m := &cpuMeter{}
	m.add("mosquitto", mosquittoPid)
	stopTarget, err := t.start(broker, n, m)
	if err != nil {
		return stats{}, err
	}
	defer stopTarget()
	run := time.Now().UnixNano()
	var mu sync.Mutex
	waiting := map[string]chan struct{}{}
	reply := fmt.Sprintf("bench/reply/%d", run)
	o := paho.NewClientOptions().AddBroker(broker).SetClientID(fmt.Sprintf("edge-bench-ctl-%d", run)).SetCleanSession(true).
		SetMaxResumePubInFlight(1024).
		SetCustomOpenConnectionFn(mqtt.OpenConnection).
		SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) {
			var r wire.Result
			if json.Unmarshal(m.Payload(), &r) != nil || r.Status == wire.StatusUnknown {
				return
			}
			mu.Lock()
			ch := waiting[r.OpID]
			delete(waiting, r.OpID)
			mu.Unlock()
			if ch != nil {
				close(ch)
			}
		})
	c := paho.NewClient(o)
	if tk := c.Connect(); !tk.WaitTimeout(5*time.Second) || tk.Error() != nil {
		return stats{}, fmt.Errorf("controller connect: %v", tk.Error())
	}
	defer c.Disconnect(100)
	if tk := c.Subscribe(reply, 1, nil); !tk.WaitTimeout(5*time.Second) || tk.Error() != nil {
		return stats{}, fmt.Errorf("controller subscribe: %v", tk.Error())
	}
	var (
		lat   = make([][]time.Duration, n)
		fails atomic.Int64
		wg    sync.WaitGroup
		end   = time.Now().Add(dur)
		warm  = time.Now().Add(dur / 10)
		count atomic.Int64
	)
	m.add("edge-bench", 0) // the controllers, and with -inprocess everything else
	meterStarted := make(chan struct{})
	go func() { time.Sleep(time.Until(warm)); m.begin(); close(meterStarted) }()
	for d := 0; d < n; d++ {
		wg.Add(1)
		go func(d int) {
			defer wg.Done()
			dev := fmt.Sprintf("d%d", d)
			for i := 0; time.Now().Before(end); i++ {
				op := fmt.Sprintf("%d-%d-%d", run, d, i)
				b, _ := json.Marshal(wire.Command{OpID: op, Fence: 1, Action: "set", ReplyTo: reply,
					Params: json.RawMessage(fmt.Sprintf(`{"seq":%d,"pad":"%s"}`, i, strings.Repeat("x", 120)))})
				done := make(chan struct{})
				mu.Lock()
				waiting[op] = done
				mu.Unlock()
				start := time.Now()
				c.Publish(wire.CmdTopic(wire.DefaultPrefix, gw, dev), 1, false, b)
				select {
				case <-done:
				case <-time.After(30 * time.Second):
					fails.Add(1)
					return
				}
				if start.After(warm) {
					lat[d] = append(lat[d], time.Since(start))
					count.Add(1)
				}
			}
		}(d)
	}
	wg.Wait()
	<-meterStarted
	cpu, cpuParts := m.perCommand(int(count.Load()))
	if f := fails.Load(); f > 0 {
		return stats{}, fmt.Errorf("%d commands got no Result within 30s", f)
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	if len(all) == 0 {
		return stats{}, fmt.Errorf("no command completed")
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	measured := dur - dur/10
	return stats{n: len(all), perSec: float64(len(all)) / measured.Seconds(),
		p50: all[len(all)/2], p99: all[len(all)*99/100], cpu: cpu, cpuParts: cpuParts, cpuNames: m.names}, nil
}

// startMosquitto runs mosquitto with the shipped configs/mosquitto.conf,
// its listener moved to a free loopback port and its data to dir
// (configs.LocalMosquittoConf, as the tests' mqtttest.StartMosquitto).
func startMosquitto(dir string) (string, int, func(), error) {
	bin := "/usr/sbin/mosquitto"
	if _, err := os.Stat(bin); err != nil {
		if bin, err = exec.LookPath("mosquitto"); err != nil {
			return "", 0, nil, fmt.Errorf("mosquitto not installed (apt-get install mosquitto)")
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", 0, nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	conf, err := configs.LocalMosquittoConf(port, dir, "stderr", os.Geteuid() == 0, "log_type error")
	if err != nil {
		return "", 0, nil, err
	}
	cp := filepath.Join(dir, "mosquitto.conf")
	if err := os.WriteFile(cp, conf, 0o600); err != nil {
		return "", 0, nil, err
	}
	cmd := exec.Command(bin, "-c", cp)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", 0, nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			return "", 0, nil, fmt.Errorf("mosquitto did not start on %s", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "tcp://" + addr, cmd.Process.Pid, func() { cmd.Process.Kill(); cmd.Wait() }, nil
}
