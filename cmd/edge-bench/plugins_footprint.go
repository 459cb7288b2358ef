package main

// -footprint-plugins: the agent's memory and start-up with the five
// example Go plugins bound to six devices (configs/agent-policies.yaml),
// as a process of its own against mosquitto and firmware-sim
// (BENCHMARKS.md, "Policy plugins: footprint and start-up").
//
// For each variant (a lever against the baseline, in the same run) the
// plugins are built with the variant's flags, the agent starts on an empty
// data directory (cold: nothing compiled yet), answers -fp-commands
// commands spread over the six devices, and its peak RSS (VmHWM) is read
// from /proc; then it is stopped and started again on the same data
// directory (warm: the compilation cache is there), answers as many
// commands again, and is read again. Start-up is the time from starting
// the process to the first 200 of /healthz and of /readyz.

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/edge-agent/edge-agent/configs"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/rig"
)

var (
	fpPlugins  = flag.Bool("footprint-plugins", false, "measure the agent's peak RSS (VmHWM) and start-up with the five example Go plugins bound to six devices (configs/agent-policies.yaml), cold and warm, for each variant of -fp-variants; then exit")
	fpCommands = flag.Int("fp-commands", 10000, "with -footprint-plugins: commands per start, spread over the six devices")
	fpVariants = flag.String("fp-variants", "", "with -footprint-plugins: the variants to run, comma-separated (\"\": all; -fp-variants list prints them)")
)

// fpVariant is one configuration of the agent and its plugins.
type fpVariant struct {
	name string
	what string
	// env is added to the agent process's environment.
	env []string
	// ldflags for the Go plugins' build ("": none).
	ldflags string
	// limits is a policy.limits YAML flow mapping added to every binding
	// ("": none).
	limits string
	// oneModule binds range-limit to all six devices, each with a config
	// of its own: six pools of one compiled Go module, the memory shape of
	// one module that holds several policies.
	oneModule bool
	// noPlugins unbinds every plugin: the agent's own footprint.
	noPlugins bool
}

var fpAll = []fpVariant{
	{name: "baseline", what: "as shipped"},
	{name: "no-plugins", what: "no plugin bound: the agent's own footprint under the same commands", noPlugins: true},
	{name: "gogc50", what: "the agent with GOGC=50", env: []string{"GOGC=50"}},
	{name: "memlimit40", what: "the agent with GOMEMLIMIT=40MiB (a soft limit: the GC works harder near it)", env: []string{"GOMEMLIMIT=40MiB"}},
	{name: "stripped", what: "plugins built with -ldflags='-s -w' (no symbol table, no DWARF)", ldflags: "-s -w"},
	{name: "mem16", what: "policy.limits.memory_mib: 16 on every binding", limits: "{memory_mib: 16}"},
	{name: "one-module", what: "range-limit bound to all six devices, six configs: one Go module instead of five", oneModule: true},
	{name: "one-module-gogc50", what: "one-module, and the agent with GOGC=50", oneModule: true, env: []string{"GOGC=50"}},
}

// oneModuleBindings replace the other plugins' bindings for one-module,
// with configs that decide the same commands much as they did.
var oneModuleBindings = []struct{ old, new string }{
	{"plugin: allowlist\n      config: {actions: [toggle]}", "plugin: range-limit\n      config: {param: on, min: 0, max: 1}"},
	{"plugin: ramp-limit\n      config: {param: rpm, max_step: 200}", "plugin: range-limit\n      config: {param: rpm, min: 0, max: 200}"},
	{"plugin: interlock\n      config: {pump: pump-1, valve: valve-2}", "plugin: range-limit\n      config: {param: open, min: 0, max: 0}"},
	{"plugin: time-window\n      config: {actions: [flush], start: \"22:00\", end: \"06:00\"}", "plugin: range-limit\n      config: {param: speed, min: 0, max: 9}"},
}

// fpResult is one start of one variant.
type fpResult struct {
	healthz, readyz time.Duration
	states          []string // what /readyz said while not ready, in order
	hwm, rss, anon  int64    // KiB, after the commands
	code            int64    // KiB of anonymous executable mappings: wazero's native code
	cmdsPerSec      float64
}

func runFootprintPlugins() error {
	var vs []fpVariant
	if *fpVariants == "list" {
		for _, v := range fpAll {
			fmt.Printf("%-14s %s\n", v.name, v.what)
		}
		return nil
	}
	for _, v := range fpAll {
		if *fpVariants == "" || containsWord(*fpVariants, v.name) {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return fmt.Errorf("-fp-variants %q: no such variant (-fp-variants list)", *fpVariants)
	}
	tmp, err := os.MkdirTemp("", "edge-bench-fp")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	broker, _, stopBroker, err := startMosquitto(tmp)
	if err != nil {
		return err
	}
	defer stopBroker()
	bins, err := buildBinaries(tmp)
	if err != nil {
		return err
	}
	url, stopSim, err := startPoliciesSim(bins)
	if err != nil {
		return err
	}
	defer stopSim()

	var rows []string
	fmt.Printf("%d commands per start over the six devices of configs/agent-policies.yaml; RSS in MiB\n", *fpCommands)
	fmt.Printf("%-17s %-5s %9s %9s %8s %8s %8s %8s %9s %9s %s\n", "variant", "start", "healthz", "readyz", "VmHWM", "VmRSS", "RssAnon", "code", "cmds/s", "cache", "plugins")
	for i, v := range vs {
		dir := filepath.Join(tmp, fmt.Sprintf("v%d-%s", i, v.name))
		plugins, size, err := buildPluginsFor(dir, v.ldflags)
		if err != nil {
			return fmt.Errorf("%s: %w", v.name, err)
		}
		for _, start := range []string{"cold", "warm"} {
			r, err := footprintRun(bins, dir, broker, url, plugins, v, i, start)
			if err != nil {
				return fmt.Errorf("%s, %s start: %w", v.name, start, err)
			}
			fmt.Printf("%-17s %-5s %9s %9s %8.1f %8.1f %8.1f %8.1f %9.0f %8.1fM %.1fM\n", v.name, start,
				r.healthz.Round(time.Millisecond), r.readyz.Round(time.Millisecond),
				float64(r.hwm)/1024, float64(r.rss)/1024, float64(r.anon)/1024, float64(r.code)/1024, r.cmdsPerSec,
				float64(treeSize(filepath.Join(dir, "data", "wazero-cache")))/(1<<20), float64(size)/(1<<20))
			if start == "cold" && len(r.states) > 0 {
				fmt.Printf("%-17s       /readyz said: %s\n", "", strings.Join(r.states, " | "))
			}
			rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s | **%.1f** | %.1f | %.1f | %.1f | %.0f | %.1f MiB |", v.name, start,
				r.healthz.Round(time.Millisecond), r.readyz.Round(time.Millisecond), float64(r.hwm)/1024, float64(r.rss)/1024,
				float64(r.anon)/1024, float64(r.code)/1024, r.cmdsPerSec, float64(treeSize(filepath.Join(dir, "data", "wazero-cache")))/(1<<20)))
		}
	}
	if f := flag.Lookup("out"); f != nil && f.Value.String() != "" {
		return appendFootprintTable(f.Value.String(), vs, rows)
	}
	return nil
}

// appendFootprintTable appends the run's table in Markdown (-out).
func appendFootprintTable(path string, vs []fpVariant, rows []string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(f, "\n`go run ./cmd/edge-bench -footprint-plugins -fp-commands %d`, %s: the agent as a process against mosquitto and firmware-sim, the devices and plugins of configs/agent-policies.yaml, %d commands per start; memory from /proc/PID/status after them (MiB); start-up from starting the process to the first 200:\n\n",
		*fpCommands, time.Now().UTC().Format("2006-01-02"), *fpCommands)
	for _, v := range vs {
		fmt.Fprintf(f, "- `%s`: %s\n", v.name, v.what)
	}
	fmt.Fprintln(f, "\n| variant | start | /healthz | /readyz | VmHWM | VmRSS | RssAnon | of it, native code | cmds/s | compilation cache |")
	fmt.Fprintln(f, "|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Fprintln(f, r)
	}
	return f.Close()
}

func containsWord(list, w string) bool {
	for _, f := range strings.Split(list, ",") {
		if strings.TrimSpace(f) == w {
			return true
		}
	}
	return false
}

// buildPluginsFor builds the five example Go plugins into dir/plugins with
// the given -ldflags; it returns the directory and their total size.
func buildPluginsFor(dir, ldflags string) (string, int64, error) {
	out := filepath.Join(dir, "plugins")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", 0, err
	}
	var total int64
	for _, p := range []string{"range-limit", "ramp-limit", "interlock", "allowlist", "time-window"} {
		args := []string{"build", "-buildmode=c-shared"}
		if ldflags != "" {
			args = append(args, "-ldflags="+ldflags)
		}
		f := filepath.Join(out, p+".wasm")
		args = append(args, "-o", f, "./plugins/"+p)
		cmd := exec.Command("go", args...)
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", 0, fmt.Errorf("building plugin %s: %v\n%s", p, err, b)
		}
		st, err := os.Stat(f)
		if err != nil {
			return "", 0, err
		}
		total += st.Size()
	}
	return out, total, nil
}

// startPoliciesSim runs firmware-sim with the devices of
// configs/agent-policies.yaml.
func startPoliciesSim(bins string) (string, func(), error) {
	// GOMAXPROCS=1: the device's own hardware (procs.go).
	sim, err := rig.Start(rig.Options{Env: []string{"GOMAXPROCS=1"}, Lines: true}, filepath.Join(bins, "firmware-sim"), "--listen", "127.0.0.1:0", "--log-level", "warn",
		"--devices", "pump-7:pump,valve-1:valve,relay-1:relay,pump-1:pump,valve-2:valve,mixer-1:generic")
	if err != nil {
		return "", nil, err
	}
	r := sim.Lines()
	line, err := r.ReadString('\n')
	url := strings.TrimSpace(strings.TrimPrefix(line, "firmware-sim listening on "))
	if err != nil || !strings.HasPrefix(url, "http://") {
		sim.Stop(syscall.SIGTERM, time.Second)
		return "", nil, fmt.Errorf("firmware-sim did not start: %q %v", line, err)
	}
	go io.Copy(io.Discard, r)
	return url, func() { sim.Stop(syscall.SIGTERM, 5*time.Second) }, nil
}

// policiesYAML is configs/agent-policies.yaml pointed at this run's data
// directory, broker, admin address, simulator and plugins.
func policiesYAML(dataDir, broker, gateway, admin, simURL, plugins string, v fpVariant) (string, error) {
	y := string(configs.AgentPoliciesYAML)
	reps := []struct{ old, new string }{
		{"gateway_id: gw-1", "gateway_id: " + gateway},
		{"data_dir: ./data", "data_dir: " + strconv.Quote(dataDir)},
		{"  broker: embedded\n  embedded_listen: 127.0.0.1:1883\n", fmt.Sprintf("  broker: %s\n  client_id: edge-agent-%s\nadmin:\n  listen: %q\n", broker, gateway, admin)},
		{"dir: ./plugins/build", "dir: " + strconv.Quote(plugins)},
		{"http://127.0.0.1:8081", simURL},
	}
	if v.oneModule {
		reps = append(reps, oneModuleBindings...)
	}
	for _, r := range reps {
		if !strings.Contains(y, r.old) {
			return "", fmt.Errorf("configs/agent-policies.yaml has no %q any more: update policiesYAML", r.old)
		}
		y = strings.ReplaceAll(y, r.old, r.new)
	}
	if v.noPlugins {
		y = regexp.MustCompile(`(?m)^    policy:\n      plugin: .*\n      config: .*\n`).ReplaceAllString(y, "")
		if strings.Contains(y, "policy:") {
			return "", fmt.Errorf("configs/agent-policies.yaml: a policy block policiesYAML cannot remove")
		}
	}
	if v.limits != "" {
		y = strings.ReplaceAll(y, "    policy:\n", "    policy:\n      limits: "+v.limits+"\n")
	}
	return y, nil
}

// footprintRun starts the agent on dir/data, measures its start-up, sends
// the commands and reads its memory.
func footprintRun(bins, dir, broker, simURL, plugins string, v fpVariant, idx int, start string) (fpResult, error) {
	var r fpResult
	admin, err := rig.FreeAddr()
	if err != nil {
		return r, err
	}
	// A gateway (and so a client ID, a session and topics) per variant.
	gateway := fmt.Sprintf("fp-%d", idx)
	y, err := policiesYAML(filepath.Join(dir, "data"), broker, gateway, admin, simURL, plugins, v)
	if err != nil {
		return r, err
	}
	cfg := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfg, []byte(y), 0o600); err != nil {
		return r, err
	}
	t0 := time.Now()
	agent, err := rig.Start(rig.Options{Env: append(slices.Clip(agentEnv), v.env...), Stderr: os.Stderr}, filepath.Join(bins, "edge-agent"), "run", "--config", cfg, "--log-level", "warn")
	if err != nil {
		return r, err
	}
	defer agent.Stop(syscall.SIGTERM, 10*time.Second)
	hc := &http.Client{Timeout: 2 * time.Second}
	get := func(path string) (int, string) {
		resp, err := hc.Get("http://" + admin + path)
		if err != nil {
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	deadline := t0.Add(60 * time.Second)
	for r.readyz == 0 {
		if time.Now().After(deadline) {
			return r, fmt.Errorf("not ready within 60s (/readyz said %q)", r.states)
		}
		if r.healthz == 0 {
			if code, _ := get("/healthz"); code == http.StatusOK {
				r.healthz = time.Since(t0)
			}
		}
		if code, body := get("/readyz"); code == http.StatusOK {
			r.readyz = time.Since(t0)
		} else if code != 0 && (len(r.states) == 0 || r.states[len(r.states)-1] != body) {
			r.states = append(r.states, body)
		}
		time.Sleep(5 * time.Millisecond)
	}
	took, err := sendPolicyCommands(broker, gateway, *fpCommands, fmt.Sprintf("%s-%s", v.name, start))
	if err != nil {
		return r, err
	}
	r.cmdsPerSec = float64(*fpCommands) / took.Seconds()
	st, err := procStatus(agent.PID())
	if err != nil {
		return r, err
	}
	r.hwm, r.rss, r.anon = st["VmHWM"], st["VmRSS"], st["RssAnon"]
	r.code = nativeCode(agent.PID())
	return r, nil
}

// procStatus reads the kB fields of /proc/PID/status.
func procStatus(pid int) (map[string]int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, fmt.Errorf("the agent's memory (Linux /proc only): %w", err)
	}
	defer f.Close()
	out := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fs := strings.Fields(v)
		if len(fs) == 2 && fs[1] == "kB" {
			out[k], _ = strconv.ParseInt(fs[0], 10, 64)
		}
	}
	return out, sc.Err()
}

// nativeCode sums the resident KiB of a process's anonymous executable
// mappings (wazero's compiled code: it copies each module's code into one).
func nativeCode(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return 0
	}
	var total int64
	exec := false
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			exec = f[1] == "r-xp" && len(f) == 5 // no path: anonymous
			continue
		}
		if exec && len(f) == 3 && f[0] == "Rss:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			total += n
		}
	}
	return total
}

func treeSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if i, err := d.Info(); err == nil {
				n += i.Size()
			}
		}
		return nil
	})
	return n
}

// policyDevices are the six devices and a command each of their policies
// decides (mostly allows) at step i: pump-1 and valve-2 are one group.
var policyDevices = []struct {
	id  string
	cmd func(i int) (string, string)
}{
	{"pump-7", func(i int) (string, string) { return "set", fmt.Sprintf(`{"rpm":%d}`, i%3200) }},    // range-limit: above 3000 denied
	{"valve-1", func(i int) (string, string) { return "set", fmt.Sprintf(`{"open":%d}`, i%100) }},   // range-limit with clamp
	{"relay-1", func(i int) (string, string) { return "toggle", "" }},                               // allowlist
	{"pump-1", func(i int) (string, string) { return "set", fmt.Sprintf(`{"rpm":%d}`, (i%2)*150) }}, // ramp-limit
	{"valve-2", func(i int) (string, string) { return "set", `{"open":0}` }},                        // interlock
	{"mixer-1", func(i int) (string, string) { return "mix", fmt.Sprintf(`{"speed":%d}`, i%10) }},   // time-window (flush only at night)
}

// sendPolicyCommands sends n commands over the six devices, each device's
// controller keeping one in flight, and waits for every final Result.
func sendPolicyCommands(broker, gateway string, n int, run string) (time.Duration, error) {
	reply := "bench/fp/" + run
	ctl, err := dialControllers(broker, "edge-bench-fp-ctl-"+run, reply, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer ctl.close()
	var next atomic.Int64
	var fails atomic.Int64
	var wg sync.WaitGroup
	t0 := time.Now()
	for _, d := range policyDevices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				action, params := d.cmd(i)
				op := fmt.Sprintf("%s-%d", run, i)
				c := wire.Command{OpID: op, Fence: 1, Action: action, ReplyTo: reply}
				if params != "" {
					c.Params = json.RawMessage(params)
				}
				b, _ := json.Marshal(c)
				if !ctl.send(op, wire.CmdTopic(wire.DefaultPrefix, gateway, d.id), b, 30*time.Second) {
					fails.Add(1)
					return
				}
			}
		}()
	}
	wg.Wait()
	if f := fails.Load(); f > 0 {
		return 0, fmt.Errorf("%d commands got no Result within 30s", f)
	}
	return time.Since(t0), nil
}
