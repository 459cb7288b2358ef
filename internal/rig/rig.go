// Package rig is what the tests (through internal/testkit), the chaos
// campaign (cmd/edge-chaos) and the benchmarks (cmd/edge-bench) run real
// processes and networks with, without a testing.TB: a process started
// and stopped only by its PID (Start, Proc), a free loopback port
// (FreePort, FreeAddr), a TCP fault proxy (Proxy, on toxiproxy), a
// polling wait (WaitFor) and a NATS server cluster with JetStream and MQTT
// (StartNATS, NATSConf), the broker cluster of docs/protocol.md §9.
package rig

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options say how Start runs a process. Zero values: the parent's
// environment and working directory, no input, output discarded.
type Options struct {
	Env    []string  // added to this process's environment
	Dir    string    // working directory
	Stdin  io.Reader // nil: /dev/null
	Out    io.Writer // stdout and stderr, unless Stderr is set
	Stderr io.Writer // stderr, when it goes elsewhere than Out
	// Lines: stdout is read line by line through Proc.Lines instead of
	// going to Out.
	Lines bool
}

// Proc is a process Start started. It is stopped only by its PID (never
// by name: a user's own broker or agent may be running), and killed by
// the kernel if this process dies first (Linux: Pdeathsig).
type Proc struct {
	name  string
	cmd   *exec.Cmd
	done  chan struct{}
	lines *bufio.Reader

	mu     sync.Mutex
	code   int    // exit code, -1 when a signal ended it
	status string // how it ended: "exit N", "signal S"
}

// Start starts path with args.
func Start(o Options, path string, args ...string) (*Proc, error) {
	p := &Proc{name: filepath.Base(path), cmd: exec.Command(path, args...), done: make(chan struct{}), code: -2}
	c := p.cmd
	c.Dir, c.Stdin, c.Stdout, c.Stderr = o.Dir, o.Stdin, o.Out, o.Out
	if o.Stderr != nil {
		c.Stderr = o.Stderr
	}
	c.SysProcAttr = procAttr()
	// Output a child of the process keeps open must not hold up Wait.
	c.WaitDelay = 5 * time.Second
	if len(o.Env) > 0 {
		c.Env = append(os.Environ(), o.Env...)
	}
	var w *os.File
	if o.Lines {
		r, pw, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		c.Stdout, w, p.lines = pw, pw, bufio.NewReader(r)
	}
	err := c.Start()
	if w != nil {
		w.Close() // the child has its own copy: EOF once it exits
	}
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	go func() {
		err := c.Wait()
		code, st := c.ProcessState.ExitCode(), "exit 0"
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				st = "signal " + ws.Signal().String()
			} else {
				st = "exit " + strconv.Itoa(ee.ExitCode())
			}
		} else if err != nil {
			st = err.Error()
		}
		p.mu.Lock()
		p.code, p.status = code, st
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// Name is the program's file name.
func (p *Proc) Name() string { return p.name }

// PID is the process's ID.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Running reports whether the process has not exited yet.
func (p *Proc) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Ended says how the process ended ("exit 0", "signal killed"...; "" while
// it runs).
func (p *Proc) Ended() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
}

// Lines reads the process's stdout (Options.Lines); nil otherwise.
func (p *Proc) Lines() *bufio.Reader { return p.lines }

// Signal sends sig (SIGSTOP and SIGCONT pause and resume it).
func (p *Proc) Signal(sig syscall.Signal) error {
	if !p.Running() {
		return fmt.Errorf("%s (pid %d) has exited", p.name, p.PID())
	}
	return p.cmd.Process.Signal(sig)
}

// Stop sends sig (and SIGCONT after it, so that a paused process handles
// it) and waits for the exit; after wait it kills the process and waits for
// that. SIGSTOP is sent and not waited for. A no-op once it has exited.
func (p *Proc) Stop(sig syscall.Signal, wait time.Duration) {
	if !p.Running() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	switch sig {
	case syscall.SIGSTOP:
		return
	case syscall.SIGKILL:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
	}
	select {
	case <-p.done:
	case <-time.After(wait):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Kill sends SIGKILL and waits for the exit.
func (p *Proc) Kill() { p.Stop(syscall.SIGKILL, time.Minute) }

// Wait waits up to within for the exit and returns the exit code (-1 when
// a signal ended it); ok is false when it still runs.
func (p *Proc) Wait(within time.Duration) (code int, ok bool) {
	select {
	case <-p.done:
	case <-time.After(within):
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.code, true
}

// Stopped reports whether the process is stopped by a signal (state T in
// /proc/PID/stat), e.g. one that paused itself.
func (p *Proc) Stopped() bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.PID()) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && (s[i+2] == 'T' || s[i+2] == 't')
}

// FreePort returns a loopback TCP port that is free now, taken below the
// kernel's ephemeral range (ip_local_port_range) when it can: a server
// restarted on the same port must not find it taken by some client's
// outgoing connection, which gets its local port from that range.
func FreePort() (int, error) {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				lo = n
			}
		}
	}
	const base = 10000
	if lo > base+1000 {
		for range 200 {
			port := base + rand.IntN(lo-base)
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
			if err == nil {
				_ = ln.Close()
				return port, nil
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// FreeAddr is 127.0.0.1 with a FreePort.
func FreeAddr() (string, error) {
	port, err := FreePort()
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(port), nil
}

// WaitFor polls cond every 20ms until it holds (true) or within passes
// (false).
func WaitFor(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
