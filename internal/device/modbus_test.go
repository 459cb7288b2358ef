package device_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/simonvetter/modbus"

	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/device"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// The Modbus driver against the firmware simulator's Modbus TCP listener:
// real TCP, the real library on both sides, no mocks.

func startModbusSim(t *testing.T) *sim.Sim {
	t.Helper()
	s := sim.StartForTest(t, simDevices)
	if err := s.StartModbus("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	return s
}

// pumpConfig is the pump of docs/protocol.md §7: set writes rpm to
// holding register 0; on/off the run coil; state rpm and running.
func pumpConfig(s *sim.Sim, dev string) device.ModbusDevice {
	u, _ := s.Unit(dev)
	return device.ModbusDevice{
		URL: "tcp://" + s.ModbusAddr(), UnitID: u, Timeout: 300 * time.Millisecond,
		ReadBack: true, Settle: 50 * time.Millisecond,
		Actions: map[string]device.ModbusAction{
			"set": {Params: map[string]device.ModbusPoint{"rpm": {Address: 0, Type: "uint16"}}},
			"on":  {Fixed: &device.ModbusFixed{Point: device.ModbusPoint{Coil: true}, Value: true}},
			"off": {Fixed: &device.ModbusFixed{Point: device.ModbusPoint{Coil: true}, Value: false}},
		},
		State: map[string]device.ModbusPoint{"rpm": {Address: 0}, "running": {Coil: true}},
	}
}

func newModbus(t *testing.T, opts device.ModbusOptions) *device.Modbus {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	m, err := device.NewModbus(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func modbusFor(t *testing.T, cfg device.ModbusDevice) *device.Modbus {
	return newModbus(t, device.ModbusOptions{Devices: map[string]device.ModbusDevice{"pump-7": cfg}})
}

func simState(t *testing.T, s *sim.Sim, dev string) string {
	t.Helper()
	st, err := s.State(dev)
	if err != nil {
		t.Fatal(err)
	}
	return string(st)
}

func TestModbusApplied(t *testing.T) {
	s := startModbusSim(t)
	m := modbusFor(t, pumpConfig(s, "pump-7"))
	res := m.Apply(context.Background(), write("k1", `{"rpm":1200}`))
	wantResult(t, res, device.Applied, 1, "")
	if string(res.State) != `{"rpm":1200,"running":true}` {
		t.Fatalf("state = %s", res.State)
	}
	if got := simState(t, s, "pump-7"); got != `{"rpm":1200}` {
		t.Fatalf("the hardware: %s", got)
	}
	res = m.Apply(context.Background(), device.Write{Device: "pump-7", OpID: "o2", Key: "k2", Action: "off"})
	wantResult(t, res, device.Applied, 1, "")
	if string(res.State) != `{"rpm":0,"running":false}` {
		t.Fatalf("state after off = %s", res.State)
	}
	if j := s.Journal(); len(j) != 2 || j[0].Modbus == nil || j[1].Action != "stop" {
		t.Fatalf("journal = %+v", j)
	}
	if !m.Queryable("pump-7") || !m.ReadsBack("pump-7") {
		t.Fatal("verify: readback makes the device queryable")
	}
	if _, err := m.Query(context.Background(), "pump-7", "k1"); !errors.Is(err, device.ErrNotQueryable) {
		t.Fatalf("Query: %v, want ErrNotQueryable (Modbus has no keys)", err)
	}
}

// A value that does not fit is refused before anything is sent: the
// driver points at an address nothing listens on, and still answers
// Refused (a dial would have made it NotSent), naming the param.
func TestModbusRefusedBeforeSending(t *testing.T) {
	s := startModbusSim(t)
	cfg := pumpConfig(s, "pump-7")
	cfg.URL = "tcp://" + strings.TrimPrefix(closedPort(t), "http://")
	cfg.Actions["temp"] = device.ModbusAction{Params: map[string]device.ModbusPoint{"c": {Address: 2, Type: "int16", Scale: 0.1}}}
	m := modbusFor(t, cfg)
	for _, tc := range []struct{ action, params, reason string }{
		{"set", `{"rpm":70000}`, "param rpm: 70000 is out of the uint16 range 0..65535 (register 0)"},
		{"set", `{"rpm":-1}`, "param rpm: -1 is out of the uint16 range"},
		{"set", `{"rpm":12.5}`, "param rpm: 12.5 is not an integer"},
		{"set", `{"rpm":"fast"}`, `param rpm: "fast" is not a number`},
		{"set", `{}`, "param rpm: required by action set"},
		{"set", `{"rpm":1,"x":2}`, "param x: action set does not write it"},
		{"temp", `{"c":3276.8}`, "param c: 3276.8 / scale 0.1: 32768 is out of the int16 range"},
		{"jump", `{}`, `action "jump" is not configured for pump-7 (it has off, on, set, temp)`},
	} {
		res := m.Apply(context.Background(), device.Write{Device: "pump-7", OpID: "o", Key: "k", Action: tc.action, Params: json.RawMessage(tc.params)})
		wantResult(t, res, device.Refused, 0, tc.reason)
		if _, err := m.Before(context.Background(), device.Write{Device: "pump-7", Action: tc.action, Params: json.RawMessage(tc.params)}); !errors.Is(err, device.ErrRefused) || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("Before %s %s: %v, want ErrRefused naming %q", tc.action, tc.params, err, tc.reason)
		}
	}
	if res := m.Apply(context.Background(), write("k", `{"rpm":5}`)); res.Outcome != device.NotSent {
		t.Fatalf("a value that fits goes to the (dead) device: %s %s", res.Outcome, res.Reason)
	}
	if len(s.Journal()) != 0 {
		t.Fatal("something reached the hardware")
	}
}

// docs/protocol.md's mapping of Modbus exceptions: illegal function,
// address, value and busy are refusals (nothing happened); any other
// exception may have left something done: unknown.
func TestModbusExceptionsMapped(t *testing.T) {
	s := startModbusSim(t)
	m := modbusFor(t, pumpConfig(s, "pump-7"))
	for _, tc := range []struct {
		code    int
		outcome device.Outcome
		reason  string
	}{
		{1, device.Refused, "illegal function"},
		{2, device.Refused, "illegal data address"},
		{3, device.Refused, "illegal data value"},
		{6, device.Refused, "server device busy"},
		{4, device.Unknown, "server device failure"},
		{5, device.Unknown, "request acknowledged"},
		{10, device.Unknown, "gateway path unavailable"},
		{11, device.Unknown, "gateway target device failed to respond"},
	} {
		setFaults(t, s, sim.Faults{Device: "pump-7", Exception: tc.code})
		wantResult(t, m.Apply(context.Background(), write("k", `{"rpm":100}`)), tc.outcome, 1, tc.reason)
	}
	if got := s.Injected().Exceptions; got != 8 {
		t.Fatalf("exceptions injected: %d, want 8", got)
	}
	setFaults(t, s, sim.Faults{})
	// The hardware's own refusal: 7000 fits a uint16 but not the pump.
	wantResult(t, m.Apply(context.Background(), write("k", `{"rpm":7000}`)), device.Refused, 1, "illegal data value")
	if got := simState(t, s, "pump-7"); got != `{"rpm":0}` {
		t.Fatalf("a refused write changed the hardware: %s", got)
	}
}

func TestModbusUnknownAndNotSent(t *testing.T) {
	s := startModbusSim(t)
	m := modbusFor(t, pumpConfig(s, "pump-7"))
	for _, tc := range []struct {
		name   string
		f      sim.Faults
		reason string
	}{
		{"no response, not applied", sim.Faults{Hang: true}, "no answer within 300ms"},
		{"no response after applying", sim.Faults{HangAfterApply: true}, "no answer within 300ms"},
		{"connection reset", sim.Faults{ResetRate: 1}, "connection closed without an answer"},
	} {
		tc.f.Device = "pump-7"
		setFaults(t, s, tc.f)
		wantResult(t, m.Apply(context.Background(), write("k", `{"rpm":100}`)), device.Unknown, 1, tc.reason)
		setFaults(t, s, sim.Faults{})
	}
	if in := s.Injected(); in.Held != 1 || in.HeldAfterApply != 1 || in.Resets != 1 {
		t.Fatalf("injected: %+v", in)
	}
	// The driver dials again after the failures: the next write goes through.
	wantResult(t, m.Apply(context.Background(), write("k", `{"rpm":150}`)), device.Applied, 1, "")

	dead := pumpConfig(s, "pump-7")
	dead.URL = "tcp://" + strings.TrimPrefix(closedPort(t), "http://")
	md := modbusFor(t, dead)
	wantResult(t, md.Apply(context.Background(), write("k", `{"rpm":1}`)), device.NotSent, 0, "could not reach the device: dial")
	// In backoff: a write with no time to wait for the next dial is not sent either.
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	time.Sleep(2 * time.Millisecond) // let ctx expire: the backoff wait must see it
	wantResult(t, md.Apply(ctx, write("k", `{"rpm":1}`)), device.NotSent, 0, "waiting to dial again after 1 failures")
}

// A connection the device dropped while idle is found out by a read
// before the write, not by the write: without the probe the write would
// be unknown.
func TestModbusStaleConnectionIsProbed(t *testing.T) {
	s := startModbusSim(t)
	for _, tc := range []struct {
		probe time.Duration
		want  device.Outcome
	}{{20 * time.Millisecond, device.Applied}, {-1, device.Unknown}} {
		px := testkit.NewProxy(t, s.ModbusAddr())
		cfg := pumpConfig(s, "pump-7")
		cfg.URL = "tcp://" + px.Addr()
		m := newModbus(t, device.ModbusOptions{ProbeIdle: tc.probe, Devices: map[string]device.ModbusDevice{"pump-7": cfg}})
		wantResult(t, m.Apply(context.Background(), write("k", `{"rpm":10}`)), device.Applied, 1, "")
		px.Cut()
		time.Sleep(50 * time.Millisecond) // idle longer than the probe threshold (this is the condition, not a synchronisation)
		if got := m.Apply(context.Background(), write("k", `{"rpm":20}`)); got.Outcome != tc.want {
			t.Fatalf("probe %v: %s (%s), want %s", tc.probe, got.Outcome, got.Reason, tc.want)
		}
	}
}

// Types, scale and word order: what is written is what the hardware
// holds, and the state decodes it back to the engineering value.
func TestModbusTypesRoundTrip(t *testing.T) {
	s := startModbusSim(t)
	u, _ := s.Unit("gen-1")
	pts := map[string]device.ModbusPoint{
		"a": {Address: 0, Type: "int16"},
		"b": {Address: 1, Type: "uint32"},
		"c": {Address: 3, Type: "int32", LowWordFirst: true},
		"d": {Address: 5, Type: "float32"},
		"e": {Address: 7, Type: "uint16", Scale: 0.1},
		"f": {Coil: true, Address: 2},
	}
	m := newModbus(t, device.ModbusOptions{Devices: map[string]device.ModbusDevice{"gen-1": {
		URL: "tcp://" + s.ModbusAddr(), UnitID: u, Timeout: time.Second,
		Actions: map[string]device.ModbusAction{"set": {Params: pts}}, State: pts}}})
	res := m.Apply(context.Background(), device.Write{Device: "gen-1", OpID: "o", Key: "k", Action: "set",
		Params: json.RawMessage(`{"a":-5,"b":70000,"c":-70000,"d":2.5,"e":12.3,"f":true}`)})
	wantResult(t, res, device.Applied, 6, "")
	if string(res.State) != `{"a":-5,"b":70000,"c":-70000,"d":2.5,"e":12.3,"f":true}` {
		t.Fatalf("state = %s", res.State)
	}
	// -70000 is 0xFFFEEE90: low word first at 3.
	if got := simState(t, s, "gen-1"); got != `{"coil2":true,"hr0":65531,"hr1":1,"hr2":4464,"hr3":61072,"hr4":65534,"hr5":16416,"hr6":0,"hr7":123}` {
		t.Fatalf("registers = %s", got)
	}
}

// ReadBack's readings, each way the world can be after an unknown write:
// applied (equal to the intended values), not applied (equal to the
// reading before), and a third value (something else wrote meanwhile).
func TestModbusReadBack(t *testing.T) {
	s := startModbusSim(t)
	cfg := pumpConfig(s, "pump-7")
	cfg.Settle = 300 * time.Millisecond
	m := modbusFor(t, cfg)
	third, err := modbus.NewClient(&modbus.ClientConfiguration{URL: "tcp://" + s.ModbusAddr(), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := third.Open(); err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	u, _ := s.Unit("pump-7")
	third.SetUnitId(u)
	wantResult(t, m.Apply(context.Background(), write("k0", `{"rpm":100}`)), device.Applied, 1, "")

	for _, tc := range []struct {
		name   string
		f      sim.Faults
		meddle func()
		after  string
	}{
		{"applied", sim.Faults{HangAfterApply: true}, nil, `{"register 0":1200}`},
		{"not applied", sim.Faults{Hang: true}, nil, `{"register 0":1200}`},
		{"third value", sim.Faults{Hang: true}, func() {
			if err := third.WriteRegister(0, 999); err != nil {
				t.Fatal(err)
			}
		}, `{"register 0":999}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := write("k-"+tc.name, `{"rpm":1200}`)
			if tc.name == "not applied" {
				w = write("k-"+tc.name, `{"rpm":1300}`)
			}
			before, err := m.Before(context.Background(), w)
			if err != nil {
				t.Fatal(err)
			}
			w.Before = before
			tc.f.Device = "pump-7"
			setFaults(t, s, tc.f)
			if res := m.Apply(context.Background(), w); res.Outcome != device.Unknown {
				t.Fatalf("apply: %s %s", res.Outcome, res.Reason)
			}
			setFaults(t, s, sim.Faults{})
			if tc.meddle != nil {
				tc.meddle()
			}
			q, err := m.ReadBack(context.Background(), w)
			if err != nil {
				t.Fatal(err)
			}
			rb := q.ReadBack
			if rb == nil || string(rb.Before) != string(before) {
				t.Fatalf("read-back = %+v", q)
			}
			intended := `{"register 0":1200}`
			if tc.name == "not applied" {
				intended, tc.after = `{"register 0":1300}`, string(before)
			}
			if string(rb.Intended) != intended || string(rb.After) != tc.after {
				t.Fatalf("intended %s after %s, want %s and %s (before %s)", rb.Intended, rb.After, intended, tc.after, before)
			}
			if !strings.Contains(string(q.State), `"rpm":`) {
				t.Fatalf("state with the read-back: %s", q.State)
			}
		})
	}
}

// The settle time is what makes a read-back sound for a device that
// processes a request late: a write delayed past the request timeout is
// seen applied after a settle time longer than the delay, and would be
// misread as not applied after a shorter one (docs/design.md, "Read-back",
// when it is not sound).
func TestModbusReadBackWaitsTheSettleTime(t *testing.T) {
	for _, tc := range []struct {
		settle time.Duration
		after  string
	}{{1500 * time.Millisecond, `{"register 0":1200}`}, {10 * time.Millisecond, `{"register 0":0}`}} {
		s := startModbusSim(t)
		cfg := pumpConfig(s, "pump-7")
		cfg.Timeout, cfg.Settle = 100*time.Millisecond, tc.settle
		m := modbusFor(t, cfg)
		w := write("k", `{"rpm":1200}`)
		var err error
		if w.Before, err = m.Before(context.Background(), w); err != nil {
			t.Fatal(err)
		}
		setFaults(t, s, sim.Faults{Device: "pump-7", LatencyMS: 700})
		if res := m.Apply(context.Background(), w); res.Outcome != device.Unknown {
			t.Fatalf("apply: %s %s", res.Outcome, res.Reason)
		}
		q, err := m.ReadBack(context.Background(), w)
		if err != nil {
			t.Fatal(err)
		}
		if string(q.ReadBack.After) != tc.after {
			t.Fatalf("settle %v: after = %s, want %s", tc.settle, q.ReadBack.After, tc.after)
		}
		testkit.Eventually(t, 5*time.Second, "the delayed write lands", func() bool { return simState(t, s, "pump-7") == `{"rpm":1200}` })
	}
}

func TestModbusConfigErrorsNameTheField(t *testing.T) {
	ok := device.ModbusDevice{URL: "tcp://127.0.0.1:502", Actions: map[string]device.ModbusAction{"set": {Params: map[string]device.ModbusPoint{"rpm": {}}}}}
	for _, tc := range []struct {
		name string
		mod  func(*device.ModbusDevice)
		want string
	}{
		{"url", func(c *device.ModbusDevice) { c.URL = "http://x:1" }, `url "http://x:1"`},
		{"no port", func(c *device.ModbusDevice) { c.URL = "tcp://x" }, `url "tcp://x"`},
		{"no actions", func(c *device.ModbusDevice) { c.Actions = nil }, "actions: at least one"},
		{"type", func(c *device.ModbusDevice) {
			c.Actions = map[string]device.ModbusAction{"set": {Params: map[string]device.ModbusPoint{"rpm": {Type: "u8"}}}}
		}, `actions.set.params.rpm: type "u8"`},
		{"fixed value", func(c *device.ModbusDevice) {
			c.Actions = map[string]device.ModbusAction{"on": {Fixed: &device.ModbusFixed{Point: device.ModbusPoint{Coil: true}, Value: 1.0}}}
		}, "actions.on.value: 1 does not suit coil 0"},
	} {
		cfg := ok
		tc.mod(&cfg)
		if _, err := device.NewModbus(device.ModbusOptions{Devices: map[string]device.ModbusDevice{"p": cfg}}); !errors.Is(err, device.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalidConfig naming %q", tc.name, err, tc.want)
		}
	}
}
