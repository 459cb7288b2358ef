package device_test

import (
	"context"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/device"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// The Modbus driver with url: rtuovertcp:// against the simulator's
// RTU-over-TCP listener: real TCP, the library's RTU client, RTU frames
// with their CRC on the wire, no mocks.

func startModbusRTUSim(t *testing.T) *sim.Sim {
	t.Helper()
	s := sim.StartForTest(t, simDevices)
	if err := s.StartModbusRTU("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	return s
}

func rtuPumpConfig(s *sim.Sim) device.ModbusDevice {
	cfg := pumpConfig(s, "pump-7")
	cfg.URL = "rtuovertcp://" + s.ModbusRTUAddr()
	return cfg
}

// Each outcome of docs/protocol.md §11 over RTU framing: applied with the
// state read back, a refusal before and by the hardware, exceptions
// mapped, silences and a reset unknown, a dial that fails not sent, and a
// unit no device answers to unknown (on a serial line nobody answers).
func TestModbusRTUOverTCPOutcomes(t *testing.T) {
	s := startModbusRTUSim(t)
	m := modbusFor(t, rtuPumpConfig(s))
	res := m.Apply(context.Background(), write("k1", `{"rpm":1200}`))
	wantResult(t, res, device.Applied, 1, "")
	if string(res.State) != `{"rpm":1200,"running":true}` {
		t.Fatalf("state = %s", res.State)
	}
	res = m.Apply(context.Background(), device.Write{Device: "pump-7", OpID: "o2", Key: "k2", Action: "off"})
	wantResult(t, res, device.Applied, 1, "")
	if string(res.State) != `{"rpm":0,"running":false}` || simState(t, s, "pump-7") != `{"rpm":0}` {
		t.Fatalf("after off: state %s, the hardware %s", res.State, simState(t, s, "pump-7"))
	}
	if j := s.Journal(); len(j) != 2 || j[0].Modbus == nil || j[0].Modbus.Unit == 0 || j[1].Action != "stop" {
		t.Fatalf("journal = %+v", j)
	}

	wantResult(t, m.Apply(context.Background(), write("k", `{"rpm":70000}`)), device.Refused, 0, "param rpm: 70000 is out of the uint16 range")
	wantResult(t, m.Apply(context.Background(), write("k", `{"rpm":7000}`)), device.Refused, 1, "illegal data value")
	for _, tc := range []struct {
		f       sim.Faults
		outcome device.Outcome
		reason  string
	}{
		{sim.Faults{Exception: 2}, device.Refused, "illegal data address"},
		{sim.Faults{Exception: 4}, device.Unknown, "server device failure"},
		{sim.Faults{Exception: 11}, device.Unknown, "gateway target device failed to respond"},
		{sim.Faults{Hang: true}, device.Unknown, "no answer within 300ms"},
		{sim.Faults{HangAfterApply: true}, device.Unknown, "no answer within 300ms"},
		{sim.Faults{ResetRate: 1}, device.Unknown, "connection closed without an answer"},
	} {
		tc.f.Device = "pump-7"
		setFaults(t, s, tc.f)
		wantResult(t, m.Apply(context.Background(), write("k", `{"rpm":100}`)), tc.outcome, 1, tc.reason)
		setFaults(t, s, sim.Faults{})
	}
	if in := s.Injected(); in.Exceptions != 3 || in.Held != 1 || in.HeldAfterApply != 1 || in.Resets != 1 {
		t.Fatalf("injected: %+v", in)
	}
	// hang_after_apply applied 100; the driver dials again after the
	// silences and the reset: the next write goes through.
	wantResult(t, m.Apply(context.Background(), write("k", `{"rpm":150}`)), device.Applied, 1, "")
	if got := simState(t, s, "pump-7"); got != `{"rpm":150}` {
		t.Fatalf("the hardware: %s", got)
	}

	// A unit no device has: the write may have reached a device that did
	// not answer, so it is unknown; and nothing was applied.
	nobody := rtuPumpConfig(s)
	nobody.UnitID = 200
	wantResult(t, modbusFor(t, nobody).Apply(context.Background(), write("k", `{"rpm":5}`)), device.Unknown, 1, "no answer within 300ms")

	dead := rtuPumpConfig(s)
	dead.URL = "rtuovertcp://" + closedPort(t)[len("http://"):]
	wantResult(t, modbusFor(t, dead).Apply(context.Background(), write("k", `{"rpm":1}`)), device.NotSent, 0, "could not reach the device: dial rtuovertcp://")
	if got := simState(t, s, "pump-7"); got != `{"rpm":150}` {
		t.Fatalf("the hardware after the unanswered unit: %s", got)
	}
}

// Read-back over RTU framing, both ways a write can be after a silence:
// applied (hang_after_apply: the points hold the intended value) and not
// applied (hang: they hold the reading from before).
func TestModbusRTUOverTCPReadBack(t *testing.T) {
	s := startModbusRTUSim(t)
	m := modbusFor(t, rtuPumpConfig(s))
	wantResult(t, m.Apply(context.Background(), write("k0", `{"rpm":100}`)), device.Applied, 1, "")
	for _, tc := range []struct {
		name  string
		f     sim.Faults
		rpm   string
		after string
	}{
		{"applied", sim.Faults{HangAfterApply: true}, `{"rpm":1200}`, `{"register 0":1200}`},
		{"not applied", sim.Faults{Hang: true}, `{"rpm":1300}`, `{"register 0":1200}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := write("k-"+tc.name, tc.rpm)
			var err error
			if w.Before, err = m.Before(context.Background(), w); err != nil {
				t.Fatal(err)
			}
			tc.f.Device = "pump-7"
			setFaults(t, s, tc.f)
			if res := m.Apply(context.Background(), w); res.Outcome != device.Unknown {
				t.Fatalf("apply: %s %s", res.Outcome, res.Reason)
			}
			setFaults(t, s, sim.Faults{})
			q, err := m.ReadBack(context.Background(), w)
			if err != nil {
				t.Fatal(err)
			}
			if rb := q.ReadBack; rb == nil || string(rb.After) != tc.after || string(q.State) != `{"rpm":1200,"running":true}` {
				t.Fatalf("read-back = %+v (after %s), want after %s", q, rb.After, tc.after)
			}
		})
	}
	if in := s.Injected(); in.Held != 1 || in.HeldAfterApply != 1 {
		t.Fatalf("injected: %+v", in)
	}
}

// A connection the device dropped while idle is found out by the probe
// read before the write over RTU framing too: without the probe the write
// would be unknown.
func TestModbusRTUOverTCPStaleConnectionIsProbed(t *testing.T) {
	s := startModbusRTUSim(t)
	for _, tc := range []struct {
		probe time.Duration
		want  device.Outcome
	}{{20 * time.Millisecond, device.Applied}, {-1, device.Unknown}} {
		px := testkit.NewProxy(t, s.ModbusRTUAddr())
		cfg := rtuPumpConfig(s)
		cfg.URL = "rtuovertcp://" + px.Addr()
		m := newModbus(t, device.ModbusOptions{ProbeIdle: tc.probe, Devices: map[string]device.ModbusDevice{"pump-7": cfg}})
		wantResult(t, m.Apply(context.Background(), write("k", `{"rpm":10}`)), device.Applied, 1, "")
		px.Cut()
		time.Sleep(50 * time.Millisecond) // idle longer than the probe threshold (this is the condition, not a synchronisation)
		if got := m.Apply(context.Background(), write("k", `{"rpm":20}`)); got.Outcome != tc.want {
			t.Fatalf("probe %v: %s (%s), want %s", tc.probe, got.Outcome, got.Reason, tc.want)
		}
	}
}
