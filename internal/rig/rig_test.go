package rig

import (
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A started process: its stdout read by lines, paused and resumed, stopped
// by its PID, and how it ended.
func TestProc(t *testing.T) {
	p, err := Start(Options{Lines: true, Env: []string{"RIG_TEST=hello"}}, "/bin/sh", "-c", `echo "$RIG_TEST"; exec sleep 60`)
	if err != nil {
		t.Fatal(err)
	}
	line, err := p.Lines().ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "hello" {
		t.Fatalf("first line %q, %v", line, err)
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if !WaitFor(5*time.Second, p.Stopped) {
		t.Fatalf("not stopped after SIGSTOP")
	}
	p.Stop(syscall.SIGTERM, 5*time.Second) // resumed, so it handles SIGTERM
	if p.Running() || p.Ended() != "signal terminated" {
		t.Fatalf("after Stop: running %v, ended %q", p.Running(), p.Ended())
	}
	if code, ok := p.Wait(time.Second); !ok || code != -1 {
		t.Errorf("Wait: %d %v, want -1 (a signal)", code, ok)
	}
	if err := p.Signal(syscall.SIGTERM); err == nil {
		t.Errorf("a signal to an exited process did not fail")
	}

	q, err := Start(Options{}, "/bin/sh", "-c", "exit 3")
	if err != nil {
		t.Fatal(err)
	}
	if code, ok := q.Wait(10 * time.Second); !ok || code != 3 || q.Ended() != "exit 3" {
		t.Errorf("exit 3: code %d ok %v ended %q", code, ok, q.Ended())
	}
	if _, err := Start(Options{}, "/nonexistent/program"); err == nil {
		t.Errorf("starting a missing program did not fail")
	}
}

// FreePort's port can be listened on, and is below the ephemeral range.
func TestFreePort(t *testing.T) {
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	if port >= 32768 {
		t.Logf("port %d is not below the ephemeral range (the fallback)", port)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatalf("port %d is not free: %v", port, err)
	}
	ln.Close()
}
