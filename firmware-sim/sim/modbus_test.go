package sim_test

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/simonvetter/modbus"

	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// startModbus starts a simulator of devices with its Modbus listener on a
// free loopback port.
func startModbus(t *testing.T, opts sim.Options) *sim.Sim {
	t.Helper()
	s := sim.StartForTestWith(t, opts, "")
	if err := s.StartModbus("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	return s
}

// mbClient is a real Modbus TCP client (the library's) to the simulator,
// talking to dev's unit.
func mbClient(t *testing.T, s *sim.Sim, dev string, timeout time.Duration) *modbus.ModbusClient {
	t.Helper()
	return mbClientAt(t, "tcp://"+s.ModbusAddr(), s, dev, timeout)
}

// mbClientAt is mbClient to url (tcp:// or rtuovertcp://).
func mbClientAt(t *testing.T, url string, s *sim.Sim, dev string, timeout time.Duration) *modbus.ModbusClient {
	t.Helper()
	c, err := modbus.NewClient(&modbus.ClientConfiguration{URL: url, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	u, ok := s.Unit(dev)
	if !ok {
		t.Fatalf("no unit for %s", dev)
	}
	c.SetUnitId(u)
	return c
}

func stateOf(t *testing.T, s *sim.Sim, dev string) string {
	t.Helper()
	st, err := s.State(dev)
	if err != nil {
		t.Fatal(err)
	}
	return string(st)
}

func TestModbusUnitsAreAssigned(t *testing.T) {
	s, err := sim.New(sim.Options{Devices: map[string]string{"a": "pump", "b": "valve", "c": "relay"}, Units: map[string]int{"b": 1}})
	if err != nil {
		t.Fatal(err)
	}
	for dev, want := range map[string]uint8{"b": 1, "a": 2, "c": 3} {
		if u, _ := s.Unit(dev); u != want {
			t.Errorf("unit of %s = %d, want %d", dev, u, want)
		}
	}
	for _, units := range []map[string]int{{"a": 0}, {"a": 256}, {"a": 1, "b": 1}, {"zz": 1}} {
		if _, err := sim.New(sim.Options{Devices: map[string]string{"a": "pump", "b": "valve"}, Units: units}); !errors.Is(err, sim.ErrBadUnit) {
			t.Errorf("units %v: %v, want ErrBadUnit", units, err)
		}
	}
}

// The register map of docs/protocol.md §2 over real Modbus TCP: a write
// changes the same hardware the HTTP API shows and is journaled with the
// register it came from; the hardware's refusals are exceptions.
func TestModbusRegisterMap(t *testing.T) {
	s := startModbus(t, sim.Options{Devices: devices})
	pump := mbClient(t, s, "pump-7", 2*time.Second)
	if err := pump.WriteRegister(0, 1200); err != nil {
		t.Fatal(err)
	}
	if got := stateOf(t, s, "pump-7"); got != `{"rpm":1200}` {
		t.Fatalf("pump state = %s", got)
	}
	if v, err := pump.ReadRegister(0, modbus.HOLDING_REGISTER); err != nil || v != 1200 {
		t.Fatalf("read register 0 = %d, %v", v, err)
	}
	if on, err := pump.ReadCoil(0); err != nil || !on {
		t.Fatalf("running coil = %v, %v", on, err)
	}
	j := s.Journal()
	if len(j) != 1 || j[0].Action != "set" || string(j[0].Params) != `{"rpm":1200}` || j[0].OpID != "" || j[0].Key != "" ||
		j[0].Modbus == nil || *j[0].Modbus.Register != 0 || len(j[0].Modbus.Values) != 1 || j[0].Modbus.Values[0] != 1200 {
		b, _ := json.Marshal(j)
		t.Fatalf("journal = %s", b)
	}
	for _, tc := range []struct {
		name  string
		write func() error
		want  error
	}{
		{"rpm out of the hardware's range", func() error { return pump.WriteRegister(0, 7000) }, modbus.ErrIllegalDataValue},
		{"a register the pump has not", func() error { return pump.WriteRegister(1, 1) }, modbus.ErrIllegalDataAddress},
		{"two registers", func() error { return pump.WriteRegisters(0, []uint16{1, 2}) }, modbus.ErrIllegalDataAddress},
		{"a coil the pump has not", func() error { return pump.WriteCoil(3, true) }, modbus.ErrIllegalDataAddress},
	} {
		if err := tc.write(); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if err := pump.WriteCoil(0, false); err != nil {
		t.Fatal(err)
	}
	if got := stateOf(t, s, "pump-7"); got != `{"rpm":0}` {
		t.Fatalf("after the run coil off: %s", got)
	}
	if err := pump.WriteCoil(0, true); !errors.Is(err, modbus.ErrIllegalDataValue) {
		t.Fatalf("starting a pump by its coil without a set-point: %v", err)
	}

	relay := mbClient(t, s, "relay-1", 2*time.Second)
	if err := relay.WriteCoil(0, true); err != nil {
		t.Fatal(err)
	}
	if got := stateOf(t, s, "relay-1"); got != `{"on":true}` {
		t.Fatalf("relay state = %s", got)
	}
	if _, err := relay.ReadRegister(0, modbus.HOLDING_REGISTER); !errors.Is(err, modbus.ErrIllegalDataAddress) {
		t.Fatalf("a relay has no registers: %v", err)
	}

	gen := mbClient(t, s, "gen-1", 2*time.Second)
	if err := gen.WriteRegisters(4, []uint16{0x4049, 0x0fdb}); err != nil {
		t.Fatal(err)
	}
	if f, err := gen.ReadFloat32(4, modbus.HOLDING_REGISTER); err != nil || f != 3.1415927 {
		t.Fatalf("float32 at 4 = %v, %v", f, err)
	}
	if got := stateOf(t, s, "gen-1"); got != `{"hr4":16457,"hr5":4059}` {
		t.Fatalf("generic state = %s", got)
	}

	other, err := modbus.NewClient(&modbus.ClientConfiguration{URL: "tcp://" + s.ModbusAddr(), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Open(); err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	other.SetUnitId(200)
	if _, err := other.ReadRegister(0, modbus.HOLDING_REGISTER); !errors.Is(err, modbus.ErrGWTargetFailedToRespond) {
		t.Fatalf("unit 200 (no device): %v", err)
	}
}

// Each Modbus fault happens, and does to the hardware what it says, over
// Modbus TCP and over RTU-over-TCP alike: a test's proof for the agent's
// fault tests.
func TestModbusFaults(t *testing.T) {
	for _, tr := range []struct {
		name  string
		start func(*testing.T, *sim.Sim) string // starts the listener, returns the client's URL
	}{
		{"tcp", func(t *testing.T, s *sim.Sim) string {
			if err := s.StartModbus("127.0.0.1:0"); err != nil {
				t.Fatal(err)
			}
			return "tcp://" + s.ModbusAddr()
		}},
		{"rtuovertcp", func(t *testing.T, s *sim.Sim) string {
			if err := s.StartModbusRTU("127.0.0.1:0"); err != nil {
				t.Fatal(err)
			}
			return "rtuovertcp://" + s.ModbusRTUAddr()
		}},
	} {
		t.Run(tr.name, func(t *testing.T) {
			s := sim.StartForTestWith(t, sim.Options{Devices: devices}, "")
			modbusFaults(t, s, tr.start(t, s))
		})
	}
}

func modbusFaults(t *testing.T, s *sim.Sim, url string) {
	mbClient := func(t *testing.T, s *sim.Sim, dev string, timeout time.Duration) *modbus.ModbusClient {
		t.Helper()
		return mbClientAt(t, url, s, dev, timeout)
	}
	read := mbClient(t, s, "pump-7", 2*time.Second)
	rpm := func() uint16 {
		t.Helper()
		v, err := read.ReadRegister(0, modbus.HOLDING_REGISTER)
		if err != nil {
			t.Fatalf("reads are never subject to faults: %v", err)
		}
		return v
	}
	set := func(f sim.Faults) {
		t.Helper()
		f.Device = "pump-7"
		if err := s.SetFaults(f); err != nil {
			t.Fatal(err)
		}
	}

	// hang: no answer, not applied, even once cleared.
	set(sim.Faults{Hang: true})
	c := mbClient(t, s, "pump-7", 300*time.Millisecond)
	if err := c.WriteRegister(0, 100); !errors.Is(err, modbus.ErrRequestTimedOut) {
		t.Fatalf("hang: %v, want a timeout", err)
	}
	if v := rpm(); v != 0 {
		t.Fatalf("hang applied the write: rpm %d", v)
	}
	set(sim.Faults{})
	testkit.Eventually(t, 5*time.Second, "the held write is counted", func() bool { return s.Injected().Held == 1 })
	if v := rpm(); v != 0 {
		t.Fatalf("a held write took effect once released: rpm %d", v)
	}

	// hang_after_apply: no answer, applied.
	set(sim.Faults{HangAfterApply: true})
	c = mbClient(t, s, "pump-7", 300*time.Millisecond)
	if err := c.WriteRegister(0, 200); !errors.Is(err, modbus.ErrRequestTimedOut) {
		t.Fatalf("hang_after_apply: %v, want a timeout", err)
	}
	if v := rpm(); v != 200 {
		t.Fatalf("hang_after_apply: rpm %d, want 200", v)
	}
	set(sim.Faults{})

	// exception: answered with the code, not applied.
	set(sim.Faults{Exception: 10})
	c = mbClient(t, s, "pump-7", 2*time.Second)
	if err := c.WriteRegister(0, 300); !errors.Is(err, modbus.ErrGWPathUnavailable) {
		t.Fatalf("exception 10: %v", err)
	}
	// error_rate: server device failure, not applied.
	set(sim.Faults{ErrorRate: 1})
	if err := c.WriteRegister(0, 300); !errors.Is(err, modbus.ErrServerDeviceFailure) {
		t.Fatalf("error_rate: %v", err)
	}
	if v := rpm(); v != 200 {
		t.Fatalf("an exception applied the write: rpm %d", v)
	}

	// reset_rate: closed without an answer, not applied.
	set(sim.Faults{ResetRate: 1})
	if err := c.WriteRegister(0, 400); err == nil || errors.Is(err, modbus.ErrRequestTimedOut) {
		t.Fatalf("reset_rate: %v, want the connection closed", err)
	}
	if v := rpm(); v != 200 {
		t.Fatalf("reset_rate applied the write: rpm %d", v)
	}
	// drop_response_rate: closed without an answer, applied.
	set(sim.Faults{DropResponseRate: 1})
	c = mbClient(t, s, "pump-7", 2*time.Second)
	if err := c.WriteRegister(0, 500); err == nil || errors.Is(err, modbus.ErrRequestTimedOut) {
		t.Fatalf("drop_response_rate: %v, want the connection closed", err)
	}
	if v := rpm(); v != 500 {
		t.Fatalf("drop_response_rate: rpm %d, want 500", v)
	}

	// latency: the write takes effect after the delay, even though its
	// sender gave up waiting.
	set(sim.Faults{LatencyMS: 600})
	c = mbClient(t, s, "pump-7", 100*time.Millisecond)
	if err := c.WriteRegister(0, 600); !errors.Is(err, modbus.ErrRequestTimedOut) {
		t.Fatalf("latency: %v, want a timeout", err)
	}
	if v := rpm(); v != 500 {
		t.Fatalf("latency: applied before the delay: rpm %d", v)
	}
	testkit.Eventually(t, 5*time.Second, "the delayed write takes effect", func() bool { return rpm() == 600 })

	got := s.Injected()
	if got.Held != 1 || got.HeldAfterApply != 1 || got.Exceptions != 1 || got.Errors != 1 || got.Resets != 1 || got.Dropped != 1 || got.Delayed != 1 {
		t.Fatalf("injected = %+v", got)
	}
	if err := s.SetFaults(sim.Faults{Exception: 7}); !errors.Is(err, sim.ErrBadFaults) {
		t.Fatalf("exception 7: %v", err)
	}
}

// A Modbus write in the journal file is replayed at a restart (the state
// comes back), next to keyed HTTP writes.
func TestModbusJournalSurvivesARestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal")
	opts := sim.Options{Devices: devices, JournalPath: path}
	s := startModbus(t, opts)
	if err := mbClient(t, s, "valve-1", 2*time.Second).WriteRegister(0, 40); err != nil {
		t.Fatal(err)
	}
	newClient(t, s).apply("pump-7", "k1", `{"op_id":"o1","action":"set","params":{"rpm":10}}`).want(t, 200, "")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := startModbus(t, opts)
	if got := stateOf(t, s2, "valve-1"); got != `{"open":40}` {
		t.Fatalf("valve after restart = %s", got)
	}
	if j := s2.Journal(); len(j) != 2 || j[0].Modbus == nil || j[1].Key != "k1" {
		t.Fatalf("journal after restart: %+v", j)
	}
	newClient(t, s2).query("pump-7", "k1").want(t, 200, "")
}

// reset_rate and hang_after_apply work for HTTP applies too: closed
// unapplied (an ops query then tombstones the key), and applied, then held
// and closed without an answer.
func TestHTTPResetAndHangAfterApply(t *testing.T) {
	s := sim.StartForTest(t, devices)
	c := newClient(t, s)
	if err := s.SetFaults(sim.Faults{Device: "pump-7", ResetRate: 1}); err != nil {
		t.Fatal(err)
	}
	c.apply("pump-7", "k1", `{"op_id":"o1","action":"set","params":{"rpm":10}}`).wantDropped(t)
	c.query("pump-7", "k1").want(t, 404, "")
	if err := s.SetFaults(sim.Faults{Device: "pump-7", HangAfterApply: true}); err != nil {
		t.Fatal(err)
	}
	done := make(chan answer, 1)
	go func() { done <- c.apply("pump-7", "k2", `{"op_id":"o2","action":"set","params":{"rpm":20}}`) }()
	testkit.Eventually(t, 5*time.Second, "the write is applied while its answer is held", func() bool { return stateOf(t, s, "pump-7") == `{"rpm":20}` })
	select {
	case a := <-done:
		t.Fatalf("answered while held: %+v", a)
	default:
	}
	if err := s.SetFaults(sim.Faults{}); err != nil {
		t.Fatal(err)
	}
	(<-done).wantDropped(t)
	c.query("pump-7", "k2").want(t, 200, "")
	if in := s.Injected(); in.Resets != 1 || in.HeldAfterApply != 1 {
		t.Fatalf("injected: %+v", in)
	}
}
