// Command edge-bench is the end-to-end benchmark of `make bench`: for 1, 8
// and 64 devices (-devices) it measures commands per second and p50/p99 latency from
// publishing a command to receiving its Result through a real mosquitto
// (started with configs/mosquitto.conf), for edge-agent, for an echo
// baseline that answers each command without doing anything (same broker,
// same client library), and for a device-echo that only forwards each
// command to firmware-sim before answering; it prints the ratios and the
// CPU every process spent per command. Each device's controller keeps one
// command in flight, as an owner does (docs/design.md: the next command only
// after the previous one has its final Result). Then, for 1 and 8 devices
// (-modbus-devices), it measures edge-agent with the same commands over
// HTTP, over Modbus TCP and over Modbus TCP with verify: readback
// (modbus.go). A further target, agent-signed, is edge-agent requiring
// signed commands (docs/protocol.md §6), the controllers signing each one,
// to compare with the unsigned run.
//
// With -footprint it measures the disk instead (footprint.go): bytes the
// agent process writes per command (/proc/PID/io write_bytes), with
// mosquitto or the embedded broker, and the store file's size after
// -commands commands with the default retention; -idle adds an idle stretch
// with systemd's watchdog on (its store probe's writes).
//
// With -coordination it measures what coordination.etcd costs instead
// (coordination.go): the agent's CPU per command at the largest -devices
// count with and without it, alternating runs, and its start-up time to
// ready on a new store and on a restart, with and without it.
//
// With -takeover it measures a standby pair (ha.go, docs/protocol.md §8):
// the takeover time after the active is SIGKILLed or SIGSTOPped, for each
// -session-ttl, and the agent's CPU per command as the active of a pair
// against single, and the standby's CPU while it waits.
package main

import (
	"context"
	"crypto/ed25519"
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
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/app"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/device"
	"github.com/edge-agent/edge-agent/internal/mqtt"
	"github.com/edge-agent/edge-agent/internal/rig"
)

const gw = "bench"

func main() {
	dur := flag.Duration("duration", 5*time.Second, "measuring time per run")
	devs := flag.String("devices", "1,8,64", "device counts")
	mbDevs := flag.String("modbus-devices", "1,8", "device counts of the Modbus table: edge-agent over HTTP, over Modbus TCP, and over Modbus TCP with verify: readback, with the same commands (\"\": none)")
	out := flag.String("out", "", "append a Markdown table to this file")
	prof := flag.String("cpuprofile", "", "write a CPU profile of this process here (with -inprocess: of everything but mosquitto)")
	tableOf := flag.String("profile-table", "", "print the agent's CPU per command by component from this CPU profile (one written with -inprocess -cpuprofile, by this or an earlier edge-bench) and exit; with -profile-commands")
	tableN := flag.Int("profile-commands", 0, "with -profile-table: how many commands the agent answered while the profile ran")
	tableLabel := flag.String("profile-target", "edge-agent", "with -profile-table: the target whose samples are counted (edge-agent, agent-signed, ...)")
	comps := flag.Bool("components", false, "with -inprocess -cpuprofile: after the runs, print the agent's CPU per command by component, from the profile (run one device count, e.g. -devices 64)")
	inproc := flag.Bool("inprocess", false, "run the agent, the firmware simulator and the echo inside this process (for CPU profiles) instead of as processes of their own")
	flag.Func("agent-env", "KEY=VALUE added to the edge-agent process's environment, e.g. GOGC=200 (repeatable; not with -inprocess)", func(kv string) error {
		if !strings.Contains(kv, "=") {
			return fmt.Errorf("%q: want KEY=VALUE", kv)
		}
		agentEnv = append(agentEnv, kv)
		return nil
	})
	browser := flag.String("browser", "auto", "the status-page run: auto (an installed Chromium, else page), a Chromium path, page (the page's requests from Go, no browser), off")
	browserRounds := flag.Int("browser-rounds", 3, "rounds of the agent without and with a browser open (alternating)")
	fp := flag.Bool("footprint", false, "measure bytes written per command and the store's size instead of speed (footprint.go)")
	fpBrokers := flag.String("brokers", "mosquitto,embedded", "with -footprint: the brokers to run with (mosquitto, embedded)")
	fpCommands := flag.Int("commands", 20000, "with -footprint: commands per run, after a warm-up of 20 per device")
	fpIdle := flag.Duration("idle", 0, "with -footprint: then measure the agent idle for this long, watchdog on (WATCHDOG_USEC=30s)")
	fpData := flag.String("data-dir", "", "with -footprint: put the agents' data here, on a block device nothing else writes to (a loop mount), and count the bytes that reach it")
	coord := flag.Bool("coordination", false, "measure the agent with coordination.etcd (one etcd member) against without: CPU per command at the largest -devices count, alternating runs, and start-up time to ready (coordination.go)")
	coordRounds := flag.Int("coordination-rounds", 3, "with -coordination: rounds of each")
	takeover := flag.Bool("takeover", false, "measure a standby pair instead (ha.go): takeover time after the active is SIGKILLed or SIGSTOPped, then the agent's CPU per command as the active of a pair against single, at the largest -devices count")
	takeoverRuns := flag.Int("takeover-runs", 20, "with -takeover: takeovers per session_ttl and fault")
	takeoverTTLs := flag.String("session-ttl", "3s,10s", "with -takeover: the session_ttl values to run")
	takeoverFaults := flag.String("takeover-faults", "kill,stop", "with -takeover: the faults of the active (kill: SIGKILL, stop: SIGSTOP)")
	takeoverDevs := flag.Int("takeover-devices", 8, "with -takeover: devices of the takeover runs (each takes the floor)")
	takeoverCPU := flag.Int("takeover-cpu-rounds", 3, "with -takeover: rounds of single against active (0: none)")
	takeoverIdle := flag.Duration("takeover-idle", 30*time.Second, "with -takeover: then the pair's CPU idle, over this long (0: none)")
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
	if *tableOf != "" {
		if err := componentTableOf(os.Stdout, *tableOf, *tableLabel, *tableN); err != nil {
			fmt.Fprintln(os.Stderr, "edge-bench:", err)
			os.Exit(1)
		}
		return
	}
	if *fpPlugins { // plugins_footprint.go
		if err := runFootprintPlugins(); err != nil {
			fmt.Fprintln(os.Stderr, "edge-bench:", err)
			os.Exit(1)
		}
		return
	}
	if *coord { // coordination.go
		n := 0
		for _, f := range splitList(*devs) {
			var k int
			fmt.Sscan(f, &k)
			n = max(n, k)
		}
		if err := runCoordination(*dur, n, *coordRounds, *out); err != nil {
			fmt.Fprintln(os.Stderr, "edge-bench:", err)
			os.Exit(1)
		}
		return
	}
	if *fleetOn { // fleet.go
		if err := runFleet(*dur, *out); err != nil {
			fmt.Fprintln(os.Stderr, "edge-bench:", err)
			os.Exit(1)
		}
		return
	}
	if *takeover { // ha.go
		o := takeoverOpts{runs: *takeoverRuns, devices: *takeoverDevs, cpuRounds: *takeoverCPU, idle: *takeoverIdle, dur: *dur, out: *out}
		var err error
		if o.ttls, err = parseDurations(*takeoverTTLs); err == nil {
			o.faults, err = parseFaults(*takeoverFaults)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "edge-bench:", err)
			os.Exit(2)
		}
		for _, f := range splitList(*devs) {
			var k int
			fmt.Sscan(f, &k)
			o.cpuN = max(o.cpuN, k)
		}
		if err := runTakeover(o); err != nil {
			fmt.Fprintln(os.Stderr, "edge-bench:", err)
			os.Exit(1)
		}
		return
	}
	if *fp { // footprint.go
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
	if *comps && (*prof == "" || !*inproc) {
		fmt.Fprintln(os.Stderr, "edge-bench: -components needs -inprocess and -cpuprofile")
		os.Exit(2)
	}
	browserBin, browserN = chromiumPath(*browser), *browserRounds
	if err := run(*dur, *devs, *mbDevs, *out); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "edge-bench:", err)
		os.Exit(1)
	}
	if *comps {
		pprof.StopCPUProfile()
		fmt.Printf("\nThe agent's CPU per command by component (%d commands, from %s):\n\n", agentCommands, *prof)
		if err := componentTable(os.Stdout, *prof, agentCommands); err != nil {
			fmt.Fprintln(os.Stderr, "edge-bench:", err)
			os.Exit(1)
		}
	}
}

// agentCommands counts the commands the agent answered in the measured
// windows (for -components).
var agentCommands int

// inProcess: everything in this process (-inprocess); otherwise the echo,
// the agent and the firmware simulator each run as a process of their own,
// as they would be deployed, and this process is the load generator.
var inProcess bool

// agentEnv is added to the edge-agent process's environment (-agent-env).
var agentEnv []string

// browserBin is the Chromium of the status-page run ("": skipped), and
// browserN its rounds (-browser, -browser-rounds).
var (
	browserBin string
	browserN   int
)

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

func run(dur time.Duration, devList, mbList, out string) error {
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
	fl, err := measureFloor(tmp, 300)
	if err != nil {
		return err
	}
	fmt.Println(fl)
	var floorLine string
	var rows, signedRows []string
	fmt.Printf("%-8s %-12s %10s %9s %9s\n", "devices", "target", "cmds/s", "p50", "p99")
	for _, f := range splitList(devList) {
		var n int
		fmt.Sscan(f, &n)
		var res [agentSignedKind + 1]stats
		for _, k := range []kind{echoKind, deviceEchoKind, agentKind, agentSignedKind} {
			var err error
			// Labelled, so a CPU profile separates the runs: go tool
			// pprof -tagfocus target=edge-agent.
			pprof.Do(context.Background(), pprof.Labels("target", k.String()), func(context.Context) {
				res[k], err = measure(broker, n, dur, target{bins: bins, kind: k, dir: filepath.Join(tmp, fmt.Sprintf("%s-%d", k, n))})
			})
			if err != nil {
				return fmt.Errorf("%s, %d devices: %w", k, n, err)
			}
			r := res[k]
			if k == agentKind {
				agentCommands += r.n
			}
			ratio := ""
			switch k {
			case agentKind:
				ratio = fmt.Sprintf("   ratio %.2f of echo, %.2f of device-echo", r.perSec/res[echoKind].perSec, r.perSec/res[deviceEchoKind].perSec)
				if n == 1 {
					floorLine = fmt.Sprintf("At 1 device the agent's p50 %s is %.2f times the %s.", r.p50.Round(time.Microsecond), float64(r.p50)/float64(fl.total()), fl)
					ratio += fmt.Sprintf(", p50 %.2f x the floor", float64(r.p50)/float64(fl.total()))
				}
			case agentSignedKind:
				u, sg := agentCPU(res[agentKind]), agentCPU(r)
				ratio = fmt.Sprintf("   %.2f of unsigned; agent CPU %d vs %d µs per command (+%d µs, %.0f%%)",
					r.perSec/res[agentKind].perSec, sg.Microseconds(), u.Microseconds(), (sg - u).Microseconds(), 100*float64(sg-u)/float64(sg))
			}
			fmt.Printf("%-8d %-12s %10.0f %9s %9s%s\n         %s\n", n, k, r.perSec, r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), ratio, r.cpu)
		}
		e, de, ag := res[echoKind], res[deviceEchoKind], res[agentKind]
		rows = append(rows, fmt.Sprintf("| %d | %.0f | %s | %.0f | %s | %.0f | %s | %s | **%.2f** | %.2f |", n,
			e.perSec, e.p50.Round(time.Microsecond), de.perSec, de.p50.Round(time.Microsecond),
			ag.perSec, ag.p50.Round(time.Microsecond), ag.p99.Round(time.Microsecond),
			ag.perSec/e.perSec, ag.perSec/de.perSec))
		rows = append(rows, fmt.Sprintf("|  | %s | | %s | | %s | | | | |", cpuCell(e), cpuCell(de), cpuCell(ag)))
		sg := res[agentSignedKind]
		u, sc := agentCPU(ag), agentCPU(sg)
		signedRows = append(signedRows, fmt.Sprintf("| %d | %.0f | %s | %s | %.0f | %s | %s | %.2f | %d | %d | %+d (%.0f%% of the signed run's) |", n,
			ag.perSec, ag.p50.Round(time.Microsecond), ag.p99.Round(time.Microsecond),
			sg.perSec, sg.p50.Round(time.Microsecond), sg.p99.Round(time.Microsecond), sg.perSec/ag.perSec,
			u.Microseconds(), sc.Microseconds(), (sc-u).Microseconds(), 100*float64(sc-u)/float64(sc)))
	}
	// The status page's cost under load: the agent at the largest device
	// count, without and with one browser open on GET / (its live feed
	// and its polling), alternating.
	var browserRow string
	if browserBin != "" && browserN > 0 && len(splitList(devList)) > 0 {
		var n int
		for _, f := range splitList(devList) {
			var k int
			fmt.Sscan(f, &k)
			n = max(n, k)
		}
		if browserRow, err = browserCost(broker, n, dur, bins, filepath.Join(tmp, "browser"), browserBin, browserN); err != nil {
			return err
		}
	} else {
		fmt.Println("status-page run skipped: no Chromium (-browser), or no -devices")
	}
	mbRows, err := runModbus(broker, bins, tmp, dur, mbList)
	if err != nil {
		return err
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
		if len(rows) > 0 {
			fmt.Fprintf(f, "\nEnd to end through mosquitto (%s), %s per run, `go run ./cmd/edge-bench%s -duration %s -devices %s`, %s:\n\n", how, dur, flags, dur, devList, time.Now().UTC().Format("2006-01-02"))
			fmt.Fprintln(f, "| devices | echo cmds/s | echo p50 | device-echo cmds/s | device-echo p50 | agent cmds/s | agent p50 | agent p99 | agent/echo | agent/device-echo |")
			fmt.Fprintln(f, "|---|---|---|---|---|---|---|---|---|---|")
			for _, r := range rows {
				fmt.Fprintln(f, r)
			}
		}
		if floorLine != "" {
			fmt.Fprintln(f, "\n"+floorLine)
		}
		if browserRow != "" {
			fmt.Fprintf(f, "\nThe agent without and with the status page open (`-browser-rounds %d`, alternating runs):\n\n", browserN)
			fmt.Fprintln(f, "| open | devices | cmds/s without | cmds/s with | median without | median with | with/without | agent CPU per command without / with |")
			fmt.Fprintln(f, "|---|---|---|---|---|---|---|---|")
			fmt.Fprintln(f, browserRow)
		}
		if len(signedRows) > 0 {
			fmt.Fprintf(f, "\nSigned commands required (the controllers sign; docs/protocol.md §6) against the same run unsigned, same command:\n\n")
			fmt.Fprintln(f, "| devices | unsigned cmds/s | p50 | p99 | signed cmds/s | p50 | p99 | signed/unsigned | agent CPU unsigned µs/cmd | signed µs/cmd | added |")
			fmt.Fprintln(f, "|---|---|---|---|---|---|---|---|---|---|---|")
			for _, r := range signedRows {
				fmt.Fprintln(f, r)
			}
		}
		writeModbusTable(f, how, flags, dur, mbList, mbRows)
	}
	return nil
}

// agentCPU is the edge-agent process's CPU per command in a run (with
// -inprocess, everything's: the meter then has one process for all).
func agentCPU(st stats) time.Duration {
	for i, name := range st.cpuNames {
		if name == "edge-agent" && i < len(st.cpuParts) {
			return st.cpuParts[i]
		}
	}
	if len(st.cpuParts) > 0 {
		return st.cpuParts[len(st.cpuParts)-1]
	}
	return 0
}

// agentTarget runs edge-agent in-process against the broker, with a
// firmware simulator for its devices (-inprocess).
type agentTarget struct {
	dir     string
	kind    kind
	keyFile string // "": signatures not required
	admin   string // "" none; "127.0.0.1:0" for the status-page run
	a       *app.App
	fw      *sim.Sim
}

func (t *agentTarget) start(broker string, n int) error {
	var err error
	if t.fw, err = startSimInProcess(n); err != nil {
		return err
	}
	yaml := agentYAML(t.dir, broker, t.admin, t.fw.URL(), t.keyFile, n)
	if t.kind.modbus() {
		if err := t.fw.StartModbus("127.0.0.1:0"); err != nil {
			return err
		}
		yaml = modbusYAML(t.dir, broker, "", t.fw.ModbusAddr(), n, t.kind == agentReadBackKind)
	}
	cfg, err := config.Parse([]byte(yaml))
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
		fmt.Fprintf(os.Stderr, "bbolt: %.1f pages/commit\n", float64(st.Pages)/float64(st.Commits))
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
func agentYAML(dataDir, broker, admin, simURL, keyFile string, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "gateway_id: %s\ndata_dir: %s\nmqtt:\n  broker: %s\n  client_id: edge-bench-%d\nadmin:\n  listen: %q\n", gw, dataDir, broker, n, admin)
	if keyFile != "" { // signatures required (docs/protocol.md §6)
		fmt.Fprintf(&b, "security:\n  keys:\n    - {id: bench, public_key_file: %q}\n", keyFile)
	}
	b.WriteString("devices:\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - id: d%d\n    type: generic\n    driver: {url: %s, idempotent: true, queryable: true}\n", i, simURL)
	}
	return b.String()
}

// startSimInProcess runs a firmware simulator of n generic devices d0.. in
// this process.
func startSimInProcess(n int) (*sim.Sim, error) {
	types, units := map[string]string{}, map[string]int{}
	for i := 0; i < n; i++ {
		types[fmt.Sprintf("d%d", i)] = "generic"
		units[fmt.Sprintf("d%d", i)] = i + 1
	}
	fw, err := sim.New(sim.Options{Devices: types, Units: units})
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
	// small: the commands carry {"v":N} (a register's value) instead of
	// {"seq":N,"pad":"x..."}, so the same commands suit HTTP and Modbus.
	small bool
	// withBrowser: the agent runs with a Chromium (browser) open on its
	// status page.
	browser     string
	withBrowser bool
	// fence is the commands' fence (0: 1); coordination, when set, is
	// the etcd endpoint of the agent's coordination.etcd (-coordination).
	fence        int64
	coordination string
	// ha: the agent is the active of a pair, its standby running (-takeover,
	// ha.go); ttl, when set, is coordination.etcd.session_ttl.
	ha  bool
	ttl time.Duration
}

// kind is what answers the commands.
type kind int

const (
	echoKind          kind = iota // answers at once
	deviceEchoKind                // forwards each command to firmware-sim, then answers
	agentKind                     // edge-agent
	agentModbusKind               // edge-agent, its devices over Modbus TCP
	agentReadBackKind             // edge-agent, over Modbus TCP with verify: readback
	agentSignedKind               // edge-agent requiring signed commands, which the controllers sign
)

func (k kind) String() string {
	return [...]string{"echo", "device-echo", "edge-agent", "agent-modbus", "agent-mb-rb", "agent-signed"}[k]
}

// benchKey signs the controllers' commands in the agent-signed runs; its
// public key is the agent's one security.keys entry ("bench").
var benchKey = ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))

// writeBenchKey writes benchKey's public key into dir for the agent.
func writeBenchKey(dir string) (string, error) {
	_, pub, err := jws.MarshalKeys(benchKey, benchKey.Public().(ed25519.PublicKey))
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	f := filepath.Join(dir, "bench.pub")
	return f, os.WriteFile(f, pub, 0o644)
}

func (k kind) modbus() bool { return k == agentModbusKind || k == agentReadBackKind }

func (t target) start(broker string, n int, m *cpuMeter) (func(), error) {
	keyFile := ""
	if t.kind == agentSignedKind {
		var err error
		if keyFile, err = writeBenchKey(t.dir); err != nil {
			return nil, err
		}
	}
	agentish := t.kind == agentKind || t.kind == agentSignedKind || t.kind.modbus()
	switch {
	case inProcess && agentish:
		at := &agentTarget{dir: t.dir, kind: t.kind, keyFile: keyFile}
		if t.withBrowser {
			at.admin = "127.0.0.1:0"
		}
		if err := at.start(broker, n); err != nil {
			return nil, err
		}
		if t.withBrowser {
			return t.openBrowser(at.a.AdminAddr(), at.stop)
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
	case agentish && t.ha:
		p, err := startHAPair(t.bins, t.dir, broker, t.coordination, t.ttl, n, m)
		if err != nil {
			return nil, err
		}
		return p.stop, nil
	case agentish:
		extra := coordYAML(t.coordination)
		if t.ttl > 0 && t.coordination != "" {
			extra = coordTTLYAML(t.coordination, t.ttl)
		}
		stop, admin, err := startAgentProcesses(t.bins, t.dir, broker, keyFile, extra, n, m, t.kind)
		if err != nil || !t.withBrowser {
			return stop, err
		}
		return t.openBrowser(admin, stop)
	case t.kind == deviceEchoKind:
		url, _, stopSim, err := startSimProcess(t.bins, n, m, false)
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
	// The controllers run under a label of their own, so a CPU profile
	// (-inprocess) tells the target's work from the load generator's
	// (their MQTT clients are the same library as the agent's).
	var st stats
	pprof.Do(context.Background(), pprof.Labels("target", "load-generator"), func(context.Context) {
		st, err = generate(broker, n, dur, t, m)
	})
	return st, err
}

// generate runs n closed-loop controllers against the target for dur.
func generate(broker string, n int, dur time.Duration, t target, m *cpuMeter) (stats, error) {
	run := time.Now().UnixNano()
	reply := fmt.Sprintf("bench/reply/%d", run)
	ctl, err := dialControllers(broker, fmt.Sprintf("edge-bench-ctl-%d", run), reply, 5*time.Second)
	if err != nil {
		return stats{}, err
	}
	defer ctl.close()
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
				params := fmt.Sprintf(`{"seq":%d,"pad":"%s"}`, i, strings.Repeat("x", 120))
				if t.small {
					params = fmt.Sprintf(`{"v":%d}`, i%60000)
				}
				c := wire.Command{OpID: op, Fence: max(t.fence, 1), Action: "set", ReplyTo: reply, Params: json.RawMessage(params)}
				if t.kind == agentSignedKind {
					exp := time.Now().Add(time.Minute).UTC()
					c.Gateway, c.Device, c.ExpiresAt = gw, dev, &exp
				}
				b, _ := json.Marshal(c)
				if t.kind == agentSignedKind {
					// Signed here, in the load generator: the agent's CPU
					// is what the comparison is about.
					b, _ = jws.Sign(benchKey, "bench", b)
				}
				start := time.Now()
				if !ctl.send(op, wire.CmdTopic(wire.DefaultPrefix, gw, dev), b, 30*time.Second) {
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
	st, err := latencies(lat, dur-dur/10)
	if err != nil {
		return stats{}, err
	}
	st.cpu, st.cpuParts, st.cpuNames = cpu, cpuParts, m.names
	return st, nil
}

// latencies sums up the latencies of a run's devices, measured over
// measured: the count, commands per second, p50 and p99.
func latencies(lat [][]time.Duration, measured time.Duration) (stats, error) {
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	if len(all) == 0 {
		return stats{}, fmt.Errorf("no command completed")
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	return stats{n: len(all), perSec: float64(len(all)) / measured.Seconds(),
		p50: all[len(all)/2], p99: all[len(all)*99/100]}, nil
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
	port, err := rig.FreePort()
	if err != nil {
		return "", 0, nil, err
	}
	conf, err := configs.LocalMosquittoConf(port, dir, "stderr", os.Geteuid() == 0, "log_type error")
	if err != nil {
		return "", 0, nil, err
	}
	cp := filepath.Join(dir, "mosquitto.conf")
	if err := os.WriteFile(cp, conf, 0o600); err != nil {
		return "", 0, nil, err
	}
	p, err := rig.Start(rig.Options{Stderr: os.Stderr}, bin, "-c", cp)
	if err != nil {
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
			p.Kill()
			return "", 0, nil, fmt.Errorf("mosquitto did not start on %s", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "tcp://" + addr, p.PID(), p.Kill, nil
}
