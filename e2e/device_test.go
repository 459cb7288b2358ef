package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

func setFaults(t testing.TB, s *sim.Sim, f sim.Faults) {
	t.Helper()
	if err := s.SetFaults(f); err != nil {
		t.Fatal(err)
	}
}

// Invariants 1 and 6: a write that times out on a slow device is unknown;
// a newer owner's command sent at once is not sent until the first write is
// resolved, and the journal's fences are in order.
func TestTimeoutThenNewerOwnerWaits(t *testing.T) {
	d := pump("pump-7")
	d.timeout = "300ms"
	e := newEnv(t, d)
	e.start()
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", LatencyMS: 1500})
	e.send("pump-7", cmd("a-1", 41, "set", `{"rpm":100}`))
	e.send("pump-7", cmd("b-1", 42, "set", `{"rpm":200}`))
	u := e.result("a-1", 1)
	want(t, u, wire.StatusUnknown, wire.CodeOutcomeUnknown)
	// While a-1 is unresolved nothing else reaches the device.
	if n := e.res.count("b-1"); n != 0 {
		t.Fatalf("b-1 answered while a-1 is unknown")
	}
	fa := e.final("a-1")
	want(t, fa, wire.StatusApplied, wire.CodeOK)
	if fa.Duplicate {
		t.Fatal("the resolution of an unknown write is not a duplicate")
	}
	want(t, e.final("b-1"), wire.StatusApplied, wire.CodeOK)
	j := e.journal()
	if len(j) != 2 || j[0].OpID != "a-1" || j[1].OpID != "b-1" || j[0].Fence != 41 || j[1].Fence != 42 {
		t.Fatalf("journal: %+v", j)
	}
	if e.sim.Injected().Delayed < 2 {
		t.Fatalf("the latency fault did not happen: %+v", e.sim.Injected())
	}
	// A resend of a-1 gets the resolved outcome.
	e.send("pump-7", cmd("a-1", 41, "set", `{"rpm":100}`))
	r := e.result("a-1", 3)
	if !r.Duplicate || r.Code != wire.CodeOK {
		t.Fatalf("resend: %+v", r)
	}
}

// A dropped response makes the write unknown; it is resolved applied by
// asking the device, and published applied.
func TestDroppedResponseIsResolved(t *testing.T) {
	e := newEnv(t, pump("pump-7"))
	e.start()
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", DropResponseRate: 1})
	e.send("pump-7", cmd("op-1", 3, "set", `{"rpm":300}`))
	want(t, e.result("op-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	r := e.final("op-1")
	want(t, r, wire.StatusApplied, wire.CodeOK)
	if string(r.Output) != `{"rpm":300}` {
		t.Fatalf("output %s", r.Output)
	}
	if e.sim.Injected().Dropped == 0 {
		t.Fatal("no response was dropped")
	}
	if n := len(e.journal()); n != 1 {
		t.Fatalf("journal has %d entries", n)
	}
	setFaults(t, e.sim, sim.Faults{})
	e.send("pump-7", cmd("op-1", 3, "set", `{"rpm":300}`))
	if r := e.result("op-1", 3); !r.Duplicate || r.Code != wire.CodeOK {
		t.Fatalf("resend: %+v", r)
	}
}

// A hanging write is unknown; asking the device tombstones its key, so the
// held request can never land; the op is resent under a new key once the
// device answers, and applied exactly once.
func TestTombstonedKeyIsNeverApplied(t *testing.T) {
	d := pump("pump-7")
	d.timeout = "200ms"
	e := newEnv(t, d)
	e.start()
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", Hang: true})
	e.send("pump-7", cmd("op-1", 3, "set", `{"rpm":300}`))
	want(t, e.result("op-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	testkit.Eventually(t, 10*time.Second, "two keys tried", func() bool { return e.sim.Injected().Held >= 2 })
	setFaults(t, e.sim, sim.Faults{})
	r := e.final("op-1")
	want(t, r, wire.StatusApplied, wire.CodeOK)
	j := e.journal()
	if len(j) != 1 || strings.HasPrefix(j[0].Key, "op-1.1.") {
		t.Fatalf("journal %+v: want one entry under a later key", j)
	}
}

// Firmware down: device_unreachable, recorded like every final outcome
// (invariant 8): a resend once the firmware is back gets it replayed, and
// trying again is a new op_id. A 5xx is unknown, never
// device_unreachable.
func TestUnreachableAnd5xx(t *testing.T) {
	e := newEnv(t, pump("pump-7"), pump("pump-8"))
	e.start()
	// Point pump-8 at a port where nothing listens: every connection refused.
	down := e.sim.URL()
	e.sim.Close()
	e.send("pump-7", cmd("op-1", 3, "set", `{"rpm":300}`))
	r := e.final("op-1")
	want(t, r, wire.StatusFailed, wire.CodeDeviceUnreachable)
	if !strings.Contains(r.Reason, "could not be reached") {
		t.Fatalf("reason %q does not say the device could not be reached", r.Reason)
	}
	if code, _ := e.admin("/v1/devices/pump-7/ops/op-1"); code != http.StatusOK {
		t.Fatalf("device_unreachable was not recorded (admin %d)", code)
	}
	// Firmware back on the same address: the resend meets the record; a
	// new op_id is applied.
	s2 := sim.StartForTestWith(t, sim.Options{Devices: map[string]string{"pump-7": "pump", "pump-8": "pump"}}, strings.TrimPrefix(down, "http://"))
	e.sim = s2
	e.send("pump-7", cmd("op-1", 3, "set", `{"rpm":300}`))
	r = e.result("op-1", 2)
	want(t, r, wire.StatusFailed, wire.CodeDeviceUnreachable)
	if !r.Duplicate {
		t.Fatal("device_unreachable was not replayed from its record")
	}
	e.send("pump-7", cmd("op-1b", 3, "set", `{"rpm":300}`))
	want(t, e.final("op-1b"), wire.StatusApplied, wire.CodeOK)

	setFaults(t, e.sim, sim.Faults{Device: "pump-8", ErrorRate: 1})
	e.send("pump-8", cmd("op-2", 3, "set", `{"rpm":1}`))
	want(t, e.result("op-2", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	testkit.Eventually(t, 5*time.Second, "a 503", func() bool { return e.sim.Injected().Errors > 0 })
	setFaults(t, e.sim, sim.Faults{})
	want(t, e.final("op-2"), wire.StatusApplied, wire.CodeOK)
	for i := 1; i <= e.res.count("op-2"); i++ {
		if r := e.res.wait("op-2", i, time.Second); r.Code == wire.CodeDeviceUnreachable {
			t.Fatal("a 5xx ended device_unreachable")
		}
	}
}

// A device whose firmware hangs does not slow the others: 1000 commands to
// other devices complete while it hangs.
func TestHangingDeviceDoesNotBlockOthers(t *testing.T) {
	stuck := pump("stuck")
	// Each try of the stuck write is tombstoned and resent; with the
	// default bound (5 resends) it would end not_applied while the others
	// run. This test is about the others: the bound is raised so the
	// stuck write stays unresolved throughout.
	stuck.driver = "      resends: 100\n"
	devs := []devSpec{stuck}
	for i := 0; i < 4; i++ {
		devs = append(devs, pump(fmt.Sprintf("p%d", i)))
	}
	e := newEnv(t, devs...)
	e.start()
	setFaults(t, e.sim, sim.Faults{Device: "stuck", Hang: true})
	e.send("stuck", cmd("stuck-1", 1, "set", `{"rpm":1}`))
	testkit.Eventually(t, 5*time.Second, "stuck write held", func() bool { return e.sim.Injected().Held > 0 })
	var wg sync.WaitGroup
	for d := 0; d < 4; d++ {
		wg.Add(1)
		go func(d int) {
			defer wg.Done()
			for i := 0; i < 250; i++ {
				e.send(fmt.Sprintf("p%d", d), cmd(fmt.Sprintf("p%d-%d", d, i), 1, "set", fmt.Sprintf(`{"rpm":%d}`, i)))
			}
		}(d)
	}
	wg.Wait()
	for d := 0; d < 4; d++ {
		for i := 0; i < 250; i++ {
			want(t, e.final(fmt.Sprintf("p%d-%d", d, i)), wire.StatusApplied, wire.CodeOK)
		}
	}
	if e.res.count("stuck-1") > 1 {
		t.Fatal("the stuck write ended while the firmware hangs")
	}
	if f := e.res.wait("stuck-1", 1, time.Second); f.Status != wire.StatusUnknown {
		t.Fatalf("stuck write: %+v", f)
	}
	setFaults(t, e.sim, sim.Faults{})
	want(t, e.final("stuck-1"), wire.StatusApplied, wire.CodeOK)
}

// Invariant 6 with a device that cannot be asked: an unknown write holds
// the device until an operator resolves it; not applied is final and never
// resent.
func TestNonQueryableHeldUntilOperatorResolves(t *testing.T) {
	d := pump("pump-7")
	d.queryable = false
	d.idempotent = false
	d.timeout = "300ms"
	e := newEnv(t, d)
	e.start()
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", DropResponseRate: 1})
	e.send("pump-7", cmd("op-1", 3, "set", `{"rpm":300}`))
	e.send("pump-7", cmd("op-2", 3, "set", `{"rpm":400}`))
	want(t, e.result("op-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	if e.sim.Injected().Dropped == 0 {
		t.Fatal("the response was not dropped: the fault did not happen")
	}
	setFaults(t, e.sim, sim.Faults{})
	// Held: op-2 is not sent, however long we look (the admin API says pending).
	code, body := e.admin("/v1/devices/pump-7")
	var di wire.DeviceInfo
	json.Unmarshal(body, &di)
	if code != 200 || di.Pending != 1 || di.QueueDepth != 2 {
		t.Fatalf("device while held: %d %s", code, body)
	}
	post := func(op, body string) (int, string) {
		resp, err := http.Post("http://"+e.app.AdminAddr()+"/v1/devices/pump-7/ops/"+op+"/resolve", "application/json", bytes.NewBufferString(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return resp.StatusCode, b.String()
	}
	if c, _ := post("op-2", `{"applied":false}`); c != http.StatusConflict {
		t.Fatalf("resolving a queued op: %d, want 409", c)
	}
	if c, _ := post("op-1", `{"applied":"yes"}`); c != http.StatusBadRequest {
		t.Fatalf("bad body: %d, want 400", c)
	}
	if c, b := post("op-1", `{"applied":false}`); c != 200 {
		t.Fatalf("resolve: %d %s", c, b)
	}
	want(t, e.final("op-1"), wire.StatusFailed, wire.CodeNotApplied)
	want(t, e.final("op-2"), wire.StatusApplied, wire.CodeOK)
	if c, _ := post("op-1", `{"applied":true}`); c != http.StatusConflict {
		t.Fatalf("resolving twice: %d, want 409", c)
	}
	// The journal: op-1 really was applied by the device (the drop came
	// after), which is why the operator's word is needed; the agent never resent it.
	if got := strings.Join(e.journalOps(), ","); got != "op-1,op-2" {
		t.Fatalf("journal %s", got)
	}
	if n := e.sim.Requests("pump-7", e.journal()[0].Key); n != 1 {
		t.Fatalf("op-1 was sent %d times", n)
	}
}
