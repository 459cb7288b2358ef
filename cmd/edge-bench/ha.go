package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/rig"
)

// A standby that takes over (-takeover; docs/protocol.md §8): two
// edge-agent processes with one gateway_id and one MQTT client ID, their
// own data dirs, one etcd member, mosquitto with persistence and one
// firmware-sim that both reach.
//
// Takeover time, per run: the active is SIGKILLed (or SIGSTOPped), and
// from the moment the signal was sent (t0) three points are timed:
//
//   - role: the standby's GET /v1/status says "role": "active" (polled
//     every 10 ms);
//   - first Result: the controller, which sent a command right after t0
//     through the controller SDK (controller.Sender: the same op_id
//     resent after SendOptions.ResultTimeout, the default 5 s), receives
//     the new active's first Result, stale_fence (the takeover's floor is
//     above its fence);
//   - applied: the controller has done what the SDK says to do after
//     stale_fence (release, a new lock, a barrier) and its command, sent
//     again under the new fence, is applied by the new active. This is
//     the time the devices behind the gateway could not be commanded.
//
// The contract's bound is session_ttl + 5 s (to the standby serving).
// Between runs the faulted agent comes back (a killed one restarted on its
// store, a paused one continued) and must report standby before the next
// run faults the other one.
//
// Then the agent's CPU per command as the active of a pair (its standby
// running) against the same agent single (coordination.etcd, no ha), in
// alternating rounds of the closed-loop load of measure, and the
// standby's own CPU while it waits.

// haMargin is ha.safety_margin in these runs (below the shorter
// session_ttl, 3 s).
const haMargin = time.Second

// coordTTLYAML is coordYAML with coordination.etcd.session_ttl.
func coordTTLYAML(endpoint string, ttl time.Duration) string {
	return coordYAML(endpoint) + fmt.Sprintf("    session_ttl: %s\n", ttl)
}

// haYAML is the ha block of the pair's configuration.
func haYAML() string {
	return fmt.Sprintf("ha:\n  enabled: true\n  safety_margin: %s\n", haMargin)
}

// haAgent is one agent of a pair.
type haAgent struct {
	cfg, admin string
	log        string // its stderr (every takeover logs a floor per device)
	proc       *rig.Proc
}

func (a *haAgent) start(bins string) error {
	f, err := os.OpenFile(a.log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close() // the child has its own copy
	p, err := rig.Start(rig.Options{Env: agentEnv, Stderr: f}, filepath.Join(bins, "edge-agent"), "run", "--config", a.cfg, "--log-level", "warn")
	if err != nil {
		return err
	}
	a.proc = p
	return nil
}

// logTail is the last lines of the agent's log, for an error.
func (a *haAgent) logTail() string {
	b, _ := os.ReadFile(a.log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-15):], "\n")
}

// haStatus is what the bench reads of GET /v1/status.
type haStatus struct {
	Role       string `json:"role"`
	ActiveHost string `json:"active_host"`
}

// statusClient does not wait long for a paused agent.
var statusClient = http.Client{Timeout: time.Second}

// role is the agent's /v1/status role, and whether /readyz says 200.
func (a *haAgent) role() (string, bool) {
	resp, err := statusClient.Get("http://" + a.admin + "/v1/status")
	if err != nil {
		return "", false
	}
	var s haStatus
	json.NewDecoder(resp.Body).Decode(&s)
	resp.Body.Close()
	resp, err = statusClient.Get("http://" + a.admin + "/readyz")
	if err != nil {
		return s.Role, false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return s.Role, resp.StatusCode == http.StatusOK
}

// waitRole waits for role (active: ready; standby: not ready).
func (a *haAgent) waitRole(role string, within time.Duration) error {
	ok := rig.WaitFor(within, func() bool {
		r, ready := a.role()
		return r == role && ready == (role == "active")
	})
	if !ok {
		r, ready := a.role()
		return fmt.Errorf("agent on %s not %s within %s (role %q, ready %v, %s); its log ends:\n%s", a.admin, role, within, r, ready, a.proc.Ended(), a.logTail())
	}
	return nil
}

// haPair is two agents of one gateway and their firmware-sim.
type haPair struct {
	bins   string
	agents [2]*haAgent
	active int // the index of the active
	stops  []func()
}

func (p *haPair) stop() {
	for _, a := range p.agents {
		if a != nil && a.proc != nil {
			a.proc.Stop(syscall.SIGTERM, 10*time.Second)
		}
	}
	for _, s := range p.stops {
		s()
	}
}

// startHAPair starts firmware-sim of n devices and the pair: agent 0
// first, active once ready, then agent 1, standby. The meter gets the
// active as edge-agent and the standby as standby.
func startHAPair(bins, dir, broker, etcd string, ttl time.Duration, n int, m *cpuMeter) (*haPair, error) {
	url, _, stopSim, err := startSimProcess(bins, n, m, false)
	if err != nil {
		return nil, err
	}
	p := &haPair{bins: bins, stops: []func(){stopSim}}
	for i := range p.agents {
		d := filepath.Join(dir, fmt.Sprintf("agent-%d", i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			p.stop()
			return nil, err
		}
		admin, err := rig.FreeAddr()
		if err != nil {
			p.stop()
			return nil, err
		}
		a := &haAgent{cfg: filepath.Join(d, "agent.yaml"), admin: admin, log: filepath.Join(d, "agent.log")}
		yaml := agentYAML(filepath.Join(d, "data"), broker, admin, url, "", n) + coordTTLYAML(etcd, ttl) + haYAML()
		if err := os.WriteFile(a.cfg, []byte(yaml), 0o600); err != nil {
			p.stop()
			return nil, err
		}
		p.agents[i] = a
		if err := a.start(bins); err != nil {
			p.stop()
			return nil, err
		}
		role := "active"
		if i == 1 {
			role = "standby"
		}
		if err := a.waitRole(role, 30*time.Second); err != nil {
			p.stop()
			return nil, err
		}
	}
	m.add("edge-agent", p.agents[0].proc.PID())
	m.add("standby", p.agents[1].proc.PID())
	return p, nil
}

// takeoverRun is one run's times from the fault.
type takeoverRun struct {
	role, first, applied time.Duration
	resends              int // the controller's resends of a command after ResultTimeout
}

// benchController is a controller of device d0 as the SDK's guide
// (docs/controller.md) has it: a lock, a barrier, then commands.
type benchController struct {
	cli  *clientv3.Client
	conn *controller.Conn
	h    *controller.Holder
	s    *controller.Sender
	gen  int
}

const takeoverLock = "bench/locks/d0"

func newBenchController(ctx context.Context, broker, etcd string) (*benchController, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	conn, err := controller.Dial(ctx, controller.ConnOptions{Broker: broker, Gateway: gw, ControllerID: fmt.Sprintf("edge-bench-ha-%d", time.Now().UnixNano())})
	if err != nil {
		cli.Close()
		return nil, err
	}
	c := &benchController{cli: cli, conn: conn}
	if err := c.relock(ctx); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// relock releases the holder (LOST or not), takes the lock anew and sends
// the barrier.
func (c *benchController) relock(ctx context.Context) error {
	if c.h != nil {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c.h.Release(rctx) // a LOST holder's release deletes only its own key
		cancel()
	}
	c.gen++
	h, err := controller.Acquire(ctx, c.cli, []string{takeoverLock}, &controller.LockOptions{TTL: 30 * time.Second, Name: fmt.Sprintf("edge-bench/%d", c.gen)})
	if err != nil {
		return fmt.Errorf("acquire: %w", err)
	}
	c.h, c.s = h, controller.NewSender(c.conn, h, nil)
	if err := c.s.Barrier(ctx, "d0"); err != nil {
		return fmt.Errorf("barrier under fence %d: %w", h.Fence(), err)
	}
	return nil
}

// set sends one command; onStale is called when a Result shows a newer
// fence (the holder is LOST then and set takes a new lock, sends the
// barrier and the command again). It returns the applied Result's op_id.
func (c *benchController) set(ctx context.Context, v int, onStale func()) (string, error) {
	for {
		op := controller.NewOpID()
		r, err := c.s.Send(ctx, "d0", "set", map[string]int{"rpm": v}, controller.WithOpID(op))
		switch {
		case err == nil && r.Status == wire.StatusApplied:
			return op, nil
		case errors.Is(err, controller.ErrLost):
			if onStale != nil {
				onStale()
				onStale = nil
			}
			if err := c.relock(ctx); err != nil {
				return "", err
			}
		case ctx.Err() != nil:
			return "", fmt.Errorf("no command applied: %w (last: %v)", ctx.Err(), err)
		default:
			return "", fmt.Errorf("command %s: %v", op, err)
		}
	}
}

func (c *benchController) close() {
	if c.h != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c.h.Release(ctx)
		cancel()
	}
	c.conn.Close()
	c.cli.Close()
}

// takeovers runs the pair through runs faults (SIGKILL or SIGSTOP of the
// active), alternating which agent is active, and times each.
func takeovers(p *haPair, ctl *benchController, fault syscall.Signal, ttl time.Duration, runs int) ([]takeoverRun, error) {
	var out []takeoverRun
	for r := 0; r < runs; r++ {
		act, sb := p.agents[p.active], p.agents[1-p.active]
		// Both in their roles, and a command applied through the active.
		if err := act.waitRole("active", 10*time.Second); err != nil {
			return out, err
		}
		if err := sb.waitRole("standby", 10*time.Second); err != nil {
			return out, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), ttl+30*time.Second)
		if _, err := ctl.set(ctx, r, nil); err != nil {
			cancel()
			return out, fmt.Errorf("run %d, before the fault: %w", r, err)
		}
		resends := ctl.s.Stats().Resends
		if err := act.proc.Signal(fault); err != nil {
			cancel()
			return out, err
		}
		t0 := time.Now()
		roleAt := make(chan time.Duration, 1)
		go func() {
			for ctx.Err() == nil {
				if r, ready := sb.role(); r == "active" {
					roleAt <- time.Since(t0)
					_ = ready
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			roleAt <- -1
		}()
		var run takeoverRun
		op, err := ctl.set(ctx, 1000+r, func() { run.first = time.Since(t0) })
		run.applied = time.Since(t0)
		run.role = <-roleAt
		run.resends = ctl.s.Stats().Resends - resends
		cancel()
		if err != nil {
			return out, fmt.Errorf("run %d after %s: %w", r, fault, err)
		}
		if run.first == 0 || run.role < 0 {
			return out, fmt.Errorf("run %d: no stale_fence before the command applied (first %s, role %s): was there a takeover?", r, run.first, run.role)
		}
		// The command was applied by the new active: it is in its history.
		if !inHistory(sb.admin, op) {
			return out, fmt.Errorf("run %d: op %s applied but not in the new active's history", r, op)
		}
		fmt.Printf("session_ttl %-4s %-7s run %2d: role active %s, first Result (stale_fence) %s, applied %s, resends %d\n",
			ttl, fault, r+1, run.role.Round(time.Millisecond), run.first.Round(time.Millisecond), run.applied.Round(time.Millisecond), run.resends)
		out = append(out, run)
		// The faulted agent comes back as standby.
		switch fault {
		case syscall.SIGKILL:
			act.proc.Wait(10 * time.Second)
			if err := act.start(p.bins); err != nil {
				return out, err
			}
		default:
			act.proc.Signal(syscall.SIGCONT)
		}
		if err := act.waitRole("standby", ttl+20*time.Second); err != nil {
			return out, fmt.Errorf("run %d: the old active after %s: %w", r, fault, err)
		}
		p.active = 1 - p.active
	}
	return out, nil
}

// inHistory reports whether op is in d0's history on the agent at admin.
func inHistory(admin, op string) bool {
	resp, err := statusClient.Get("http://" + admin + "/v1/devices/d0/ops?limit=20")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.Contains(string(b), `"`+op+`"`)
}

// durStats is the median (the mean of the middle two of an even count)
// and the worst of v, and how many exceed bound.
func durStats(v []time.Duration, bound time.Duration) (med, worst time.Duration, over int) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	s := append([]time.Duration(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	med = s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	for _, d := range s {
		if d > bound {
			over++
		}
	}
	return med, s[len(s)-1], over
}

// parseDurations reads a list such as "3s,10s".
func parseDurations(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range splitList(s) {
		d, err := time.ParseDuration(f)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("%q: want a positive duration such as 3s", f)
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no duration in %q", s)
	}
	return out, nil
}

// parseFaults reads a list of kill and stop.
func parseFaults(s string) ([]syscall.Signal, error) {
	var out []syscall.Signal
	for _, f := range splitList(s) {
		switch f {
		case "kill":
			out = append(out, syscall.SIGKILL)
		case "stop":
			out = append(out, syscall.SIGSTOP)
		default:
			return nil, fmt.Errorf("%q: want kill or stop", f)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no fault in %q", s)
	}
	return out, nil
}

func faultName(sig syscall.Signal) string {
	if sig == syscall.SIGKILL {
		return "SIGKILL"
	}
	return "SIGSTOP"
}

// loadAvg is /proc/loadavg's first three fields.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

type takeoverOpts struct {
	ttls      []time.Duration
	faults    []syscall.Signal
	runs      int
	devices   int // of the takeover runs
	cpuN      int // devices of the CPU rounds
	cpuRounds int
	idle      time.Duration // the pair's idle CPU window (0: none)
	dur       time.Duration
	out       string
}

// runTakeover is -takeover.
func runTakeover(o takeoverOpts) error {
	tmp, broker, bins, etcd, stop, err := startCoordBench("edge-bench-ha")
	if err != nil {
		return err
	}
	defer stop()
	loadBefore := loadAvg()
	fmt.Printf("load average before: %s\n", loadBefore)

	type cell struct {
		ttl   time.Duration
		fault syscall.Signal
		runs  []takeoverRun
	}
	var cells []cell
	for _, ttl := range o.ttls {
		for _, fault := range o.faults {
			if o.runs == 0 {
				break
			}
			runs, err := takeoverCell(bins, filepath.Join(tmp, fmt.Sprintf("takeover-%s-%s", ttl, faultName(fault))), broker, etcd, ttl, fault, o.runs, o.devices)
			if err != nil {
				return fmt.Errorf("session_ttl %s, %s: %w", ttl, faultName(fault), err)
			}
			cells = append(cells, cell{ttl, fault, runs})
		}
	}
	loadMid := loadAvg()

	// CPU per command: single (coordination.etcd) and active of a pair,
	// alternating, at cpuN devices; session_ttl the longest of the list.
	ttl := o.ttls[len(o.ttls)-1]
	var cpu [2][]float64
	var rate [2][]float64
	var standbyCPU, standbyWall time.Duration
	for r := 0; r < o.cpuRounds; r++ {
		for i, ha := range []bool{false, true} {
			st, err := measure(broker, o.cpuN, o.dur, target{bins: bins, kind: agentKind, fence: coordFence, coordination: etcd,
				ha: ha, ttl: ttl, dir: filepath.Join(tmp, fmt.Sprintf("cpu-%d-%d", r, i))})
			if err != nil {
				return fmt.Errorf("cpu, ha %v, round %d: %w", ha, r, err)
			}
			name := "single"
			if ha {
				name = "active"
				for j, n := range st.cpuNames {
					if n == "standby" {
						standbyCPU += st.cpuParts[j] * time.Duration(st.n)
					}
				}
				standbyWall += o.dur - o.dur/10
			}
			fmt.Printf("%-8d %-12s %10.0f %9s %9s   %s\n         %s\n", o.cpuN, "edge-agent", st.perSec, st.p50.Round(time.Microsecond), st.p99.Round(time.Microsecond), name, st.cpu)
			rate[i] = append(rate[i], st.perSec)
			cpu[i] = append(cpu[i], float64(agentCPU(st).Microseconds()))
		}
	}
	// Idle: the pair with no commands, both agents' CPU over o.idle.
	var idleActive, idleStandby time.Duration
	if o.idle > 0 {
		if idleActive, idleStandby, err = idleCPU(bins, filepath.Join(tmp, "idle"), broker, etcd, ttl, o.cpuN, o.idle); err != nil {
			return fmt.Errorf("idle: %w", err)
		}
		fmt.Printf("idle %s, %d devices: the active %s, the standby %s of CPU per second\n", o.idle, o.cpuN, idleActive.Round(time.Microsecond), idleStandby.Round(time.Microsecond))
	}
	loadAfter := loadAvg()
	fmt.Printf("load average: %s before, %s after the takeovers, %s at the end\n", loadBefore, loadMid, loadAfter)

	// The summary.
	fmt.Println()
	for _, c := range cells {
		bound := c.ttl + 5*time.Second
		var role, first, applied []time.Duration
		res := 0
		for _, r := range c.runs {
			role, first, applied = append(role, r.role), append(first, r.first), append(applied, r.applied)
			res += r.resends
		}
		rm, rw, ro := durStats(role, bound)
		am, aw, ao := durStats(applied, bound)
		fmt.Printf("session_ttl %s, %s, %d runs: role active median %s worst %s; applied median %s worst %s; bound %s (over: %d, %d); resends %d\n",
			c.ttl, faultName(c.fault), len(c.runs), rm.Round(time.Millisecond), rw.Round(time.Millisecond), am.Round(time.Millisecond), aw.Round(time.Millisecond), bound, ro, ao, res)
	}
	var pairs []float64
	for r := range cpu[0] {
		pairs = append(pairs, (cpu[1][r]/cpu[0][r]-1)*100)
	}
	standbyPerSec := time.Duration(0)
	if standbyWall > 0 {
		standbyPerSec = time.Duration(float64(standbyCPU) / standbyWall.Seconds())
	}
	if o.cpuRounds > 0 {
		fmt.Printf("agent CPU per command at %d devices: single %.0f µs, active %.0f µs (medians of %d): %+.1f%%; rounds' pairs median %+.1f%%; the standby %s of CPU per second while it waits\n",
			o.cpuN, median(cpu[0]), median(cpu[1]), o.cpuRounds, (median(cpu[1])/median(cpu[0])-1)*100, median(pairs), standbyPerSec.Round(time.Microsecond))
	}
	if o.out == "" {
		return nil
	}
	f, err := os.OpenFile(o.out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(f, "\n`go run ./cmd/edge-bench -takeover -takeover-runs %d -session-ttl %s -takeover-devices %d`, %s, load average %s before, %s after the takeovers, %s at the end:\n\n",
		o.runs, joinDurs(o.ttls), o.devices, time.Now().UTC().Format("2006-01-02"), loadBefore, loadMid, loadAfter)
	if len(cells) > 0 {
		fmt.Fprintln(f, "| session_ttl | fault | runs | to role active: median | worst | to the controller's command applied: median | worst | bound (session_ttl + 5 s) | over the bound | resends |")
		fmt.Fprintln(f, "|---|---|---|---|---|---|---|---|---|---|")
		for _, c := range cells {
			bound := c.ttl + 5*time.Second
			var role, applied []time.Duration
			res := 0
			for _, r := range c.runs {
				role, applied = append(role, r.role), append(applied, r.applied)
				res += r.resends
			}
			rm, rw, ro := durStats(role, bound)
			am, aw, ao := durStats(applied, bound)
			fmt.Fprintf(f, "| %s | %s | %d | **%s** | **%s** | **%s** | **%s** | %s | %d, %d | %d |\n", c.ttl, faultName(c.fault), len(c.runs),
				rm.Round(time.Millisecond), rw.Round(time.Millisecond), am.Round(time.Millisecond), aw.Round(time.Millisecond), bound, ro, ao, res)
		}
		fmt.Fprintln(f, "\nEach run, to role active / first Result (stale_fence) / applied:")
		fmt.Fprintln(f)
		for _, c := range cells {
			var parts []string
			for _, r := range c.runs {
				parts = append(parts, fmt.Sprintf("%.2f/%.2f/%.2f", r.role.Seconds(), r.first.Seconds(), r.applied.Seconds()))
			}
			fmt.Fprintf(f, "- %s, %s (s): %s\n", c.ttl, faultName(c.fault), strings.Join(parts, ", "))
		}
	}
	if o.cpuRounds > 0 {
		fmt.Fprintf(f, "\n`-duration %s -devices %d -takeover-cpu-rounds %d` (alternating rounds; session_ttl %s, safety_margin %s):\n\n", o.dur, o.cpuN, o.cpuRounds, ttl, haMargin)
		fmt.Fprintln(f, "| agent | cmds/s (runs) | median | agent CPU µs/cmd (runs) | median |")
		fmt.Fprintln(f, "|---|---|---|---|---|")
		for i, name := range []string{"single (coordination.etcd, no ha)", "active of a pair (its standby running)"} {
			fmt.Fprintf(f, "| %s | %s | %.0f | %s | **%.0f** |\n", name, fmtRuns(rate[i]), median(rate[i]), fmtRuns(cpu[i]), median(cpu[i]))
		}
		fmt.Fprintf(f, "\nActive against single: %+.1f%% (medians); each round's pair, back to back: %s%%, median %+.1f%%. The standby while it waits: %s of CPU per second (%.2f%% of a core, over %s).\n",
			(median(cpu[1])/median(cpu[0])-1)*100, fmtPcts(pairs), median(pairs), standbyPerSec.Round(time.Microsecond), 100*float64(standbyPerSec)/float64(time.Second), standbyWall)
	}
	if o.idle > 0 {
		fmt.Fprintf(f, "\nThe pair idle (`-takeover-idle %s`, %d devices, no commands): the active %s of CPU per second (%.2f%% of a core), the standby %s (%.2f%%).\n",
			o.idle, o.cpuN, idleActive.Round(time.Microsecond), 100*float64(idleActive)/float64(time.Second), idleStandby.Round(time.Microsecond), 100*float64(idleStandby)/float64(time.Second))
	}
	return nil
}

// idleCPU starts a pair of n devices, leaves it without commands for
// idle and returns each agent's CPU per second over that time.
func idleCPU(bins, dir, broker, etcd string, ttl time.Duration, n int, idle time.Duration) (active, standby time.Duration, err error) {
	m := &cpuMeter{}
	p, err := startHAPair(bins, dir, broker, etcd, ttl, n, m)
	if err != nil {
		return 0, 0, err
	}
	defer p.stop()
	a, s := p.agents[0].proc.PID(), p.agents[1].proc.PID()
	a0, s0, t0 := cpuTime(a), cpuTime(s), time.Now()
	time.Sleep(idle) // the measuring window itself, not a wait for anything
	secs := time.Since(t0).Seconds()
	if r, _ := p.agents[1].role(); r != "standby" {
		return 0, 0, fmt.Errorf("the standby's role after the idle time: %q", r)
	}
	return time.Duration(float64(cpuTime(a)-a0) / secs), time.Duration(float64(cpuTime(s)-s0) / secs), nil
}

func joinDurs(v []time.Duration) string {
	var s []string
	for _, d := range v {
		s = append(s, d.String())
	}
	return strings.Join(s, ",")
}

// takeoverCell starts a pair and a controller and runs the takeovers of
// one session_ttl and one fault.
func takeoverCell(bins, dir, broker, etcd string, ttl time.Duration, fault syscall.Signal, runs, n int) ([]takeoverRun, error) {
	p, err := startHAPair(bins, dir, broker, etcd, ttl, n, &cpuMeter{})
	if err != nil {
		return nil, err
	}
	defer p.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctl, err := newBenchController(ctx, broker, etcd)
	if err != nil {
		return nil, err
	}
	defer ctl.close()
	return takeovers(p, ctl, fault, ttl, runs)
}
