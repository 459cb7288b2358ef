package main

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one process the campaign started. It is stopped only by its PID
// (never by name: the user's own brokers and agents may be running), and
// killed by the kernel if the campaign dies first (Pdeathsig).
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}

	mu     sync.Mutex
	status string // how it ended, once it has
}

// startProc starts path with args, its output appended to out.
func startProc(name string, out io.Writer, env []string, path string, args ...string) (*proc, error) {
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, path, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		st := "exit 0"
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
		p.status = st
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// ended says how the process ended ("" while it runs).
func (p *proc) ended() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
}

func (p *proc) signal(sig syscall.Signal) error {
	if !p.running() {
		return fmt.Errorf("%s (pid %d) has exited", p.name, p.pid())
	}
	return p.cmd.Process.Signal(sig)
}

// stop sends sig (resuming a paused process first) and waits up to wait
// for the exit, then kills it.
func (p *proc) stop(sig syscall.Signal, wait time.Duration) {
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	if sig != syscall.SIGKILL {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
	}
	select {
	case <-p.done:
	case <-time.After(wait):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *proc) kill() { p.stop(syscall.SIGKILL, time.Minute) }

// stopped reports whether the process is stopped by a signal (state T in
// /proc), e.g. a controller that paused itself.
func (p *proc) stopped() bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid()) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && (s[i+2] == 'T' || s[i+2] == 't')
}

// freeAddr returns a loopback address whose port was free a moment ago,
// below the kernel's ephemeral range when it can (a server restarted on the
// same port must not find it taken by some client's outgoing connection).
func freeAddr() (string, error) {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				lo = n
			}
		}
	}
	const base = 20000
	for i := 0; i < 200 && lo > base+1000; i++ {
		port := base + rand.IntN(lo-base)
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
			l.Close()
			return l.Addr().String(), nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// waitFor polls cond every 20ms until it holds or within passes.
func waitFor(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
