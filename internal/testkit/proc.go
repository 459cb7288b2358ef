package testkit

import (
	"io"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/rig"
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

// Proc is a process a test started (a rig.Proc: PID, Signal, Stop, Kill,
// Wait...). It is stopped (by its PID, never by name: a user's own broker
// may be running) in t.Cleanup if it still runs, and killed if the test
// binary dies first (Linux: Pdeathsig). On a failed test its output's tail
// is logged.
type Proc struct {
	*rig.Proc
	out *SyncBuffer // nil when ProcOptions.Out was given
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
	p := &Proc{}
	out := o.Out
	if out == nil {
		p.out = &SyncBuffer{}
		out = p.out
	}
	rp, err := rig.Start(rig.Options{Env: o.Env, Dir: o.Dir, Out: out}, name, args...)
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	p.Proc = rp
	t.Cleanup(func() {
		p.Stop(o.StopSignal, o.StopWait)
		if t.Failed() && p.out != nil {
			t.Logf("%s output:\n%s", filepath.Base(name), Tail(p.out.String(), 4000))
		}
	})
	return p
}

// Log is what the process wrote so far ("" when ProcOptions.Out was set).
func (p *Proc) Log() string {
	if p.out == nil {
		return ""
	}
	return p.out.String()
}
