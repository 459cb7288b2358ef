package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/rig"
)

// The footprint mode (-footprint) measures what the agent costs a gateway's
// disk rather than its speed: bytes written per command, read from
// /proc/PID/io (write_bytes: what the process caused to be sent to the
// storage layer, counted when a page is dirtied), and the size of the store
// file once the commands are done, with the default retention (168h, keep
// 10,000 per device: nothing is old enough to be deleted in a run).

// footprintRow is one run of -footprint.
type footprintRow struct {
	broker        string // "mosquitto" or "embedded"
	devices       int
	commands      int
	agentBytes    float64 // write_bytes of the agent process per command
	agentWrites   float64 // write syscalls (syscw) of the agent per command
	brokerBytes   float64 // write_bytes of mosquitto per command (external broker only)
	storeBytes    int64   // agent.db's file size after the run (clean stop)
	storeUsed     int64   // agent.db's pages up to the highest in use (bbolt Tx.Size)
	compacted     int64   // agent.db after edge-agent compact
	brokerStore   int64   // data_dir/broker after the run (embedded only)
	perSec        float64
	took          time.Duration
	idleBytesPerS float64 // -idle: write_bytes per second of an idle agent with the watchdog on
	deviceBytes   float64 // -data-dir: bytes written to its block device per command; <0: not measured
	idleDevice    float64 // -data-dir and -idle: bytes per second written to it while idle
	peakRSS       int64   // the agent's VmHWM at the end, bytes
}

// procIO reads write_bytes and syscw of a process from /proc/PID/io.
func procIO(pid int) (writeBytes, syscw int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("/proc/%d/io: %w (needs task I/O accounting and the same user)", pid, err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ": ")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch k {
		case "write_bytes":
			writeBytes = n
		case "syscw":
			syscw = n
		}
	}
	return writeBytes, syscw, nil
}

// deviceWritten returns the bytes written so far to the block device that
// holds dir (/sys/dev/block/MAJ:MIN/stat, sectors written), for a data dir
// on a device of its own (a loop mount): it counts everything that reaches
// the device, the file system's journal included.
func deviceWritten(dir string) (int64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return 0, err
	}
	major, minor := (st.Dev>>8)&0xfff|(st.Dev>>32)&^0xfff, st.Dev&0xff|(st.Dev>>12)&^0xff
	b, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/stat", major, minor))
	if err != nil {
		return 0, fmt.Errorf("block device of %s: %w", dir, err)
	}
	f := strings.Fields(string(b))
	if len(f) < 7 {
		return 0, fmt.Errorf("block device of %s: stat %q", dir, b)
	}
	sectors, err := strconv.ParseInt(f[6], 10, 64)
	return sectors * 512, err
}

// peakRSS reads a process's peak resident set (VmHWM) from /proc/PID/status.
func peakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}

// dirSize is the total size of the regular files under dir.
func dirSize(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// runFootprint runs -footprint for each broker kind and device count.
func runFootprint(devList, brokers string, total int, idle time.Duration, dataDir, out string) error {
	tmp, err := os.MkdirTemp("", "edge-bench-footprint")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	runs := tmp
	if dataDir != "" {
		if runs, err = os.MkdirTemp(dataDir, "edge-bench-footprint"); err != nil {
			return err
		}
		defer os.RemoveAll(runs)
	}
	bins, err := buildBinaries(tmp)
	if err != nil {
		return err
	}
	var rows []footprintRow
	fmt.Printf("%-10s %8s %9s %12s %11s %13s %11s %11s %11s %8s\n", "broker", "devices", "commands", "agent B/cmd", "writes/cmd", "broker B/cmd", "agent.db", "in use", "compacted", "cmds/s")
	for _, kind := range strings.Split(brokers, ",") {
		for _, f := range strings.Split(devList, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 {
				return fmt.Errorf("-devices %q", devList)
			}
			name := fmt.Sprintf("%s-%d", kind, n)
			r, err := footprint(bins, filepath.Join(runs, name), filepath.Join(tmp, name), kind, n, total, idle, dataDir != "")
			if err != nil {
				return fmt.Errorf("footprint %s, %d devices: %w", kind, n, err)
			}
			rows = append(rows, r)
			fmt.Printf("%-10s %8d %9d %12.0f %11.2f %13s %11d %11d %11d %8.0f", r.broker, r.devices, r.commands, r.agentBytes,
				r.agentWrites, brokerCell(r), r.storeBytes, r.storeUsed, r.compacted, r.perSec)
			if r.deviceBytes >= 0 {
				fmt.Printf("   device %.0f B/cmd", r.deviceBytes)
			}
			if idle > 0 {
				fmt.Printf("   idle %.0f B/s (device %.0f B/s)", r.idleBytesPerS, r.idleDevice)
			}
			fmt.Printf("   peak RSS %s", mib(r.peakRSS))
			fmt.Println()
		}
	}
	if out == "" {
		return nil
	}
	fh, err := os.OpenFile(out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer fh.Close()
	dd := ""
	if dataDir != "" {
		dd = " -data-dir " + dataDir
	}
	fmt.Fprintf(fh, "\nFootprint, `go run ./cmd/edge-bench -footprint -brokers %s -devices %s -commands %d -idle %s%s`, %s:\n\n",
		brokers, devList, total, idle, dd, time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintln(fh, "| broker | devices | commands | agent write_bytes per command | agent write calls per command | mosquitto write_bytes per command | data dir's device, bytes per command | agent.db file | in use (per command) | compacted | embedded broker's files | cmds/s | idle agent, watchdog on | agent peak RSS |")
	fmt.Fprintln(fh, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		idleCell := ""
		if idle > 0 {
			idleCell = fmt.Sprintf("write_bytes %.0f B/s", r.idleBytesPerS)
			if r.deviceBytes >= 0 {
				idleCell += fmt.Sprintf(", device %.0f B/s", r.idleDevice)
			}
		}
		devCell := ""
		if r.deviceBytes >= 0 {
			devCell = fmt.Sprintf("%.0f", r.deviceBytes)
		}
		fmt.Fprintf(fh, "| %s | %d | %d | %.0f | %.2f | %s | %s | %s | %s (%.0f B) | %s | %s | %.0f | %s | %s |\n", r.broker, r.devices, r.commands,
			r.agentBytes, r.agentWrites, brokerCell(r), devCell, mib(r.storeBytes), mib(r.storeUsed), float64(r.storeUsed)/float64(r.commands+20*r.devices),
			mib(r.compacted), embeddedCell(r), r.perSec, idleCell, mib(r.peakRSS))
	}
	return nil
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func brokerCell(r footprintRow) string {
	if r.broker != "mosquitto" {
		return "(in the agent)"
	}
	return fmt.Sprintf("%.0f", r.brokerBytes)
}

func embeddedCell(r footprintRow) string {
	if r.broker != "embedded" {
		return ""
	}
	return mib(r.brokerStore)
}

// footprint runs one agent process on a fresh data dir (in dir; mosquitto's
// in brokerDir) with n devices and
// sends it total commands (n closed-loop controllers, one command in flight
// each), counting the agent's writes from after a warm-up of 20 commands
// per device.
func footprint(bins, dir, brokerDir, kind string, n, total int, idle time.Duration, ownDevice bool) (footprintRow, error) {
	r := footprintRow{broker: kind, devices: n, deviceBytes: -1}
	for _, d := range []string{dir, brokerDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return r, err
		}
	}
	var brokerURL, mqttYAML string
	var brokerPid int
	switch kind {
	case "mosquitto":
		// Its data stays off the measured device.
		url, pid, stop, err := startMosquitto(brokerDir)
		if err != nil {
			return r, err
		}
		defer stop()
		brokerURL, brokerPid = url, pid
		mqttYAML = fmt.Sprintf("  broker: %s\n", url)
	case "embedded":
		addr, err := rig.FreeAddr()
		if err != nil {
			return r, err
		}
		brokerURL = "tcp://" + addr
		mqttYAML = fmt.Sprintf("  broker: embedded\n  embedded_listen: %s\n", addr)
	default:
		return r, fmt.Errorf("-brokers: %q is neither mosquitto nor embedded", kind)
	}
	simURL, _, stopSim, err := startSimProcess(bins, n, &cpuMeter{}, false)
	if err != nil {
		return r, err
	}
	defer stopSim()
	admin, err := rig.FreeAddr()
	if err != nil {
		return r, err
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "gateway_id: %s\ndata_dir: %s\nmqtt:\n%s  client_id: edge-bench-footprint\nadmin:\n  listen: %q\ndevices:\n",
		gw, filepath.Join(dir, "data"), mqttYAML, admin)
	for i := 0; i < n; i++ {
		fmt.Fprintf(&cfg, "  - id: d%d\n    type: generic\n    driver: {url: %s, idempotent: true, queryable: true}\n", i, simURL)
	}
	cfgPath := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o600); err != nil {
		return r, err
	}
	env := agentEnv
	var notify net.PacketConn
	if idle > 0 {
		// systemd's watchdog as the unit sets it (WatchdogSec=30s): the
		// agent probes its store every 10 s when it is idle.
		sock := filepath.Join(dir, "notify")
		if notify, err = net.ListenPacket("unixgram", sock); err != nil {
			return r, err
		}
		defer notify.Close()
		go func() {
			buf := make([]byte, 512)
			for {
				if _, _, err := notify.ReadFrom(buf); err != nil {
					return
				}
			}
		}()
		env = append(slices.Clip(env), "NOTIFY_SOCKET="+sock, "WATCHDOG_USEC=30000000")
	}
	agent, err := rig.Start(rig.Options{Env: env, Stderr: os.Stderr}, filepath.Join(bins, "edge-agent"), "run", "--config", cfgPath, "--log-level", "warn")
	if err != nil {
		return r, err
	}
	stopped := false
	defer func() {
		if !stopped {
			agent.Stop(syscall.SIGTERM, 30*time.Second)
		}
	}()
	if err := waitReady(admin, 30*time.Second); err != nil {
		return r, err
	}
	if err := drive(brokerURL, n, 20*n, "warm"); err != nil {
		return r, err
	}
	w0, c0, err := procIO(agent.PID())
	if err != nil {
		return r, err
	}
	var b0 int64
	if brokerPid != 0 {
		if b0, _, err = procIO(brokerPid); err != nil {
			return r, err
		}
	}
	var d0 int64
	if ownDevice {
		if d0, err = deviceWritten(dir); err != nil {
			return r, err
		}
	}
	start := time.Now()
	if err := drive(brokerURL, n, total, "run"); err != nil {
		return r, err
	}
	r.took = time.Since(start)
	if ownDevice {
		d1, err := deviceWritten(dir)
		if err != nil {
			return r, err
		}
		r.deviceBytes = float64(d1-d0) / float64(total)
	}
	w1, c1, err := procIO(agent.PID())
	if err != nil {
		return r, err
	}
	if brokerPid != 0 {
		b1, _, err := procIO(brokerPid)
		if err != nil {
			return r, err
		}
		r.brokerBytes = float64(b1-b0) / float64(total)
	}
	r.commands = total
	r.agentBytes = float64(w1-w0) / float64(total)
	r.agentWrites = float64(c1-c0) / float64(total)
	r.perSec = float64(total) / r.took.Seconds()
	if idle > 0 {
		// Wait for the Results' outbox deletions (store.Later, within 1 s)
		// and the op index flush to settle, then count an idle stretch.
		time.Sleep(3 * time.Second)
		i0, _, err := procIO(agent.PID())
		if err != nil {
			return r, err
		}
		var d0 int64
		if ownDevice {
			if d0, err = deviceWritten(dir); err != nil {
				return r, err
			}
		}
		time.Sleep(idle)
		i1, _, err := procIO(agent.PID())
		if err != nil {
			return r, err
		}
		r.idleBytesPerS = float64(i1-i0) / idle.Seconds()
		if ownDevice {
			d1, err := deviceWritten(dir)
			if err != nil {
				return r, err
			}
			r.idleDevice = float64(d1-d0) / idle.Seconds()
		}
	}
	if r.peakRSS, err = peakRSS(agent.PID()); err != nil {
		return r, err
	}
	stopped = true
	agent.Stop(syscall.SIGTERM, 30*time.Second)
	if code, _ := agent.Wait(time.Second); code != 0 {
		return r, fmt.Errorf("edge-agent exit %d on SIGTERM", code)
	}
	fi, err := os.Stat(filepath.Join(dir, "data", "agent.db"))
	if err != nil {
		return r, err
	}
	r.storeBytes = fi.Size()
	r.brokerStore = dirSize(filepath.Join(dir, "data", "broker"))
	db, err := bolt.Open(filepath.Join(dir, "data", "agent.db"), 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return r, err
	}
	db.View(func(tx *bolt.Tx) error { r.storeUsed = tx.Size(); return nil })
	db.Close()
	to := filepath.Join(dir, "compacted.db")
	if b, err := exec.Command(filepath.Join(bins, "edge-agent"), "compact", "--data-dir", filepath.Join(dir, "data"), "--to", to).CombinedOutput(); err != nil {
		return r, fmt.Errorf("edge-agent compact: %v: %s", err, b)
	}
	if fi, err = os.Stat(to); err != nil {
		return r, err
	}
	r.compacted = fi.Size()
	return r, nil
}

func waitReady(admin string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("edge-agent not ready on %s within %s", admin, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// drive sends total commands to devices d0..d(n-1), n controllers with one
// command in flight each (the next only after the previous one's final
// Result), and returns once every one has its Result.
func drive(broker string, n, total int, tag string) error {
	run := fmt.Sprintf("%s-%d", tag, time.Now().UnixNano())
	reply := "bench/reply/" + run
	ctl, err := dialControllers(broker, "edge-bench-fp-"+run, reply, 10*time.Second)
	if err != nil {
		return err
	}
	defer ctl.close()
	var next atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	for d := 0; d < n; d++ {
		wg.Add(1)
		go func(d int) {
			defer wg.Done()
			dev := fmt.Sprintf("d%d", d)
			for i := 0; next.Add(1) <= int64(total); i++ {
				op := fmt.Sprintf("%s-%d-%d", run, d, i)
				b, _ := json.Marshal(wire.Command{OpID: op, Fence: 1, Action: "set", ReplyTo: reply,
					Params: json.RawMessage(fmt.Sprintf(`{"seq":%d,"pad":"%s"}`, i, strings.Repeat("x", 120)))})
				if !ctl.send(op, wire.CmdTopic(wire.DefaultPrefix, gw, dev), b, 60*time.Second) {
					failed.Add(1)
					return
				}
			}
		}(d)
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		return fmt.Errorf("%d commands got no Result within 60s", f)
	}
	return nil
}
