package main

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// bin is edgectl built for the tests that run it as the operator does, as
// a process, and read its exit status.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "edgectl-cli")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "edgectl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		os.Stderr.Write(out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runBin runs edgectl with args and env (added to the test's), and returns
// its exit status, stdout and stderr.
func runBin(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("edgectl %v did not exit\n%s%s", args, out.String(), errb.String())
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// The exit status comes from the outcome, never from a message: a device
// whose refusal says "accepts" (as a usage error of cobra's does) is an
// outcome, exit 1, not a usage error.
func TestExitStatusIsTheOutcomeNotTheMessage(t *testing.T) {
	s := sim.StartForTest(t, map[string]string{"relay-1": "relay"})
	_, broker := startAgent(t, "gw-x", fmt.Sprintf("  - {id: relay-1, type: relay, driver: {url: %q}}\n", s.URL()))
	code, out, stderr := runBin(t, nil, "send", "--broker", broker, "--gateway", "gw-x", "--device", "relay-1",
		"--action", "open", "--fence", "3", "--json")
	if code != 1 || !strings.Contains(out+stderr, "a relay accepts set and toggle") {
		t.Fatalf("a refused action: exit %d, want 1 (the outcome)\n%s%s", code, out, stderr)
	}
	for _, args := range [][]string{{"fly"}, {"send", "extra"}, {"status", "--bogus"}, {"keygen", "--out"}} {
		if code, _, stderr := runBin(t, nil, args...); code != 2 {
			t.Errorf("edgectl %v: exit %d, want 2 (usage)\n%s", args, code, stderr)
		}
	}
}

// holdPublishes is a real broker's hook that holds every inbound publish
// (and so its PUBACK) until release is closed: a broker that has taken a
// command and not acknowledged it by the sender's deadline.
type holdPublishes struct {
	mochi.HookBase
	release chan struct{}
}

func (h *holdPublishes) ID() string { return "hold-publishes" }
func (h *holdPublishes) Provides(b byte) bool {
	return b == mochi.OnPublish
}
func (h *holdPublishes) OnPublish(_ *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	<-h.release
	return pk, nil
}

// A send whose command the broker took but had not acknowledged at the
// deadline says the outcome is unknown, why, until when the command may
// still run and how to learn its outcome; not "publish failed".
func TestSendNotAcknowledgedSaysOutcomeUnknown(t *testing.T) {
	addr := testkit.FreeAddr(t)
	srv := mochi.New(&mochi.Options{Logger: slog.New(slog.DiscardHandler)})
	hold := &holdPublishes{release: make(chan struct{})}
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	if err := srv.AddHook(hold, nil); err != nil {
		t.Fatal(err)
	}
	if err := srv.AddListener(listeners.NewTCP(listeners.Config{ID: "t", Address: addr})); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(hold.release); srv.Close() })
	code, out, stderr := runBin(t, nil, "send", "--broker", "tcp://"+addr, "--gateway", "gw-h", "--device", "pump-7",
		"--action", "set", "--param", "rpm=1200", "--fence", "3", "--timeout", "2s", "--op-id", "op-held")
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s%s", code, out, stderr)
	}
	for _, w := range []string{"device pump-7 op op-held: outcome unknown after --timeout 2s: the broker had not acknowledged the command",
		"never started after its expires_at", "send the same command again with --op-id op-held"} {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr lacks %q:\n%s", w, stderr)
		}
	}
	if strings.Contains(stderr, "publish failed") || strings.Contains(stderr, "context deadline exceeded") {
		t.Errorf("stderr words the outcome as a failure:\n%s", stderr)
	}
}

// The admin commands default to the agent's default admin address, and
// take EDGECTL_ADMIN; a flag given wins over the variable.
func TestAdminDefaultAndEnvironment(t *testing.T) {
	admin, _ := startAgent(t, "gw-a", "  - {id: pump-7, type: pump, driver: {url: \"http://127.0.0.1:1\"}}\n")
	code, out, stderr := runBin(t, []string{"EDGECTL_ADMIN=" + admin}, "status")
	if code != 0 || !strings.Contains(out, "pump-7") {
		t.Fatalf("status with EDGECTL_ADMIN: exit %d\n%s%s", code, out, stderr)
	}
	unreachable := "http://" + testkit.FreeAddr(t)
	if code, _, stderr := runBin(t, []string{"EDGECTL_ADMIN=" + unreachable}, "status", "--admin", admin); code != 0 {
		t.Fatalf("--admin must win over EDGECTL_ADMIN: exit %d\n%s", code, stderr)
	}
	if code, _, stderr := runBin(t, []string{"EDGECTL_ADMIN=" + unreachable}, "history", "--device", "pump-7"); code != 1 || !strings.Contains(stderr, unreachable) {
		t.Fatalf("history with EDGECTL_ADMIN: exit %d\n%s", code, stderr)
	}
	// Without either: the agent's default admin.listen (an agent may or
	// may not listen there on this machine; it is no usage error).
	code, _, stderr = runBin(t, []string{"EDGECTL_ADMIN="}, "status")
	if code != 0 && (code != 1 || !strings.Contains(stderr, "admin API http://127.0.0.1:9464 unreachable")) {
		t.Fatalf("status without --admin: exit %d, want the default http://127.0.0.1:9464\n%s", code, stderr)
	}
}
