package e2e

import (
	"strings"
	"testing"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
)

// The agent's rtuovertcp:// path end to end: the pump of
// TestModbusPumpEndToEnd on the simulator's RTU-over-TCP listener (RTU
// frames with their CRC on the wire; the simulator's Modbus TCP listener
// is not even started). Applied; a stale fence rejected before the device
// (invariant 1); a write left without an answer read back both ways:
// applied, and not applied, then never resent (invariants 2 and 6:
// unknown first, never failure, until the read-back decides).
func TestModbusRTUPumpEndToEnd(t *testing.T) {
	d := modbusPump("pump-7")
	d.modbusRTU = true
	e := newEnv(t, d)
	e.start()
	if e.sim.ModbusAddr() != "" || e.sim.ModbusRTUAddr() == "" {
		t.Fatalf("the simulator's listeners: tcp %q, rtu %q; want rtu only", e.sim.ModbusAddr(), e.sim.ModbusRTUAddr())
	}

	e.send("pump-7", cmd("r-1", 5, "set", `{"rpm":1200}`))
	r := e.final("r-1")
	want(t, r, wire.StatusApplied, wire.CodeOK)
	if string(r.Output) != `{"rpm":1200}` || e.rpm("pump-7") != `{"rpm":1200}` {
		t.Fatalf("output %s, the hardware %s; want {\"rpm\":1200}", r.Output, e.rpm("pump-7"))
	}
	if j := e.journal(); len(j) != 1 || j[0].Modbus == nil || string(j[0].Params) != `{"rpm":1200}` {
		t.Fatalf("journal: %+v", j)
	}

	// A stale fence never reaches the device (invariant 1).
	e.send("pump-7", cmd("r-2", 4, "set", `{"rpm":10}`))
	want(t, e.final("r-2"), wire.StatusRejected, wire.CodeStaleFence)

	// No answer after applying: unknown, then read back applied.
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", HangAfterApply: true})
	e.send("pump-7", cmd("r-3", 6, "set", `{"rpm":1500}`))
	want(t, e.result("r-3", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	setFaults(t, e.sim, sim.Faults{})
	r = e.final("r-3")
	want(t, r, wire.StatusApplied, wire.CodeOK)
	if string(r.Output) != `{"rpm":1500}` || !strings.Contains(r.Reason, "read back") {
		t.Fatalf("r-3: %+v", r)
	}

	// No answer, not applied: unknown, then read back not applied:
	// failed/not_applied, and a resend is answered from the record.
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", Hang: true})
	e.send("pump-7", cmd("r-4", 6, "set", `{"rpm":1600}`))
	want(t, e.result("r-4", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	setFaults(t, e.sim, sim.Faults{})
	r = e.final("r-4")
	want(t, r, wire.StatusFailed, wire.CodeNotApplied)
	if !strings.Contains(r.Reason, `still holds the values from before the write {"register 0":1500}`) {
		t.Fatalf("r-4 reason: %s", r.Reason)
	}
	e.send("pump-7", cmd("r-4", 6, "set", `{"rpm":1600}`))
	if r := e.result("r-4", 3); !r.Duplicate || r.Code != wire.CodeNotApplied {
		t.Fatalf("a resend of r-4: %+v", r)
	}
	if in := e.sim.Injected(); in.HeldAfterApply != 1 || in.Held != 1 {
		t.Fatalf("the faults were not injected: %+v", in)
	}
	if j := e.journal(); len(j) != 2 || string(j[1].Params) != `{"rpm":1500}` || e.rpm("pump-7") != `{"rpm":1500}` {
		t.Fatalf("journal %+v, the hardware %s; want r-1 and r-3 only", j, e.rpm("pump-7"))
	}
}
