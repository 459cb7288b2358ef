package device

import "errors"

// Errors of configuration (NewHTTP, Add).
var (
	// ErrInvalidConfig is returned for a device configuration that cannot
	// work: a missing or non-HTTP URL, a negative timeout, retries out of
	// range. The message names the device and the field.
	ErrInvalidConfig = errors.New("device: invalid driver configuration")
	// ErrDuplicateDevice is returned by Add for a device already configured.
	ErrDuplicateDevice = errors.New("device: device configured twice")
)

// Errors of use (the Reason of a NotSent WriteResult, or Query).
var (
	// ErrUnknownDevice is returned by Query, and is the Reason of a NotSent
	// Apply, for a device this driver has no configuration for.
	ErrUnknownDevice = errors.New("device: device not configured in this driver")
	// ErrNotQueryable is returned by Query for a device configured
	// queryable: false: its answer could not be trusted as a tombstone.
	ErrNotQueryable = errors.New("device: device is not queryable")
	// ErrUnexpectedStatus is returned by Query when the device answers
	// neither 200 (applied) nor a tombstone 404, e.g. a 5xx, or a 404 that
	// says the device itself is unknown.
	ErrUnexpectedStatus = errors.New("device: unexpected answer to an ops query")
	// ErrBadResponse is returned by Query when a 200 answer cannot be read
	// or does not say applied.
	ErrBadResponse = errors.New("device: unreadable answer")
	// ErrRefused is returned by ReadBacker.Before for a write that can
	// never be sent: a parameter missing, not mapped, or not fitting its
	// point. The message names the parameter.
	ErrRefused = errors.New("device: write refused before sending")
	// ErrNotReadBack is returned by ReadBack for a device not configured
	// verify: readback.
	ErrNotReadBack = errors.New("device: device is not read back")
)
