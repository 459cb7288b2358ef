package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/edge-agent/edge-agent/internal/rig"
)

// agentSup runs the agent process: it starts it, restarts it when it ends
// by itself (a crash point fired, a failed commit stopped it), and carries
// out the schedule's restarts one at a time, each with the failpoints the
// schedule asks for (EDGE_AGENT_FAILPOINTS; none for a plain restart).
type agentSup struct {
	w       *world
	name    string // "a", "b" (-ha); "" for the single agent
	admin   string // its admin API's URL
	data    string // its data directory
	cfg     string
	seed    uint64
	cmds    chan agentCmd
	quit    chan struct{}
	done    chan struct{}
	starts  atomic.Int64
	running atomic.Bool // run was started (close waits for it)
	gw      *gwSpec     // -fleet: its gateway (its configuration is written before each start)

	mu   sync.Mutex
	p    *rig.Proc
	spec string
	pids map[int]bool // every process it started
}

// agentCmd is one restart: stop with sig (wait up to 15s, then SIGKILL),
// stay down for down, start again with failpoints spec.
type agentCmd struct {
	sig  syscall.Signal
	down time.Duration
	spec string
	kind string        // the fault it is part of, for the record
	up   chan struct{} // closed once the new process started (nil: not waited for)
	// prepare runs while the agent is down (a wipe or a restore of its
	// data directory); the new process starts after it returned.
	prepare func()
	// during, when set, runs instead of a restart while the agent runs
	// and nothing else restarts it (a clone started beside it).
	during func(p *rig.Proc)
}

func newAgentSup(w *world, name, admin, data, cfg string, seed uint64) *agentSup {
	return &agentSup{w: w, name: name, admin: admin, data: data, cfg: cfg, seed: seed, cmds: make(chan agentCmd, 64), quit: make(chan struct{}), done: make(chan struct{}), pids: map[int]bool{}}
}

// target is the agent's name in the fault records: its pid, and with
// -ha its name before it (a:1234).
func (a *agentSup) target(pid int) string {
	if a.name == "" {
		return fmt.Sprint(pid)
	}
	return fmt.Sprintf("%s:%d", a.name, pid)
}

// hadPID reports whether pid is one of this agent's processes.
func (a *agentSup) hadPID(pid int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pids[pid]
}

func (a *agentSup) proc() *rig.Proc {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.p
}

func (a *agentSup) start(spec string) error {
	if a.gw != nil {
		if err := a.writeFleetConfig(); err != nil {
			return err
		}
	}
	env := []string{"EDGE_AGENT_FAILPOINTS=" + spec, fmt.Sprintf("EDGE_AGENT_FAILPOINTS_SEED=%d", a.seed+uint64(a.starts.Load()))}
	p, err := rig.Start(rig.Options{Out: a.w.out, Env: env}, a.w.o.agentBin, "run", "--config", a.cfg, "--log-level", "warn")
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.p, a.spec = p, spec
	a.pids[p.PID()] = true
	a.mu.Unlock()
	a.starts.Add(1)
	detail := "normal"
	if spec != "" {
		detail = "EDGE_AGENT_FAILPOINTS=" + spec
	}
	a.w.record("agent_start", "start", a.target(p.PID()), detail)
	return nil
}

// run supervises until close.
func (a *agentSup) run() {
	a.running.Store(true)
	defer close(a.done)
	for {
		p := a.proc()
		select {
		case <-a.quit:
			p.Stop(syscall.SIGTERM, 15*time.Second)
			a.w.record("agent_exit", "end", a.target(p.PID()), p.Ended())
			return
		case c := <-a.cmds:
			if c.during != nil {
				c.during(p)
				continue
			}
			p.Stop(c.sig, 15*time.Second)
			a.w.record("agent_exit", "end", a.target(p.PID()), p.Ended())
			if !a.pause(c.down) {
				return
			}
			if c.prepare != nil {
				c.prepare()
			}
			if err := a.start(c.spec); err != nil {
				fmt.Fprintf(os.Stderr, "edge-chaos: %v\n", err)
				return
			}
			if c.up != nil {
				close(c.up)
			}
		case <-p.Done():
			// Ended by itself: a crash point, a failed commit (fail
			// stop), or a crash during recovery. Start it again, plain.
			a.w.record("agent_exit", "end", a.target(p.PID()), p.Ended())
			if !a.pause(300 * time.Millisecond) {
				return
			}
			if err := a.start(""); err != nil {
				fmt.Fprintf(os.Stderr, "edge-chaos: %v\n", err)
				return
			}
		}
	}
}

func (a *agentSup) pause(d time.Duration) bool {
	select {
	case <-a.quit:
		return false
	case <-time.After(d):
		return true
	}
}

// restart queues a restart.
func (a *agentSup) restart(c agentCmd) { a.cmds <- c }

// close stops the agent gracefully and the supervision with it.
func (a *agentSup) close() {
	select {
	case <-a.quit:
	default:
		close(a.quit)
	}
	if a.running.Load() {
		<-a.done
	} else if p := a.proc(); p != nil {
		p.Stop(syscall.SIGTERM, 15*time.Second)
	}
}

// ready reports whether the agent's /readyz answers 200.
func (a *agentSup) ready() bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(a.admin + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// up reports whether the agent serves (ready), or, with -ha, runs as the
// standby (its /healthz answers 200: a standby is alive, not ready).
func (a *agentSup) up() bool {
	if a.name == "" {
		return a.ready()
	}
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(a.admin + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// plain reports whether the running agent has no failpoints armed.
func (a *agentSup) plain() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.spec == "" && a.p.Running()
}

func agentConfigPath(dir, name string) string {
	if name == "" {
		return filepath.Join(dir, "agent.yaml")
	}
	return filepath.Join(dir, "agent-"+name+".yaml")
}
