package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/simonvetter/modbus"
)

// The Modbus TCP face of the simulator (docs/protocol.md §2, "Modbus TCP"):
// the same simulated hardware and journal as the HTTP API, reached by unit
// ID. Each device type has a fixed register map (modbusMap); a write is
// turned into the device's action and params, checked by the same
// hardware (applyWrite) and journaled like an HTTP write, with the
// register or coil it came from in place of the op, which Modbus does not
// carry. Faults strike writes only; reads are always answered.

// ModbusWrite is where a journaled write came from when it arrived over
// Modbus: the unit, and the register or coil with the values written.
type ModbusWrite struct {
	Unit     uint8    `json:"unit"`
	Register *uint16  `json:"register,omitempty"`
	Coil     *uint16  `json:"coil,omitempty"`
	Values   []uint16 `json:"values,omitempty"`
	Coils    []bool   `json:"coils,omitempty"`
}

// GenericPoints is how many holding registers and coils a generic device
// has over Modbus (addresses 0..GenericPoints-1; state keys hrN and coilN).
const GenericPoints = 100

// maxModbusClients bounds the simulator's concurrent Modbus connections (a
// client that reconnects after a timeout leaves the held one behind until
// its fault is cleared).
const maxModbusClients = 256

// modbusIdle is how long an idle Modbus connection is kept: a client
// keeps one per device.
const modbusIdle = 10 * time.Minute

// StartModbus serves the simulated devices over Modbus TCP on addr
// (host:port; port 0 picks a free one) until Close. Open (the journal) is
// done first. It may be called once, with or without Start.
func (s *Sim) StartModbus(addr string) error {
	if err := s.Open(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return ErrClosed
	case s.mb != nil:
		return ErrStarted
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("sim: modbus address %q: %w", addr, err)
	}
	srv, a, err := s.listenModbus(host, port)
	if err != nil {
		return err
	}
	s.mb, s.mbAddr = srv, a
	s.log.Info("modbus TCP listening", "addr", a, "units", s.unitList())
	return nil
}

// listenModbus starts a library Modbus TCP server of the simulator's
// devices (mbHandler) on host:port and returns it with its address.
func (s *Sim) listenModbus(host, port string) (*modbus.ModbusServer, string, error) {
	var last error
	// The library listens itself and does not say on which port: port 0
	// is resolved first by taking a free one. Another process may take
	// it in between, so that is tried a few times.
	for try := 0; try < 5; try++ {
		p := port
		if p == "0" {
			var err error
			if p, err = freePort(host); err != nil {
				return nil, "", err
			}
		}
		a := net.JoinHostPort(host, p)
		srv, err := modbus.NewServer(&modbus.ServerConfiguration{
			URL:        "tcp://" + a,
			Timeout:    modbusIdle,
			MaxClients: maxModbusClients,
			Logger:     log.New(io.Discard, "", 0),
		}, &mbHandler{s: s})
		if err != nil {
			return nil, "", fmt.Errorf("sim: modbus server on %s: %w", a, err)
		}
		if last = srv.Start(); last == nil {
			return srv, a, nil
		}
		if port != "0" {
			break
		}
	}
	return nil, "", fmt.Errorf("sim: modbus listen on %s: %w", net.JoinHostPort(host, port), last)
}

func freePort(host string) (string, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", fmt.Errorf("sim: modbus: find a free port: %w", err)
	}
	defer ln.Close()
	_, p, _ := net.SplitHostPort(ln.Addr().String())
	return p, nil
}

// ModbusAddr is the address StartModbus listens on, "" before.
func (s *Sim) ModbusAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mbAddr
}

// Unit is dev's Modbus unit ID (0, false for a device not simulated).
func (s *Sim) Unit(dev string) (uint8, bool) {
	d := s.devices[dev]
	if d == nil {
		return 0, false
	}
	return d.unit, true
}

// unitList is "pump-7=1,valve-1=2", in unit order.
func (s *Sim) unitList() string {
	parts := make([]string, 0, len(s.units))
	for u := 1; u <= 255; u++ {
		if d := s.units[uint8(u)]; d != nil {
			parts = append(parts, d.id+"="+strconv.Itoa(u))
		}
	}
	return strings.Join(parts, ",")
}

// assignUnits gives each device its unit ID: units[dev] where given, else
// the lowest free one, in device order.
func (s *Sim) assignUnits(units map[string]int, ids []string) error {
	s.units = map[uint8]*device{}
	for dev, u := range units {
		d := s.devices[dev]
		switch {
		case d == nil:
			return fmt.Errorf("%w: unit for %q, which is not simulated", ErrBadUnit, dev)
		case u < 1 || u > 255:
			return fmt.Errorf("%w: device %s: unit %d (want 1..255)", ErrBadUnit, dev, u)
		case s.units[uint8(u)] != nil:
			return fmt.Errorf("%w: unit %d given to %s and %s", ErrBadUnit, u, s.units[uint8(u)].id, dev)
		}
		d.unit = uint8(u)
		s.units[uint8(u)] = d
	}
	next := 1
	for _, id := range ids {
		d := s.devices[id]
		if d.unit != 0 {
			continue
		}
		for next <= 255 && s.units[uint8(next)] != nil {
			next++
		}
		if next > 255 {
			return fmt.Errorf("%w: more than 255 devices", ErrBadUnit)
		}
		d.unit = uint8(next)
		s.units[uint8(next)] = d
	}
	return nil
}

// mbHandler is the library's request handler: it runs on the library's
// goroutine of each connection.
type mbHandler struct{ s *Sim }

func (h *mbHandler) device(unit uint8) (*device, error) {
	if d := h.s.units[unit]; d != nil {
		return d, nil
	}
	// What a Modbus gateway answers for a unit behind it that does not answer.
	return nil, modbus.ErrGWTargetFailedToRespond
}

func (h *mbHandler) HandleCoils(req *modbus.CoilsRequest) ([]bool, error) {
	d, err := h.device(req.UnitId)
	if err != nil {
		return nil, err
	}
	if !req.IsWrite {
		return h.s.readCoils(d, req.Addr, req.Quantity)
	}
	addr := req.Addr
	return nil, h.s.modbusWrite(d, ModbusWrite{Unit: req.UnitId, Coil: &addr, Coils: req.Args})
}

func (h *mbHandler) HandleHoldingRegisters(req *modbus.HoldingRegistersRequest) ([]uint16, error) {
	d, err := h.device(req.UnitId)
	if err != nil {
		return nil, err
	}
	if !req.IsWrite {
		return h.s.readRegisters(d, req.Addr, req.Quantity)
	}
	addr := req.Addr
	return nil, h.s.modbusWrite(d, ModbusWrite{Unit: req.UnitId, Register: &addr, Values: req.Args})
}

func (h *mbHandler) HandleDiscreteInputs(*modbus.DiscreteInputsRequest) ([]bool, error) {
	return nil, modbus.ErrIllegalFunction
}

func (h *mbHandler) HandleInputRegisters(*modbus.InputRegistersRequest) ([]uint16, error) {
	return nil, modbus.ErrIllegalFunction
}

func (s *Sim) readRegisters(d *device, addr, n uint16) ([]uint16, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]uint16, n)
	for i := range out {
		v, err := registerOf(d.typ, d.state, int(addr)+i)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func (s *Sim) readCoils(d *device, addr, n uint16) ([]bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]bool, n)
	for i := range out {
		v, err := coilOf(d.typ, d.state, int(addr)+i)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// registerOf is holding register addr of a device of type typ in state st
// (the register map of docs/protocol.md §2).
func registerOf(typ string, st state, addr int) (uint16, error) {
	switch typ {
	case TypePump, TypeValve:
		if addr == 0 {
			return uint16(intOf(st[setParam(typ)])), nil
		}
	case TypeGeneric:
		if addr < GenericPoints {
			return uint16(intOf(st["hr"+strconv.Itoa(addr)])), nil
		}
	}
	return 0, modbus.ErrIllegalDataAddress
}

func coilOf(typ string, st state, addr int) (bool, error) {
	if addr != 0 && typ != TypeGeneric || addr >= GenericPoints {
		return false, modbus.ErrIllegalDataAddress
	}
	switch typ {
	case TypePump, TypeValve:
		return intOf(st[setParam(typ)]) != 0, nil
	case TypeRelay:
		on, _ := st["on"].(bool)
		return on, nil
	}
	var on bool
	if raw, ok := st["coil"+strconv.Itoa(addr)].(json.RawMessage); ok {
		json.Unmarshal(raw, &on)
	}
	return on, nil
}

func setParam(typ string) string {
	if typ == TypeValve {
		return "open"
	}
	return "rpm"
}

// intOf reads a state value: int64 (pump, valve) or a JSON number
// (generic); anything else is 0.
func intOf(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case json.RawMessage:
		if n, ok := integer(x); ok {
			return n
		}
	}
	return 0
}

// modbusAction turns a Modbus write into the device's action and params:
// the register map of docs/protocol.md §2. An address the device does not
// have is modbus.ErrIllegalDataAddress; a coil the device cannot set
// that way, modbus.ErrIllegalDataValue.
func modbusAction(typ string, cur state, w ModbusWrite) (string, map[string]json.RawMessage, error) {
	num := func(v uint16) json.RawMessage { return json.RawMessage(strconv.Itoa(int(v))) }
	flag := func(b bool) json.RawMessage { return json.RawMessage(strconv.FormatBool(b)) }
	switch {
	case typ == TypeGeneric:
		params := map[string]json.RawMessage{}
		if w.Register != nil {
			for i, v := range w.Values {
				a := int(*w.Register) + i
				if a >= GenericPoints {
					return "", nil, modbus.ErrIllegalDataAddress
				}
				params["hr"+strconv.Itoa(a)] = num(v)
			}
		} else {
			for i, v := range w.Coils {
				a := int(*w.Coil) + i
				if a >= GenericPoints {
					return "", nil, modbus.ErrIllegalDataAddress
				}
				params["coil"+strconv.Itoa(a)] = flag(v)
			}
		}
		return "set", params, nil
	case w.Register != nil:
		if (typ != TypePump && typ != TypeValve) || *w.Register != 0 || len(w.Values) != 1 {
			return "", nil, modbus.ErrIllegalDataAddress
		}
		return "set", map[string]json.RawMessage{setParam(typ): num(w.Values[0])}, nil
	case *w.Coil != 0 || len(w.Coils) != 1:
		return "", nil, modbus.ErrIllegalDataAddress
	case typ == TypeRelay:
		return "set", map[string]json.RawMessage{"on": flag(w.Coils[0])}, nil
	}
	// The run coil of a pump or valve: off stops it (closes it); on
	// keeps it running at its set-point, and cannot start it (that takes
	// a set-point).
	p := setParam(typ)
	cur0 := intOf(cur[p])
	switch {
	case !w.Coils[0] && typ == TypePump:
		return "stop", map[string]json.RawMessage{}, nil
	case !w.Coils[0]:
		return "close", map[string]json.RawMessage{}, nil
	case cur0 == 0:
		return "", nil, modbus.ErrIllegalDataValue
	}
	return "set", map[string]json.RawMessage{p: json.RawMessage(strconv.FormatInt(cur0, 10))}, nil
}

// modbusWrite carries out one Modbus write under the device's faults, in
// the order of handleApply's: hang and reset_rate before anything,
// latency, exception and error_rate without applying, then the write, then
// hang_after_apply and drop_response_rate after it. An error the library
// maps to an exception code is answered as that exception;
// modbus.ErrProtocolError closes the connection without an answer.
func (s *Sim) modbusWrite(d *device, w ModbusWrite) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return modbus.ErrProtocolError
	}
	s.handlers.Add(1)
	f := s.faults.of(d.id)
	s.mu.Unlock()
	defer s.handlers.Done()

	if f.Hang {
		s.bump(func(c *FaultCounts) { c.Held++ })
		s.hold(context.Background(), d.id, func(f Faults) bool { return f.Hang })
		return modbus.ErrProtocolError
	}
	if hit(f.ResetRate) {
		s.bump(func(c *FaultCounts) { c.Resets++ })
		return modbus.ErrProtocolError
	}
	if f.LatencyMS > 0 {
		s.bump(func(c *FaultCounts) { c.Delayed++ })
		t := time.NewTimer(time.Duration(f.LatencyMS) * time.Millisecond)
		select {
		case <-t.C:
		case <-s.closing:
			t.Stop()
			return modbus.ErrProtocolError
		}
	}
	if f.Exception != 0 {
		s.bump(func(c *FaultCounts) { c.Exceptions++ })
		return exceptionError(f.Exception)
	}
	if hit(f.ErrorRate) {
		s.bump(func(c *FaultCounts) { c.Errors++ })
		return modbus.ErrServerDeviceFailure
	}
	if err := s.applyModbus(d, w); err != nil {
		return err
	}
	if f.HangAfterApply {
		s.bump(func(c *FaultCounts) { c.HeldAfterApply++ })
		s.hold(context.Background(), d.id, func(f Faults) bool { return f.HangAfterApply })
		return modbus.ErrProtocolError
	}
	if hit(f.DropResponseRate) {
		s.bump(func(c *FaultCounts) { c.Dropped++ })
		return modbus.ErrProtocolError
	}
	return nil
}

// exceptionError is the library's error for an exception code (validated
// by Faults.validate).
func exceptionError(code int) error {
	switch code {
	case 1:
		return modbus.ErrIllegalFunction
	case 2:
		return modbus.ErrIllegalDataAddress
	case 3:
		return modbus.ErrIllegalDataValue
	case 4:
		return modbus.ErrServerDeviceFailure
	case 5:
		return modbus.ErrAcknowledge
	case 6:
		return modbus.ErrServerDeviceBusy
	case 8:
		return modbus.ErrMemoryParityError
	case 10:
		return modbus.ErrGWPathUnavailable
	case 11:
		return modbus.ErrGWTargetFailedToRespond
	}
	return modbus.ErrServerDeviceFailure
}

// applyModbus applies a Modbus write to the hardware and journals it (one
// line, fsynced before the write is answered), as apply does for HTTP.
func (s *Sim) applyModbus(d *device, w ModbusWrite) error {
	s.mu.Lock()
	if s.closed || s.broken != nil {
		s.mu.Unlock()
		return modbus.ErrServerDeviceFailure
	}
	action, members, err := modbusAction(d.typ, d.state, w)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	next, err := applyWrite(d.typ, d.state, action, members)
	if err != nil {
		s.mu.Unlock()
		s.log.Info("refused (modbus)", "device", d.id, "unit", w.Unit, "reason", err)
		var r *refusal
		if errors.As(err, &r) {
			return modbus.ErrIllegalDataValue
		}
		return modbus.ErrServerDeviceFailure
	}
	params := mustJSON(members)
	e := Entry{Seq: s.seq + 1, Device: d.id, Action: action, Params: params, Modbus: &w, At: time.Now().UTC()}
	jfile, err := s.appendLocked(d, next, e)
	s.mu.Unlock()
	if err != nil {
		s.log.Error("journal append failed: applying nothing more", "err", err)
		return modbus.ErrServerDeviceFailure
	}
	if s.syncJournal(jfile) != nil {
		return modbus.ErrServerDeviceFailure
	}
	s.log.Info("applied (modbus)", "device", d.id, "unit", w.Unit, "action", action, "params", string(params), "seq", e.Seq)
	return nil
}
