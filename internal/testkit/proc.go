package testkit

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ProcOptions say how StartProc runs a process. Zero values mean the
// documented defaults.
type ProcOptions struct {
	// Env is added to the test process's environment.
	Env []string
	// Out receives stdout and stderr. Nil: a SyncBuffer that Log returns.
	Out io.Writer
	// Dir is the working directory. "": the test's.
	Dir string
	// StopSignal is what t.Cleanup sends a process still running; after
	// StopWait it is killed. Zero: SIGTERM and 10s.
	StopSignal syscall.Signal
	StopWait   time.Duration
}

// Proc is a process a test started. It is stopped (by its PID, never by
// name: a user's own broker may be running) in t.Cleanup if it still runs,
// and killed if the test binary dies first (Linux: Pdeathsig). On a failed
// test its output's tail is logged.
type Proc struct {
	t    testing.TB
	name string
	cmd  *exec.Cmd
	out  *SyncBuffer // nil when ProcOptions.Out was given
	done chan struct{}
	o    ProcOptions

	mu   sync.Mutex
	code int
}

// StartProc starts name with args.
func StartProc(t testing.TB, o ProcOptions, name string, args ...string) *Proc {
	t.Helper()
	if o.StopSignal == 0 {
		o.StopSignal = syscall.SIGTERM
	}
	if o.StopWait == 0 {
		o.StopWait = 10 * time.Second
	}
	p := &Proc{t: t, name: name, cmd: exec.Command(name, args...), done: make(chan struct{}), o: o, code: -2}
	out := o.Out
	if out == nil {
		p.out = &SyncBuffer{}
		out = p.out
	}
	p.cmd.Stdout, p.cmd.Stderr = out, out
	p.cmd.Dir = o.Dir
	p.cmd.SysProcAttr = procAttr()
	if len(o.Env) > 0 {
		p.cmd.Env = append(os.Environ(), o.Env...)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("testkit: start %s: %v", name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.mu.Lock()
		p.code = p.cmd.ProcessState.ExitCode()
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Stop(p.o.StopSignal, p.o.StopWait)
		if t.Failed() && p.out != nil {
			t.Logf("%s output:\n%s", filepath.Base(name), Tail(p.out.String(), 4000))
		}
	})
	return p
}

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

// Log is what the process wrote so far ("" when ProcOptions.Out was set).
func (p *Proc) Log() string {
	if p.out == nil {
		return ""
	}
	return p.out.String()
}

// Signal sends sig (SIGSTOP and SIGCONT pause and resume it).
func (p *Proc) Signal(sig syscall.Signal) error {
	if !p.Running() {
		return fmt.Errorf("testkit: %s has exited", filepath.Base(p.name))
	}
	return p.cmd.Process.Signal(sig)
}

// Stop sends sig and waits for the exit; after wait it kills the process
// and waits for that. A no-op once it has exited.
func (p *Proc) Stop(sig syscall.Signal, wait time.Duration) {
	if !p.Running() {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	if sig == syscall.SIGSTOP {
		return
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
