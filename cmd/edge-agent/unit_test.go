package main

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/testkit"
)

// unitEnvironment is the Environment= of configs/edge-agent.service.
func unitEnvironment(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("../../configs/edge-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var env []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "Environment="); ok {
			env = append(env, v)
		}
	}
	return env
}

// systemd's watchdog kills a unit with SIGABRT. Go's runtime answers that
// by exiting 2, which the unit's RestartPreventExitStatus=2 (a
// configuration error) would take as "do not restart". Under the unit's
// environment (GOTRACEBACK=crash) the agent dumps its goroutines and dies by
// the signal instead, so Restart=on-failure restarts it.
func TestUnitEnvironmentMakesAWatchdogAbortRestartable(t *testing.T) {
	env := unitEnvironment(t)
	if len(env) == 0 {
		t.Fatal("the unit sets no Environment=")
	}
	// No core file from the crash (the unit says LimitCORE=0).
	if err := syscall.Setrlimit(syscall.RLIMIT_CORE, &syscall.Rlimit{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		env    []string
		signal bool // killed by SIGABRT rather than exit 2
	}{
		{"unit environment", env, true},
		{"Go's default", []string{"GOTRACEBACK="}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			listen := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
			p := startAgent(t, "  broker: embedded\n  embedded_listen: "+listen+"\n", tc.env...)
			eventually(t, 20*time.Second, "/readyz 200", func() bool { return p.status("/readyz") == http.StatusOK })
			if err := p.cmd.Process.Signal(syscall.SIGABRT); err != nil {
				t.Fatal(err)
			}
			select {
			case <-p.exited:
			case <-time.After(20 * time.Second):
				t.Fatal("the agent did not die of SIGABRT")
			}
			ws := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
			if !strings.Contains(p.log.String(), "goroutine ") {
				t.Errorf("no goroutine dump in the log")
			}
			if tc.signal {
				if !ws.Signaled() || ws.Signal() != syscall.SIGABRT {
					t.Fatalf("%v: want death by SIGABRT", p.cmd.ProcessState)
				}
				return
			}
			if ws.Signaled() || ws.ExitStatus() != 2 {
				t.Fatalf("%v: Go's default answer to SIGABRT is exit 2", p.cmd.ProcessState)
			}
		})
	}
}
