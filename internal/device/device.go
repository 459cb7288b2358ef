// Package device holds the drivers that talk to device firmware, behind one
// small interface. A write ends in exactly one of four outcomes (docs/design.md,
// "Talking to a device"): applied, refused, not sent, or unknown.
package device

import (
	"context"
	"encoding/json"
)

// Outcome is how one write ended.
type Outcome int

const (
	// Applied: the device confirmed the write (HTTP 2xx).
	Applied Outcome = iota + 1
	// Refused: the device decided not to apply it (HTTP 4xx). No effect.
	Refused
	// NotSent: no try could have reached the device (every connection
	// refused, DNS failure, ...). No effect.
	NotSent
	// Unknown: some try may have reached the device (timeout after
	// sending, dropped connection, HTTP 5xx). Must be resolved by Query.
	Unknown
)

func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Refused:
		return "refused"
	case NotSent:
		return "not_sent"
	case Unknown:
		return "unknown"
	}
	return "invalid"
}

// Write is one operation sent to a device under one idempotency key. Every
// try of the write reuses Key.
type Write struct {
	Device string
	OpID   string
	Key    string
	Fence  int64
	Action string
	Params json.RawMessage // a JSON object, or nil for {}
}

// WriteResult is the outcome of one write.
type WriteResult struct {
	Outcome Outcome
	// State is the device's state after an Applied write (the firmware's
	// "state" object), nil otherwise.
	State json.RawMessage
	// Reason is one human-readable sentence for Refused, NotSent and
	// Unknown (e.g. the device's error text, or "timeout after 2s").
	Reason string
	// Tries is how many HTTP requests were made.
	Tries int
}

// QueryResult answers "was the write with this key applied?".
type QueryResult struct {
	// Applied is true when the device applied a write with the key; State
	// is then the state it reported. When false, the device has
	// tombstoned the key: it will never apply it.
	Applied bool
	State   json.RawMessage
}

// Driver talks to the firmware of the devices configured with it. It is
// safe for concurrent use by different devices' workers.
type Driver interface {
	// Apply sends one write, retrying within the write only where a retry
	// cannot apply twice, and reports its outcome. ctx bounds the whole
	// write; cancellation mid-try makes the outcome Unknown if a request
	// may have been sent.
	Apply(ctx context.Context, w Write) WriteResult
	// Query asks the device whether the write with key was applied. A
	// non-nil error means the device could not be asked (try again later).
	Query(ctx context.Context, dev, key string) (QueryResult, error)
	// Queryable reports whether Query can be used for this device.
	Queryable(dev string) bool
}
