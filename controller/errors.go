package controller

import (
	"errors"
	"fmt"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// Acquire.
var (
	// ErrAcquireTimeout is returned by Acquire when the locks were not all
	// held within LockOptions.AcquireTimeout (or ctx ended first). Nothing
	// is held afterwards.
	ErrAcquireTimeout = errors.New("controller: acquire did not complete within its bound")
	// ErrNoLocks is returned by Acquire for an empty or invalid list of
	// lock names.
	ErrNoLocks = errors.New("controller: invalid lock names")
	// ErrUsed is returned by Acquire on a Holder that was already used: a
	// holder is one ownership generation and never re-acquires.
	ErrUsed = errors.New("controller: holder already used; create a new one")
)

// Ownership.
var (
	// ErrLost is returned (wrapped, with the cause) once ownership may
	// have been lost: the session ended, renewals were overdue, or a
	// device reported a newer fence. A lost holder sends nothing more.
	ErrLost = errors.New("controller: ownership lost")
	// ErrSessionEnded is the cause of ErrLost when the etcd session ended.
	ErrSessionEnded = errors.New("controller: etcd session ended")
	// ErrRenewalOverdue is the cause of ErrLost when the last confirmed
	// renewal (counted from when it was sent) leaves less than the safety
	// margin of the TTL.
	ErrRenewalOverdue = errors.New("controller: lease renewal overdue")
	// ErrNewerFence is the cause of ErrLost when a device reported
	// stale_fence or a last_fence above the holder's fence.
	ErrNewerFence = errors.New("controller: a newer fence was accepted by the device")
	// ErrMaxHold is the reason a holder released itself when
	// LockOptions.MaxHold elapsed.
	ErrMaxHold = errors.New("controller: maximum hold time reached")
	// ErrNotActive is returned when an operation needs an ACTIVE holder.
	ErrNotActive = errors.New("controller: holder is not active")
	// ErrUnknownLock is returned for a lock name the holder does not hold.
	ErrUnknownLock = errors.New("controller: lock not held by this holder")
)

// Release.
var (
	// ErrNotOwner is returned by Release when etcd refused the guarded
	// delete because the lock key is no longer this holder's: nothing of
	// a newer holder was removed.
	ErrNotOwner = errors.New("controller: not the owner any more; nothing released")
	// ErrReleaseUnconfirmed is returned by Release when the delete or the
	// lease revoke did not complete in time: the lock counts as held
	// until the lease's TTL has run out.
	ErrReleaseUnconfirmed = errors.New("controller: release not confirmed; lock counts as held until the TTL runs out")
)

// Send.
var (
	// ErrClosed is returned by a Conn used after Close.
	ErrClosed = errors.New("controller: connection closed")
	// ErrConnect is returned by Dial when the broker cannot be reached or
	// the reply subscription fails.
	ErrConnect = errors.New("controller: cannot connect to the MQTT broker")
	// ErrPublish is returned by Send when a publish did not complete and
	// ctx ended (wrapped with ErrOutcomeUnknown): a publish lost with the
	// connection is sent again, with the same op_id, until ctx ends.
	ErrPublish = errors.New("controller: publish failed")
	// ErrOutcomeUnknown is returned by Send when ctx ended before a final
	// Result arrived (while waiting, or while retrying after busy): the
	// command may or may not take effect, until its expires_at (Send
	// always sets one: SendOptions.ExpiresIn) and never after; resend it
	// with the same op_id to learn its outcome.
	ErrOutcomeUnknown = errors.New("controller: outcome unknown (no final result before the deadline)")
	// ErrNotApplied is wrapped by *ResultError for a final Result that is
	// not applied.
	ErrNotApplied = errors.New("controller: command not applied")
	// ErrBarrier is returned by Barrier when a device did not confirm the
	// barrier with applied and last_fence >= the holder's fence.
	ErrBarrier = errors.New("controller: barrier not confirmed")
	// ErrInvalidCommand is returned by Send for a device, action, params
	// or op_id that breaks docs/protocol.md §1.
	ErrInvalidCommand = errors.New("controller: invalid command")
)

// ResultError is returned by Send for a final Result other than applied
// (wrapping ErrNotApplied), and for any Result showing a newer owner
// (stale_fence, or last_fence above the fence: wrapping ErrLost and
// ErrNewerFence; such a Result may even be an applied replay).
type ResultError struct {
	Result wire.Result
	lost   bool
}

func (e *ResultError) Error() string {
	return fmt.Sprintf("controller: device %s op %s: %s/%s: %s",
		e.Result.Device, e.Result.OpID, e.Result.Status, e.Result.Code, e.Result.Reason)
}

// Unwrap lets errors.Is see ErrNotApplied (and ErrLost, ErrNewerFence when
// the Result showed a newer owner).
func (e *ResultError) Unwrap() []error {
	var errs []error
	if e.Result.Status != wire.StatusApplied {
		errs = append(errs, ErrNotApplied)
	}
	if e.lost {
		errs = append(errs, ErrLost, ErrNewerFence)
	}
	return errs
}
