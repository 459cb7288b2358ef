package device

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/simonvetter/modbus"
)

// This file is the Modbus driver's I/O: the connection of each device,
// Apply, and the reads of Before and ReadBack. A device's mu is held for
// every request, so its connection carries one request at a time.

// Apply sends w's writes (see Modbus for how the outcome is decided), then
// reads the device's state points. ctx bounds the whole write; the
// library's requests are bounded by the device's timeout each, and ctx is
// looked at between them.
func (m *Modbus) Apply(ctx context.Context, w Write) WriteResult {
	d := m.device(w.Device)
	if d == nil {
		return WriteResult{Outcome: NotSent, Reason: fmt.Sprintf("device %s: %v", w.Device, ErrUnknownDevice)}
	}
	plan, err := d.plan(w)
	if err != nil {
		return WriteResult{Outcome: Refused, Reason: refusedText(err)}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := m.ready(ctx, d, &plan[0].point); err != nil {
		return WriteResult{Outcome: NotSent, Reason: "could not reach the device: " + err.Error()}
	}
	res := WriteResult{}
	for i, p := range plan {
		if ctx.Err() != nil {
			if i == 0 {
				return WriteResult{Outcome: NotSent, Reason: "cancelled before anything was sent"}
			}
			return m.unknown(w, WriteResult{Outcome: Unknown, Tries: res.Tries,
				Reason: fmt.Sprintf("cancelled after %d of %d writes", i, len(plan))})
		}
		res.Tries++
		err := d.write(p)
		if err == nil {
			continue
		}
		what := describeWrite(p)
		if refusal(err) {
			if i == 0 {
				return WriteResult{Outcome: Refused, Tries: res.Tries, Reason: fmt.Sprintf("the device refused %s: %v", what, err)}
			}
			// Earlier writes of this action took effect: it happened in part.
			return m.unknown(w, WriteResult{Outcome: Unknown, Tries: res.Tries,
				Reason: fmt.Sprintf("the device refused %s after %d of %d writes took effect: %v", what, i, len(plan), err)})
		}
		if !isException(err) {
			d.drop() // a connection that failed mid-request may hold a late answer
		}
		return m.unknown(w, WriteResult{Outcome: Unknown, Tries: res.Tries,
			Reason: fmt.Sprintf("may have reached the device: %s: %s", what, describeModbus(err, d.cfg.Timeout))})
	}
	res.Outcome = Applied
	if len(d.cfg.State) > 0 {
		st, err := d.readState()
		if err != nil {
			res.Reason = "applied, but the state could not be read: " + describeModbus(err, d.cfg.Timeout)
			m.log.Warn("modbus device applied the write but its state could not be read", "device", w.Device, "op_id", w.OpID, "err", err)
		} else {
			res.State = st
		}
	}
	m.log.Debug("modbus write", "device", w.Device, "op_id", w.OpID, "writes", len(plan), "state", string(res.State))
	return res
}

func (m *Modbus) unknown(w Write, res WriteResult) WriteResult {
	m.log.Warn("modbus write outcome unknown", "device", w.Device, "op_id", w.OpID, "key", w.Key, "reason", res.Reason)
	return res
}

// Before reads the points w would write (see ReadBacker). A stale
// connection is opened again once: a read can be repeated without harm.
func (m *Modbus) Before(ctx context.Context, w Write) (json.RawMessage, error) {
	d := m.device(w.Device)
	if d == nil {
		return nil, fmt.Errorf("device %s: %w", w.Device, ErrUnknownDevice)
	}
	plan, err := d.plan(w)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var vals []raw
	for try := 0; try < 2; try++ {
		if err = m.ready(ctx, d, nil); err != nil {
			break
		}
		if vals, err = d.readAll(points(plan)); err == nil || isException(err) {
			break
		}
		d.drop()
	}
	if err != nil {
		return nil, fmt.Errorf("device %s: reading the points before the write: %s", w.Device, describeModbus(err, d.cfg.Timeout))
	}
	return readings(points(plan), vals), nil
}

// ReadBack closes the device's connection, waits the settle time, opens a
// new one and reads the points w writes and the state points.
func (m *Modbus) ReadBack(ctx context.Context, w Write) (QueryResult, error) {
	d := m.device(w.Device)
	if d == nil {
		return QueryResult{}, fmt.Errorf("device %s: %w", w.Device, ErrUnknownDevice)
	}
	if !d.cfg.ReadBack {
		return QueryResult{}, fmt.Errorf("device %s: %w", w.Device, ErrNotReadBack)
	}
	plan, err := d.plan(w)
	if err != nil {
		// The configuration changed since the write: it cannot be judged.
		return QueryResult{}, fmt.Errorf("device %s: the write cannot be read back under the current configuration: %w", w.Device, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	// A request still in the device's buffer belongs to the old
	// connection: closing it and waiting lets the device finish it (or
	// drop it) before the reading.
	d.drop()
	t := time.NewTimer(d.cfg.Settle)
	select {
	case <-ctx.Done():
		t.Stop()
		return QueryResult{}, fmt.Errorf("device %s: read-back: %w", w.Device, ctx.Err())
	case <-t.C:
	}
	if err := m.ready(ctx, d, nil); err != nil {
		return QueryResult{}, fmt.Errorf("device %s: read-back: %v", w.Device, err)
	}
	vals, err := d.readAll(points(plan))
	if err != nil {
		if !isException(err) {
			d.drop()
		}
		return QueryResult{}, fmt.Errorf("device %s: read-back: %s", w.Device, describeModbus(err, d.cfg.Timeout))
	}
	intended := make([]raw, len(plan))
	for i, p := range plan {
		intended[i] = p.val
	}
	q := QueryResult{ReadBack: &ReadBack{Intended: readings(points(plan), intended), Before: w.Before, After: readings(points(plan), vals)}}
	if len(d.cfg.State) > 0 {
		if q.State, err = d.readState(); err != nil {
			m.log.Warn("modbus read-back: the state could not be read", "device", w.Device, "err", err)
		}
	}
	return q, nil
}

// ready makes sure d has a connection: it dials when there is none
// (waiting out the backoff after failed dials, within ctx), and probes a
// connection idle for longer than probeIdle by reading probe (nil: no
// probe), dialling again if that fails. Called with d.mu held.
func (m *Modbus) ready(ctx context.Context, d *mbDevice, probe *ModbusPoint) error {
	if d.client != nil && m.probeIdle > 0 && time.Since(d.lastUse) > m.probeIdle && probe != nil {
		if _, err := d.read(*probe); err != nil && !isException(err) {
			m.log.Debug("modbus connection found dead before a write; dialling again", "device", d.id, "err", err)
			d.drop()
		}
	}
	if d.client != nil {
		return nil
	}
	if wait := time.Until(d.nextDial); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting to dial again after %d failures (last: %v): %w", d.fails, d.lastErr, ctx.Err())
		case <-t.C:
		}
	}
	c, err := modbus.NewClient(&modbus.ClientConfiguration{URL: d.cfg.URL, Timeout: d.cfg.Timeout, Logger: m.libLog})
	if err == nil {
		err = c.Open()
	}
	if err != nil {
		d.fails++
		d.lastErr = err
		d.nextDial = time.Now().Add(min(100*time.Millisecond<<min(d.fails-1, 6), 5*time.Second))
		return fmt.Errorf("dial %s: %w", d.cfg.URL, err)
	}
	c.SetUnitId(d.cfg.UnitID)
	d.client, d.fails, d.lastErr, d.lastUse = c, 0, nil, time.Now()
	return nil
}

// drop closes d's connection (the next request dials). d.mu held.
func (d *mbDevice) drop() {
	if d.client != nil {
		d.client.Close()
		d.client = nil
	}
}

// write sends one planned write. d.mu held, connection open.
func (d *mbDevice) write(p planned) error {
	d.lastUse = time.Now()
	switch {
	case p.point.Coil:
		return d.client.WriteCoil(p.point.Address, p.val.bit)
	case len(p.val.words) == 1:
		return d.client.WriteRegister(p.point.Address, p.val.words[0])
	}
	return d.client.WriteRegisters(p.point.Address, p.val.words)
}

func (d *mbDevice) read(p ModbusPoint) (raw, error) {
	d.lastUse = time.Now()
	if p.Coil {
		v, err := d.client.ReadCoil(p.Address)
		return raw{bit: v}, err
	}
	ws, err := d.client.ReadRegisters(p.Address, uint16(p.words()), modbus.HOLDING_REGISTER)
	return raw{words: ws}, err
}

func (d *mbDevice) readAll(ps []ModbusPoint) ([]raw, error) {
	out := make([]raw, len(ps))
	for i, p := range ps {
		v, err := d.read(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.label(), err)
		}
		out[i] = v
	}
	return out, nil
}

// readState reads the state points as a JSON object. d.mu held.
func (d *mbDevice) readState() (json.RawMessage, error) {
	names := sortedNames(d.cfg.State)
	vals := make(map[string]json.RawMessage, len(names))
	for _, n := range names {
		p := d.cfg.State[n]
		v, err := d.read(p)
		if err != nil {
			if !isException(err) {
				d.drop()
			}
			return nil, fmt.Errorf("state %s (%s): %w", n, p.label(), err)
		}
		vals[n] = p.decode(v)
	}
	return stateJSON(vals), nil
}

// refusal reports whether err is an exception that says the device did
// nothing: illegal function, address or value, or busy.
func refusal(err error) bool {
	return errors.Is(err, modbus.ErrIllegalFunction) || errors.Is(err, modbus.ErrIllegalDataAddress) ||
		errors.Is(err, modbus.ErrIllegalDataValue) || errors.Is(err, modbus.ErrServerDeviceBusy)
}

// isException reports whether err is an answer from the device (an
// exception response): the connection is still in step.
func isException(err error) bool {
	for _, e := range []error{modbus.ErrIllegalFunction, modbus.ErrIllegalDataAddress, modbus.ErrIllegalDataValue,
		modbus.ErrServerDeviceFailure, modbus.ErrAcknowledge, modbus.ErrServerDeviceBusy, modbus.ErrMemoryParityError,
		modbus.ErrGWPathUnavailable, modbus.ErrGWTargetFailedToRespond} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// describeModbus says why a request got no (usable) answer.
func describeModbus(err error, timeout time.Duration) string {
	switch {
	case errors.Is(err, modbus.ErrRequestTimedOut), os.IsTimeout(err):
		return fmt.Sprintf("no answer within %v", timeout)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, net.ErrClosed):
		return "connection closed without an answer"
	case isException(err):
		return "exception: " + err.Error()
	}
	return err.Error()
}

func describeWrite(p planned) string {
	if p.param != "" {
		return fmt.Sprintf("the write of %s (%s)", p.param, p.point.label())
	}
	return "the write of " + p.point.label()
}

func refusedText(err error) string {
	s := err.Error()
	if p := ErrRefused.Error() + ": "; len(s) > len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}
