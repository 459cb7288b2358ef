package mqtt

import "errors"

// Options (New, NewEmbedded).
var (
	// ErrInvalidOptions is returned by New and NewEmbedded when an option is
	// missing or malformed; the message names the field.
	ErrInvalidOptions = errors.New("mqtt: invalid options")
)

// Lifecycle (Client.Start, Embedded.Start, and every call after Close).
var (
	// ErrClosed is returned by every method of a Client or Embedded called
	// after (or interrupted by) Close.
	ErrClosed = errors.New("mqtt: closed")
	// ErrStarted is returned by a second call to Start.
	ErrStarted = errors.New("mqtt: already started")
	// ErrNotStarted is returned by Publish and PublishAsync before Start.
	ErrNotStarted = errors.New("mqtt: not started")
	// ErrRefused is returned by Client.Start when the broker refuses the
	// connection for a reason that retrying cannot fix (identifier
	// rejected, bad user name or password, not authorized).
	ErrRefused = errors.New("mqtt: connection refused by the broker")
)

// Publishing (Client.Publish, Client.PublishAsync, Pending).
var (
	// ErrInvalidTopic is returned when a publish topic is empty, contains a
	// wildcard or NUL, or is not UTF-8.
	ErrInvalidTopic = errors.New("mqtt: invalid publish topic")
	// ErrPending is returned by Pending.Err while the PUBACK has not
	// arrived yet.
	ErrPending = errors.New("mqtt: publish still in flight")
)
