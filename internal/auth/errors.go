package auth

import "errors"

// Verifying (Verifier.Open).
var (
	// ErrUnauthorized is wrapped by every *Error: the message is not a
	// valid JWS by a configured key allowed for the device, with the
	// binding of docs/protocol.md §6.
	ErrUnauthorized = errors.New("auth: unauthorized")
)

// Configuring (New, Verifier.SetKeys).
var (
	// ErrInvalidKeys: a key ID is invalid or repeated, a key has no
	// public key, or a devices glob is malformed; the message names the
	// key.
	ErrInvalidKeys = errors.New("auth: invalid keys")
)

// Error is why a command is unauthorized: one sentence for the Result's
// reason and the log, naming the key when one was named.
type Error struct {
	Reason string
	KeyID  string // the header's kid; "" when none was read
}

func (e *Error) Error() string { return "auth: unauthorized: " + e.Reason }

// Unwrap makes errors.Is(err, ErrUnauthorized) true.
func (e *Error) Unwrap() error { return ErrUnauthorized }
