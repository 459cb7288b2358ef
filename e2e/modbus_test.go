package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/simonvetter/modbus"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/store"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// modbusPump is a pump behind the simulator's Modbus TCP listener, read
// back after an unknown write (docs/protocol.md §11's driver block).
func modbusPump(id string) devSpec {
	return devSpec{id: id, typ: "pump", modbus: `      timeout: 300ms
      verify: readback
      settle: 1500ms
      actions:
        set:  {params: {rpm: {register: 0, type: uint16, scale: 1}}}
        stop: {register: 0, value: 0}
        off:  {coil: 0, value: false}
      state: {rpm: {register: 0, type: uint16}}
`}
}

// thirdParty writes holding register 0 of dev directly over Modbus: a
// writer the gateway does not know about.
func thirdParty(t *testing.T, s *sim.Sim, dev string, v uint16) {
	t.Helper()
	c, err := modbus.NewClient(&modbus.ClientConfiguration{URL: "tcp://" + s.ModbusAddr(), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Open(); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	u, _ := s.Unit(dev)
	c.SetUnitId(u)
	if err := c.WriteRegister(0, v); err != nil {
		t.Fatal(err)
	}
}

func (e *env) rpm(dev string) string {
	e.t.Helper()
	st, err := e.sim.State(dev)
	if err != nil {
		e.t.Fatal(err)
	}
	return string(st)
}

// A pump driven through the agent over Modbus TCP, end to end: applied
// (with the same state as the HTTP pump beside it), a stale fence
// rejected, exceptions mapped, an unknown write resolved by read-back both
// ways, and a third-party write held for the operator with both readings
// in the record. Invariants 1 (fence order), 2 (no resend after a write
// read back as not applied) and 6 (nothing else is sent while a write is
// unknown; unknown is never failure).
func TestModbusPumpEndToEnd(t *testing.T) {
	e := newEnv(t, modbusPump("pump-7"), pump("pump-8"))
	e.start()

	// Applied; the DeviceState and output are the HTTP pump's.
	e.send("pump-7", cmd("m-1", 5, "set", `{"rpm":1200}`))
	e.send("pump-8", cmd("h-1", 5, "set", `{"rpm":1200}`))
	m, h := e.final("m-1"), e.final("h-1")
	want(t, m, wire.StatusApplied, wire.CodeOK)
	if string(m.Output) != `{"rpm":1200}` || string(m.Output) != string(h.Output) {
		t.Fatalf("output over Modbus %s, over HTTP %s: want both {\"rpm\":1200}", m.Output, h.Output)
	}
	if e.rpm("pump-7") != `{"rpm":1200}` {
		t.Fatalf("the hardware: %s", e.rpm("pump-7"))
	}
	if j := e.journal(); len(j) != 2 || j[0].Modbus == nil && j[1].Modbus == nil {
		t.Fatalf("journal: %+v", j)
	}

	// A stale fence never reaches the device (invariant 1).
	e.send("pump-7", cmd("m-2", 4, "set", `{"rpm":10}`))
	want(t, e.final("m-2"), wire.StatusRejected, wire.CodeStaleFence)

	// Exceptions mapped: the hardware refuses 7000 (illegal data value)
	// and an injected illegal address: device_error; 70000 does not fit a
	// uint16 and is refused before anything is sent, naming the param.
	e.send("pump-7", cmd("m-3", 5, "set", `{"rpm":7000}`))
	r := e.final("m-3")
	want(t, r, wire.StatusFailed, wire.CodeDeviceError)
	if !strings.Contains(r.Reason, "illegal data value") {
		t.Fatalf("m-3 reason: %s", r.Reason)
	}
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", Exception: 2})
	e.send("pump-7", cmd("m-4", 5, "set", `{"rpm":100}`))
	want(t, e.final("m-4"), wire.StatusFailed, wire.CodeDeviceError)
	if e.sim.Injected().Exceptions != 1 {
		t.Fatalf("the exception was not injected: %+v", e.sim.Injected())
	}
	setFaults(t, e.sim, sim.Faults{})
	e.send("pump-7", cmd("m-5", 5, "set", `{"rpm":70000}`))
	r = e.final("m-5")
	want(t, r, wire.StatusFailed, wire.CodeDeviceError)
	if !strings.Contains(r.Reason, "param rpm: 70000 is out of the uint16 range") {
		t.Fatalf("m-5 reason: %s", r.Reason)
	}
	if n := len(e.journal()); n != 2 || e.rpm("pump-7") != `{"rpm":1200}` {
		t.Fatalf("a refused write changed the hardware: %d writes, %s", n, e.rpm("pump-7"))
	}

	// No response after applying: unknown, then read back applied.
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", HangAfterApply: true})
	e.send("pump-7", cmd("m-6", 6, "set", `{"rpm":1500}`))
	want(t, e.result("m-6", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	setFaults(t, e.sim, sim.Faults{})
	r = e.final("m-6")
	want(t, r, wire.StatusApplied, wire.CodeOK)
	if string(r.Output) != `{"rpm":1500}` || !strings.Contains(r.Reason, "read back") || r.Duplicate {
		t.Fatalf("m-6: %+v", r)
	}

	// Gateway path unavailable (the write did not get through): unknown,
	// then read back not applied: failed/not_applied, never resent.
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", Exception: 10})
	e.send("pump-7", cmd("m-7", 6, "set", `{"rpm":1600}`))
	want(t, e.result("m-7", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	// Invariant 6: a command behind it waits for it.
	e.send("pump-7", cmd("m-8", 6, "set", `{"rpm":1700}`))
	setFaults(t, e.sim, sim.Faults{})
	r = e.final("m-7")
	want(t, r, wire.StatusFailed, wire.CodeNotApplied)
	if !strings.Contains(r.Reason, `still holds the values from before the write {"register 0":1500}`) {
		t.Fatalf("m-7 reason: %s", r.Reason)
	}
	want(t, e.final("m-8"), wire.StatusApplied, wire.CodeOK)
	e.send("pump-7", cmd("m-7", 6, "set", `{"rpm":1600}`))
	if r := e.result("m-7", 3); !r.Duplicate || r.Code != wire.CodeNotApplied {
		t.Fatalf("a resend of m-7: %+v", r)
	}
	for _, j := range e.journal() {
		if string(j.Params) == `{"rpm":1600}` {
			t.Fatalf("m-7 reached the hardware: %+v", j)
		}
	}

	// Something else writes while the outcome is unknown: the read-back
	// finds a third value and holds the write for the operator, with both
	// readings in its record; nothing else is sent meanwhile.
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", Hang: true})
	e.send("pump-7", cmd("m-9", 7, "set", `{"rpm":1800}`))
	want(t, e.result("m-9", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	setFaults(t, e.sim, sim.Faults{})
	thirdParty(t, e.sim, "pump-7", 999)
	e.send("pump-7", cmd("m-10", 7, "set", `{"rpm":100}`))
	var rec wire.Result
	testkit.Eventually(t, 20*time.Second, "m-9's record holds both readings", func() bool {
		code, b := e.admin("/v1/devices/pump-7/ops/m-9")
		return code == http.StatusOK && json.Unmarshal(b, &rec) == nil && strings.Contains(rec.Reason, "neither")
	})
	if rec.Status != wire.StatusUnknown || !strings.Contains(rec.Reason, `holds {"register 0":999}, neither the intended {"register 0":1800} nor {"register 0":1700} from before the write`) {
		t.Fatalf("m-9's record: %+v", rec)
	}
	if n := e.res.count("m-10"); n != 0 {
		t.Fatal("m-10 was answered while m-9 is held")
	}
	if e.rpm("pump-7") != `{"rpm":999}` {
		t.Fatalf("the hardware: %s", e.rpm("pump-7"))
	}
	// The resolve API refuses ops that are not held, on a device the agent reads back.
	resp, err := http.Post("http://"+e.app.AdminAddr()+"/v1/devices/pump-7/ops/m-8/resolve", "application/json", strings.NewReader(`{"applied":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("resolving m-8 (not held): %d, want 409", resp.StatusCode)
	}
	resolve(t, e, "pump-7", "m-9", false)
	want(t, e.final("m-9"), wire.StatusFailed, wire.CodeNotApplied)
	want(t, e.final("m-10"), wire.StatusApplied, wire.CodeOK)
	if e.rpm("pump-7") != `{"rpm":100}` {
		t.Fatalf("the hardware after m-10: %s", e.rpm("pump-7"))
	}
}

// Invariant 3 for read-back: the reading before the write is durable in
// the pending record, so a write interrupted by a crash is resolved by
// read-back after the restart, both ways: killed before the write was
// sent (read back as before: not applied, never sent) and after it (read
// back as intended: applied).
func TestModbusCrashRecoveredByReadBack(t *testing.T) {
	for _, tc := range []struct {
		point   string
		status  wire.Status
		code    wire.Code
		journal int
	}{
		{"after_pending", wire.StatusFailed, wire.CodeNotApplied, 0},
		{"after_write", wire.StatusApplied, wire.CodeOK, 1},
	} {
		t.Run(tc.point, func(t *testing.T) {
			e := newEnv(t, modbusPump("pump-7"))
			e.startProc("EDGE_AGENT_CRASH=" + tc.point + ":op-1")
			e.send("pump-7", cmd("op-1", 7, "set", `{"rpm":700}`))
			if code := e.waitExit(20 * time.Second); code != -1 {
				t.Fatalf("agent exited %d, want killed by SIGKILL", code)
			}
			lf, rec := e.lastFence("pump-7")
			if lf != 7 || rec.Status != store.OpPending || string(rec.Before) != `{"register 0":0}` {
				t.Fatalf("after the crash: last_fence %d, op %s, before %s; want 7, pending, {\"register 0\":0}", lf, rec.Status, rec.Before)
			}
			if n := len(e.journal()); n != tc.journal {
				t.Fatalf("journal has %d writes before the restart, want %d", n, tc.journal)
			}
			e.start()
			want(t, e.final("op-1"), tc.status, tc.code)
			if n := len(e.journal()); n != tc.journal {
				t.Fatalf("journal has %d writes after recovery, want %d (never resent)", n, tc.journal)
			}
		})
	}
}

// Without verify: readback a Modbus device cannot be asked: an unknown
// write holds it until an operator resolves it, as queryable: false does.
func TestModbusWithoutReadBackHoldsForTheOperator(t *testing.T) {
	d := modbusPump("pump-7")
	d.modbus = strings.Replace(strings.Replace(d.modbus, "      verify: readback\n", "", 1), "      settle: 1500ms\n", "", 1)
	e := newEnv(t, d)
	e.start()
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", HangAfterApply: true})
	e.send("pump-7", cmd("op-1", 3, "set", `{"rpm":300}`))
	want(t, e.result("op-1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	setFaults(t, e.sim, sim.Faults{})
	e.send("pump-7", cmd("op-2", 3, "set", `{"rpm":400}`))
	testkit.Eventually(t, 10*time.Second, "the write is held", func() bool {
		_, b := e.admin("/v1/devices/pump-7")
		return strings.Contains(string(b), `"pending":1`)
	})
	if e.res.count("op-1") != 1 || e.res.count("op-2") != 0 {
		t.Fatal("something was decided without the operator")
	}
	resolve(t, e, "pump-7", "op-1", true)
	want(t, e.final("op-1"), wire.StatusApplied, wire.CodeOK)
	want(t, e.final("op-2"), wire.StatusApplied, wire.CodeOK)
}

// The policy sees a Modbus device's state as read from its registers, in
// the same shape as an HTTP device's: ramp-limit judges each step from the
// rpm the pump's register holds, also after a third party changed it.
func TestModbusStateReachesThePolicy(t *testing.T) {
	dir := plugins(t)
	e := newEnv(t, withPolicy(modbusPump("pump-7"), "ramp-limit", `{param: rpm, max_step: 200}`))
	e.extra = "plugins:\n  dir: " + dir + "\n"
	e.start()
	e.send("pump-7", cmd("p-1", 1, "set", `{"rpm":200}`))
	want(t, e.final("p-1"), wire.StatusApplied, wire.CodeOK)
	e.send("pump-7", cmd("p-2", 1, "set", `{"rpm":600}`))
	want(t, e.final("p-2"), wire.StatusRejected, wire.CodePolicyDenied)
	e.send("pump-7", cmd("p-3", 1, "set", `{"rpm":400}`))
	want(t, e.final("p-3"), wire.StatusApplied, wire.CodeOK)
	// The state is the one read after the last applied write (the last
	// confirmed state as the agent knows it): a third party's write in
	// between is not seen by the policy (400 -> 500 is allowed), and the
	// state read after the next write shows the pump's register again.
	thirdParty(t, e.sim, "pump-7", 1000)
	e.send("pump-7", cmd("p-4", 1, "set", `{"rpm":500}`))
	if r := e.final("p-4"); r.Code != wire.CodeOK || string(r.Output) != `{"rpm":500}` {
		t.Fatalf("p-4: %+v", r)
	}
}
