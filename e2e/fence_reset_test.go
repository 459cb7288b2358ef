package e2e

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// A way back from a poisoned fence (docs/protocol.md §4, docs/operations.md
// "A poisoned fence"): on a gateway without signatures a rogue barrier at
// 2^63-1 locks every owner out; `edge-agent fence reset` (offline, audited)
// sets it back, and the new generation's barrier and commands are applied.
func TestFenceResetUndoesAPoisonedFence(t *testing.T) {
	e := newEnv(t, pump("pump-7"))
	e.start()
	e.send("pump-7", cmd("own-1", 40, "set", `{"rpm":100}`))
	want(t, e.result("own-1", 1), wire.StatusApplied, wire.CodeOK)
	e.send("pump-7", cmd("rogue", 9223372036854775807, wire.ActionFence, ""))
	want(t, e.result("rogue", 1), wire.StatusApplied, wire.CodeOK)
	e.send("pump-7", cmd("own-2", 41, "set", `{"rpm":200}`))
	want(t, e.result("own-2", 1), wire.StatusRejected, wire.CodeStaleFence)

	bin := testkit.Build(t, "../cmd/edge-agent")
	run := func(args ...string) (int, string) {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0, string(out)
	}
	reset := []string{"fence", "reset", "--data-dir", e.dataDir, "--device", "pump-7", "--to", "41", "--reason", "rogue barrier at 2^63-1"}
	// Online: refused within 2 s, the store untouched.
	start := time.Now()
	if code, out := run(reset...); code != 1 || time.Since(start) > 3*time.Second || !strings.Contains(out, "held by another process") {
		t.Fatalf("reset while the agent runs: exit %d after %s\n%s", code, time.Since(start), out)
	}
	e.stop()
	if code, out := run("fence", "reset", "--data-dir", e.dataDir, "--device", "pump-7", "--to", "41"); code != 2 || !strings.Contains(out, "--reason") {
		t.Fatalf("reset without a reason: exit %d\n%s", code, out)
	}
	code, out := run(reset...)
	if code != 0 || !strings.Contains(out, "last_fence 9223372036854775807 -> 41") {
		t.Fatalf("reset: exit %d\n%s", code, out)
	}
	if code, out := run(reset...); code != 1 || !strings.Contains(out, "must lower last_fence") {
		t.Fatalf("a second reset to the same fence: exit %d\n%s", code, out)
	}
	code, out = run("inspect", "--data-dir", e.dataDir, "--device", "pump-7")
	if code != 0 || !strings.Contains(out, "last_fence 41") || !strings.Contains(out, "AUDIT: last_fence reset from 9223372036854775807 to 41 by ") ||
		!strings.Contains(out, "rogue barrier at 2^63-1") {
		t.Fatalf("inspect after the reset: exit %d\n%s", code, out)
	}
	opID := out[strings.Index(out, "fence-reset:"):]
	opID = strings.Fields(opID)[0]

	// A new generation: barrier first, then commands.
	e.start()
	e.send("pump-7", cmd("new-fence", 42, wire.ActionFence, ""))
	r := e.result("new-fence", 1)
	want(t, r, wire.StatusApplied, wire.CodeOK)
	if r.LastFence != 42 {
		t.Fatalf("barrier after the reset: %+v", r)
	}
	e.send("pump-7", cmd("own-3", 42, "set", `{"rpm":300}`))
	want(t, e.result("own-3", 1), wire.StatusApplied, wire.CodeOK)
	// The audit entry is in the device's recorded history.
	if code, body := e.admin("/v1/devices/pump-7/ops/" + opID); code != 200 || !strings.Contains(string(body), "rogue barrier") {
		t.Fatalf("audit entry %s through the admin API: %d %s", opID, code, body)
	}
}
