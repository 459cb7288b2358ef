package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/etcdtest"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// The systemd notify protocol, for real: the agent process is started as
// systemd would start it under configs/edge-agent.service (NOTIFY_SOCKET
// naming a unixgram socket the test listens on, WATCHDOG_USEC), and the
// test reads what arrives on that socket.

// watchdogUSec is the test's WatchdogSec: the agent pings every third.
const watchdogUSec = 900_000

var watchdogPeriod = time.Duration(watchdogUSec) * time.Microsecond

type notification struct {
	state string
	at    time.Time
}

// notifySocket listens on a unixgram socket in a temp dir and delivers
// each datagram as it arrives.
func notifySocket(t *testing.T) (string, <-chan notification) {
	t.Helper()
	dir, err := os.MkdirTemp("", "sd") // short: a socket path has 108 bytes at most
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch := make(chan notification, 1024)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			ch <- notification{string(buf[:n]), time.Now()}
		}
	}()
	return path, ch
}

// agentProc is an edge-agent process this test started.
type agentProc struct {
	cmd    *exec.Cmd
	log    *mqtttest.SyncBuffer
	exited chan struct{}
	admin  string
}

// startAgent runs `edge-agent run` on a config with one (unreachable)
// device, the admin API on a free port and the given mqtt section, with
// extra environment. It is killed (by its PID) when the test ends.
func startAgent(t *testing.T, mqttYAML string, env ...string) *agentProc {
	t.Helper()
	dir := t.TempDir()
	admin := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	cfg := fmt.Sprintf("gateway_id: gw-1\ndata_dir: %s\nmqtt:\n%sadmin: {listen: %q}\n%s", filepath.Join(dir, "data"), mqttYAML, admin, goodDevices)
	path := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &agentProc{cmd: exec.Command(bin, "run", "--config", path), log: &mqtttest.SyncBuffer{}, exited: make(chan struct{}), admin: admin}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("agent log:\n%s", p.log.String())
		}
	})
	return p
}

// status is the HTTP status of GET path on the admin API, 0 when it does
// not answer.
func (p *agentProc) status(path string) int {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + p.admin + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitFor returns the first notification with the given state, failing
// the test after within; others are collected into seen.
func waitFor(t *testing.T, ch <-chan notification, state string, within time.Duration, seen *[]notification) notification {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case n := <-ch:
			if n.state == state {
				return n
			}
			*seen = append(*seen, n)
		case <-timer.C:
			t.Fatalf("no %s within %s (other notifications: %v)", state, within, *seen)
		}
	}
}

// pings waits for n WATCHDOG=1 notifications.
func pings(t *testing.T, ch <-chan notification, n int) time.Time {
	t.Helper()
	var seen []notification
	var last notification
	for i := 0; i < n; i++ {
		last = waitFor(t, ch, "WATCHDOG=1", 10*watchdogPeriod, &seen)
	}
	return last.at
}

// silent checks that no WATCHDOG=1 arrives for two watchdog periods after
// since plus one ping interval (a ping sent just before the fault may still
// be on its way): long enough for systemd to kill the unit. It drains ch
// until the end of that window.
func silent(t *testing.T, ch <-chan notification, since time.Time) {
	t.Helper()
	grace := since.Add(watchdogPeriod / 3)
	end := grace.Add(2 * watchdogPeriod)
	timer := time.NewTimer(time.Until(end))
	defer timer.Stop()
	for {
		select {
		case n := <-ch:
			if n.state == "WATCHDOG=1" && n.at.After(grace) {
				t.Fatalf("WATCHDOG=1 at +%s after the fault", n.at.Sub(since).Round(time.Millisecond))
			}
		case <-timer.C:
			return
		}
	}
}

// READY=1 comes once /readyz says ready (MQTT subscribed), not before;
// WATCHDOG=1 follows every third of WATCHDOG_USEC while the MQTT session is
// up, stops when it has been down longer than the watchdog period, and
// resumes when it is back.
func TestNotifyReadyAndWatchdogFollowMQTT(t *testing.T) {
	broker := mqtttest.StartEmbedded(t)
	proxy := testkit.NewProxy(t, broker.URL())
	proxy.Refuse(true) // the broker cannot be reached yet
	sock, ch := notifySocket(t)
	p := startAgent(t, fmt.Sprintf("  broker: %s\n  client_id: edge-agent-notify\n", proxy.URL()),
		"NOTIFY_SOCKET="+sock, fmt.Sprintf("WATCHDOG_USEC=%d", watchdogUSec))

	eventually(t, 20*time.Second, "the admin API answers /readyz 503", func() bool { return p.status("/readyz") == http.StatusServiceUnavailable })
	eventually(t, 20*time.Second, "the agent retried its MQTT connection", func() bool {
		return strings.Count(p.log.String(), "mqtt: connect failed, retrying") >= 2
	})
	if p.status("/readyz") != http.StatusServiceUnavailable {
		t.Fatal("ready without a broker")
	}
	select {
	case n := <-ch:
		t.Fatalf("%q sent before the agent was ready", n.state)
	default:
	}

	proxy.Refuse(false)
	var seen []notification
	ready := waitFor(t, ch, "READY=1", 30*time.Second, &seen)
	if len(seen) > 0 {
		t.Fatalf("before READY=1: %v", seen)
	}
	if code := p.status("/readyz"); code != http.StatusOK {
		t.Fatalf("READY=1 sent while /readyz answers %d", code)
	}
	first := pings(t, ch, 3)
	if first.Before(ready.at) {
		t.Fatal("a ping before READY=1")
	}

	// The session goes down and stays down.
	proxy.Refuse(true)
	proxy.Cut()
	eventually(t, 20*time.Second, "the agent reports itself not alive", func() bool {
		return strings.Contains(p.log.String(), "watchdog: not alive") && strings.Contains(p.log.String(), "mqtt: disconnected for")
	})
	silent(t, ch, time.Now())
	if code := p.status("/healthz"); code != http.StatusOK {
		t.Fatalf("the process should live on (a systemd restart is the remedy): /healthz %d", code)
	}

	// Back: paho reconnects and the pings resume.
	proxy.Refuse(false)
	pings(t, ch, 2)
	if !strings.Contains(p.log.String(), "watchdog: alive again") {
		t.Fatal("pings resumed without the agent saying so")
	}
}

// A commit that never returns (a disk that stopped answering) stops the
// pings while the process lives on; a failed commit ends the process
// (exit 1), and with it the pings.
func TestWatchdogStopsWhenTheStoreStops(t *testing.T) {
	for _, tc := range []struct {
		name, env, log string
		exits          bool
	}{
		{"stuck commit loop", "EDGE_AGENT_FAULT_STALL_COMMIT=12", "failpoint: commit stalled for good", false},
		{"failed commit", "EDGE_AGENT_FAULT_FAIL_COMMIT=12", "store: commit failed", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock, ch := notifySocket(t)
			listen := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
			p := startAgent(t, "  broker: embedded\n  embedded_listen: "+listen+"\n",
				"NOTIFY_SOCKET="+sock, fmt.Sprintf("WATCHDOG_USEC=%d", watchdogUSec), tc.env)
			var seen []notification
			waitFor(t, ch, "READY=1", 30*time.Second, &seen)
			pings(t, ch, 2) // healthy first: the fault comes with a later probe's commit
			eventually(t, 30*time.Second, "the fault happened", func() bool { return strings.Contains(p.log.String(), tc.log) })
			silent(t, ch, time.Now())
			if tc.exits {
				select {
				case <-p.exited:
				case <-time.After(10 * time.Second):
					t.Fatal("the agent did not exit after a failed commit")
				}
				if code := p.cmd.ProcessState.ExitCode(); code != 1 {
					t.Fatalf("exit status %d, want 1", code)
				}
				return
			}
			// Stuck, not dead: the process and its admin API live on, so
			// only the watchdog can tell systemd.
			select {
			case <-p.exited:
				t.Fatalf("the agent exited: %v", p.cmd.ProcessState)
			default:
			}
			if code := p.status("/healthz"); code != http.StatusOK {
				t.Fatalf("/healthz %d", code)
			}
			if !strings.Contains(p.log.String(), "store: the commit loop") {
				t.Fatal("the agent did not say the store is why")
			}
			p.cmd.Process.Signal(syscall.SIGKILL)
		})
	}
}

// A standby (ha) waits inside its start-up for the active's registration
// to go: it is the service running as configured, so READY=1 comes at
// once (`systemctl start` must not hang on it) with STATUS= naming the
// active, and the watchdog pings go on while its store commits. /readyz
// still says 503. When the active dies, STATUS= says active and /readyz
// 200, the pings never having stopped.
func TestNotifyStandbyIsReadyAndSaysSo(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	broker := mqtttest.StartEmbedded(t)
	pair := fmt.Sprintf("  broker: %s\n  client_id: edge-agent-ha\ncoordination:\n  etcd:\n    endpoints: [%s]\n    dial_timeout: 1s\n    session_ttl: 3s\nha: {enabled: true, safety_margin: 1s}\n",
		broker.URL(), strings.Join(etcd.Endpoints(), ", "))
	active := startAgent(t, pair)
	eventually(t, 30*time.Second, "the first agent active and ready", func() bool { return active.status("/readyz") == http.StatusOK })

	sock, ch := notifySocket(t)
	standby := startAgent(t, pair, "NOTIFY_SOCKET="+sock, fmt.Sprintf("WATCHDOG_USEC=%d", watchdogUSec))
	var seen []notification
	waitFor(t, ch, "READY=1", 30*time.Second, &seen)
	st := waitFor(t, ch, "STATUS=standby (active: "+mustHostname(t)+")", 5*time.Second, &seen)
	if code := standby.status("/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("the standby's /readyz: %d, want 503", code)
	}
	last := pings(t, ch, 3)
	if !last.After(st.at) || standby.status("/readyz") != http.StatusServiceUnavailable {
		t.Fatal("the standby's pings came after it stopped waiting")
	}

	active.cmd.Process.Signal(syscall.SIGKILL)
	<-active.exited
	seen = nil
	became := waitFor(t, ch, "STATUS=active", 30*time.Second, &seen)
	eventually(t, 10*time.Second, "the new active ready", func() bool { return standby.status("/readyz") == http.StatusOK })
	pings(t, ch, 2)
	prev := last
	for _, n := range seen {
		switch n.state {
		case "READY=1":
			t.Fatalf("READY=1 sent twice: %v", seen)
		case "WATCHDOG=1":
			if gap := n.at.Sub(prev); gap > watchdogPeriod {
				t.Fatalf("no WATCHDOG=1 for %s during the takeover (WatchdogSec %s)", gap, watchdogPeriod)
			}
			prev = n.at
		}
	}
	if gap := became.at.Sub(prev); gap > watchdogPeriod {
		t.Fatalf("no WATCHDOG=1 for %s before the standby became active", gap)
	}
}

func mustHostname(t *testing.T) string {
	t.Helper()
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}
