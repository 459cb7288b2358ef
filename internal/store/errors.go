package store

import "errors"

var (
	// ErrFailed is returned by every Update after a commit failed: a store
	// that failed a commit (or an fsync) is not trusted again; the process
	// must stop and recover on restart (docs/design.md invariant 5).
	ErrFailed = errors.New("store: a commit failed earlier; the store is stopped")
	// ErrClosed is returned by calls after Close.
	ErrClosed = errors.New("store: closed")
	// ErrLocked is returned by Open when another process holds the store.
	ErrLocked = errors.New("store: held by another process (is an agent running? use the admin API)")
)

// ErrFormat is returned by Open for a file in a layout this build does not
// read.
var ErrFormat = errors.New("store: unsupported file format")

// ErrCorrupt is returned by Open for a file bbolt cannot read (damaged
// pages): it is never repaired in place; the message says what to do.
var ErrCorrupt = errors.New("store: the store file is corrupt")

// Resetting a fence (Tx.ResetFence).
var (
	// ErrResetNotLower: the fence to reset to is not below last_fence.
	ErrResetNotLower = errors.New("store: a reset must lower last_fence")
	// ErrResetBusy: the device has commands not yet final (queued,
	// pending, unknown): a queued command with a high fence would poison
	// last_fence again, and an unresolved write must be resolved first.
	ErrResetBusy = errors.New("store: the device has commands that are not final")
	// ErrNoDevice: the store has no record of the device.
	ErrNoDevice = errors.New("store: no such device")
)
