package main

import (
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/testkit"
)

// A start and a clean stop log each thing once, in words: one line for
// the embedded broker, the subscriptions as a list (not a Go map), and no
// warning, nor a line without a message, from the broker closing its own
// connections.
func TestStartAndCleanStopLogInWords(t *testing.T) {
	listen := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	p := startAgent(t, "  broker: embedded\n  embedded_listen: "+listen+"\n")
	eventually(t, 20*time.Second, "/readyz 200", func() bool { return p.status("/readyz") == http.StatusOK })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("the agent did not stop")
	}
	log := p.log.String()
	if code := p.cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(log, `msg="stopped cleanly"`) {
		t.Fatalf("exit %d, want a clean stop", code)
	}
	if n := strings.Count(log, "broker listening"); n != 1 {
		t.Errorf("%d lines say the embedded broker listens, want 1", n)
	}
	if !strings.Contains(log, `msg="mqtt: subscribed" client_id=edge-agent-gw-1 filters=edge/gw-1/devices/+/cmd,edge/gw-1/status`) {
		t.Errorf("the subscriptions are not logged as a list")
	}
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, `msg=""`) || strings.Contains(l, "map[") || strings.Contains(l, "level=WARN") && strings.Contains(l, "mochi") {
			t.Errorf("log line: %s", l)
		}
	}
}
