package sim

import "errors"

// Errors of the simulator's life cycle.
var (
	// ErrClosed is returned by Start, Open and SetFaults after Close.
	ErrClosed = errors.New("sim: closed")
	// ErrStarted is returned by Start when the simulator already serves.
	ErrStarted = errors.New("sim: already started")
)

// Errors of configuration (New, SetFaults).
var (
	// ErrNoDevices is returned by New when Options.Devices is empty.
	ErrNoDevices = errors.New("sim: no devices")
	// ErrBadDeviceID is returned by New for an ID outside [A-Za-z0-9_.-]{1,64}.
	ErrBadDeviceID = errors.New("sim: invalid device ID")
	// ErrUnknownType is returned by New for a type other than pump, valve,
	// relay or generic.
	ErrUnknownType = errors.New("sim: unknown device type")
	// ErrUnknownDevice is returned by SetFaults and State for a device the
	// simulator does not simulate.
	ErrUnknownDevice = errors.New("sim: unknown device")
	// ErrBadFaults is returned by SetFaults for a rate outside 0..1 or a
	// negative latency.
	ErrBadFaults = errors.New("sim: invalid faults")
	// ErrBadUnit is returned by New for a Modbus unit ID outside 1..255,
	// given twice, or given to a device not simulated.
	ErrBadUnit = errors.New("sim: invalid Modbus unit")
)

// Errors of the journal (Open, Start).
var (
	// ErrCorruptJournal is returned when a complete line of the journal or
	// of its tombstones file cannot be read. A torn last line (a write cut
	// by a crash before its fsync, so never acknowledged) is not an error:
	// it is cut off.
	ErrCorruptJournal = errors.New("sim: corrupt journal")
)
