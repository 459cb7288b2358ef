package sim_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/simonvetter/modbus"

	"github.com/edge-agent/edge-agent/firmware-sim/sim"
)

// The simulator's RTU-over-TCP listener, over real TCP: the library's RTU
// client for what a client does, raw bytes for what the library's client
// cannot send (a bad CRC, a function code it does not know, broadcast).

func startModbusRTU(t *testing.T, opts sim.Options) *sim.Sim {
	t.Helper()
	s := sim.StartForTestWith(t, opts, "")
	if err := s.StartModbusRTU("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	return s
}

func rtuClient(t *testing.T, s *sim.Sim, dev string, timeout time.Duration) *modbus.ModbusClient {
	t.Helper()
	return mbClientAt(t, "rtuovertcp://"+s.ModbusRTUAddr(), s, dev, timeout)
}

// The register map over RTU framing, each device at the unit it was given
// (pump-7 at 9 by Options.Units, as --devices pump-7:pump:9 does): writes
// reach that device's hardware and journal, reads come back, the
// hardware's refusals are exceptions, and a unit no device has is not
// answered at all (as on a serial line), which leaves the connection in
// step.
func TestModbusRTURegisterMapAndUnits(t *testing.T) {
	s := startModbusRTU(t, sim.Options{Devices: devices, Units: map[string]int{"pump-7": 9}})
	if u, _ := s.Unit("pump-7"); u != 9 {
		t.Fatalf("pump-7's unit = %d, want 9", u)
	}
	if s.ModbusAddr() != "" {
		t.Fatal("the RTU listener started the Modbus TCP one")
	}
	pump := rtuClient(t, s, "pump-7", 2*time.Second)
	if err := pump.WriteRegister(0, 1200); err != nil {
		t.Fatal(err)
	}
	if v, err := pump.ReadRegister(0, modbus.HOLDING_REGISTER); err != nil || v != 1200 {
		t.Fatalf("read register 0 = %d, %v", v, err)
	}
	if on, err := pump.ReadCoil(0); err != nil || !on {
		t.Fatalf("running coil = %v, %v", on, err)
	}
	j := s.Journal()
	if len(j) != 1 || j[0].Device != "pump-7" || string(j[0].Params) != `{"rpm":1200}` || j[0].Modbus == nil || j[0].Modbus.Unit != 9 || *j[0].Modbus.Register != 0 {
		t.Fatalf("journal = %+v", j)
	}
	for _, tc := range []struct {
		name  string
		write func() error
		want  error
	}{
		{"rpm out of the hardware's range", func() error { return pump.WriteRegister(0, 7000) }, modbus.ErrIllegalDataValue},
		{"a register the pump has not", func() error { return pump.WriteRegister(1, 1) }, modbus.ErrIllegalDataAddress},
		{"a discrete input", func() error { _, err := pump.ReadDiscreteInput(0); return err }, modbus.ErrIllegalFunction},
	} {
		if err := tc.write(); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}

	// Each unit is its own device.
	valve := rtuClient(t, s, "valve-1", 2*time.Second)
	if err := valve.WriteRegister(0, 40); err != nil {
		t.Fatal(err)
	}
	if got, want := stateOf(t, s, "valve-1")+stateOf(t, s, "pump-7"), `{"open":40}{"rpm":1200}`; got != want {
		t.Fatalf("valve and pump = %s, want %s", got, want)
	}
	relay := rtuClient(t, s, "relay-1", 2*time.Second)
	if err := relay.WriteCoil(0, true); err != nil {
		t.Fatal(err)
	}
	// Write multiple registers and coils: frames whose length is in their
	// byte count.
	gen := rtuClient(t, s, "gen-1", 2*time.Second)
	if err := gen.WriteRegisters(4, []uint16{0x4049, 0x0fdb}); err != nil {
		t.Fatal(err)
	}
	if f, err := gen.ReadFloat32(4, modbus.HOLDING_REGISTER); err != nil || f != 3.1415927 {
		t.Fatalf("float32 at 4 = %v, %v", f, err)
	}
	if err := gen.WriteCoils(10, []bool{true, false, true}); err != nil {
		t.Fatal(err)
	}
	if cs, err := gen.ReadCoils(10, 3); err != nil || !cs[0] || cs[1] || !cs[2] {
		t.Fatalf("coils 10..12 = %v, %v", cs, err)
	}
	if got := stateOf(t, s, "relay-1") + stateOf(t, s, "gen-1"); got != `{"on":true}{"coil10":true,"coil11":false,"coil12":true,"hr4":16457,"hr5":4059}` {
		t.Fatalf("relay and generic = %s", got)
	}

	// Unit 2 is pump-7's by default, but pump-7 was given 9: 2 is relay-1's.
	other := rtuClient(t, s, "pump-7", 300*time.Millisecond)
	other.SetUnitId(2)
	if _, err := other.ReadRegister(0, modbus.HOLDING_REGISTER); !errors.Is(err, modbus.ErrIllegalDataAddress) {
		t.Fatalf("unit 2 (relay-1, which has no registers): %v", err)
	}
	other.SetUnitId(200)
	if err := other.WriteRegister(0, 5); !errors.Is(err, modbus.ErrRequestTimedOut) {
		t.Fatalf("unit 200 (no device): %v, want no answer", err)
	}
	// No late answer follows: the next request on the connection gets its own.
	other.SetUnitId(9)
	if v, err := other.ReadRegister(0, modbus.HOLDING_REGISTER); err != nil || v != 1200 {
		t.Fatalf("after the unanswered unit: read register 0 of unit 9 = %d, %v", v, err)
	}
	if n := len(s.Journal()); n != 5 {
		t.Fatalf("journal has %d writes, want 5", n)
	}
}

// crc16 is CRC-16/MODBUS, written out independently of the simulator's.
func crc16(b []byte) uint16 {
	crc := uint16(0xffff)
	for _, x := range b {
		crc ^= uint16(x)
		for i := 0; i < 8; i++ {
			if crc&1 == 1 {
				crc = (crc >> 1) ^ 0xa001
			} else {
				crc >>= 1
			}
		}
	}
	return crc
}

// frame is an RTU frame of b with its CRC, low byte first.
func frame(b ...byte) []byte { return binary.LittleEndian.AppendUint16(b, crc16(b)) }

// rtuConn is a raw TCP connection to the RTU listener.
type rtuConn struct {
	t *testing.T
	c net.Conn
}

func dialRTU(t *testing.T, s *sim.Sim) *rtuConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", s.ModbusRTUAddr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rtuConn{t: t, c: c}
}

func (r *rtuConn) send(frames ...[]byte) {
	r.t.Helper()
	if _, err := r.c.Write(bytes.Join(frames, nil)); err != nil {
		r.t.Fatal(err)
	}
}

// expect reads the next answer and checks it is want.
func (r *rtuConn) expect(what string, want []byte) {
	r.t.Helper()
	r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(r.c, got); err != nil {
		r.t.Fatalf("%s: %v after % x, want % x", what, err, got, want)
	}
	if !bytes.Equal(got, want) {
		r.t.Fatalf("%s: % x, want % x", what, got, want)
	}
}

// RTU's own framing: a request's length comes from its function code
// (two requests in one TCP segment are two requests), a bad CRC and a
// broadcast are not answered (the next request's answer is the next thing
// on the wire) and apply nothing, a function code the simulator does not
// serve is exception 01, and a malformed request closes the connection as
// over Modbus TCP.
func TestModbusRTUFraming(t *testing.T) {
	// The example of the Modbus serial line guide: read 10 holding
	// registers of unit 1 is 01 03 00 00 00 0A C5 CD.
	if got := frame(0x01, 0x03, 0x00, 0x00, 0x00, 0x0a); !bytes.Equal(got, []byte{0x01, 0x03, 0x00, 0x00, 0x00, 0x0a, 0xc5, 0xcd}) {
		t.Fatalf("the test's CRC: % x", got)
	}
	s := startModbusRTU(t, sim.Options{Devices: devices})
	pu, _ := s.Unit("pump-7")
	gu, _ := s.Unit("gen-1")
	readRPM := frame(pu, 0x03, 0x00, 0x00, 0x00, 0x01)
	c := dialRTU(t, s)

	// A write of rpm 1234 (0x04d2) with its CRC flipped, then a read.
	bad := frame(pu, 0x06, 0x00, 0x00, 0x04, 0xd2)
	bad[len(bad)-1] ^= 0xff
	c.send(bad, readRPM)
	c.expect("the read after a bad CRC", frame(pu, 0x03, 0x02, 0x00, 0x00))
	// A broadcast of the same write, with a good CRC, then a read.
	c.send(frame(0x00, 0x06, 0x00, 0x00, 0x04, 0xd2), readRPM)
	c.expect("the read after a broadcast", frame(pu, 0x03, 0x02, 0x00, 0x00))
	if j := s.Journal(); len(j) != 0 {
		t.Fatalf("an unanswered write was applied: %+v", j)
	}

	// Pipelined: write single register, write multiple registers (its
	// length from its byte count), read; answered in order.
	c.send(frame(pu, 0x06, 0x00, 0x00, 0x04, 0xd2),
		frame(gu, 0x10, 0x00, 0x04, 0x00, 0x02, 0x04, 0x40, 0x49, 0x0f, 0xdb),
		readRPM)
	c.expect("write single register", frame(pu, 0x06, 0x00, 0x00, 0x04, 0xd2))
	c.expect("write multiple registers", frame(gu, 0x10, 0x00, 0x04, 0x00, 0x02))
	c.expect("read", frame(pu, 0x03, 0x02, 0x04, 0xd2))
	if got := stateOf(t, s, "pump-7") + stateOf(t, s, "gen-1"); got != `{"rpm":1234}{"hr4":16457,"hr5":4059}` {
		t.Fatalf("pump and generic = %s", got)
	}

	// Diagnostics (08), which the simulator does not serve: illegal function.
	c.send(frame(pu, 0x08, 0x00, 0x00, 0x12, 0x34))
	c.expect("diagnostics", frame(pu, 0x88, 0x01))
	c.send(readRPM)
	c.expect("the read after diagnostics", frame(pu, 0x03, 0x02, 0x04, 0xd2))

	// Reading 0 registers is malformed: the connection is closed unanswered.
	c.send(frame(pu, 0x03, 0x00, 0x00, 0x00, 0x00))
	c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.c.Read(make([]byte, 8)); err != io.EOF {
		t.Fatalf("a malformed request: read %d bytes, %v; want the connection closed", n, err)
	}
	if n := len(s.Journal()); n != 2 {
		t.Fatalf("journal has %d writes, want 2", n)
	}
}

// StartModbusRTU beside StartModbus: two faces of one hardware; the
// second start of either, and a start after Close, are refused.
func TestModbusRTUBesideTCP(t *testing.T) {
	s := startModbusRTU(t, sim.Options{Devices: devices})
	if err := s.StartModbus("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if err := mbClient(t, s, "pump-7", 2*time.Second).WriteRegister(0, 300); err != nil {
		t.Fatal(err)
	}
	if v, err := rtuClient(t, s, "pump-7", 2*time.Second).ReadRegister(0, modbus.HOLDING_REGISTER); err != nil || v != 300 {
		t.Fatalf("over RTU, after a write over TCP: %d, %v", v, err)
	}
	if err := s.StartModbusRTU("127.0.0.1:0"); !errors.Is(err, sim.ErrStarted) {
		t.Fatalf("a second StartModbusRTU: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.StartModbusRTU("127.0.0.1:0"); !errors.Is(err, sim.ErrClosed) {
		t.Fatalf("StartModbusRTU after Close: %v", err)
	}
}
