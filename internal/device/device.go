// Package device holds the drivers that talk to device firmware, behind one
// small interface. A write ends in exactly one of four outcomes (docs/design.md,
// "Talking to a device"): applied, refused, not sent, or unknown.
package device

import (
	"context"
	"encoding/json"
	"time"
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
	// Before is what ReadBacker.Before read before the write was sent
	// (kept in the op's pending record); nil for drivers that do not
	// read back.
	Before json.RawMessage
	// MayTry, when set, is asked before each retry of the write: false
	// ends it without another try (the caller checked before the first).
	// The agent of an ha pair sets it to its write gate, so a deposed
	// active, woken from a pause, does not send a retry after its session
	// is gone (docs/protocol.md §8).
	MayTry func() bool
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
	// is then the state it reported. When false (and ReadBack is nil),
	// the device has tombstoned the key: it will never apply it.
	Applied bool
	State   json.RawMessage
	// ReadBack, when set, is a read-back's readings instead of an answer
	// about the key (ReadBacker): the agent decides from them (the
	// decision table of docs/design.md, "Read-back"). State is then the
	// device's state as read with them, nil when it has no state points.
	ReadBack *ReadBack
}

// ReadBack is what a read-back found: the raw values of the points a
// write sets, as canonical JSON objects keyed by point ({"register
// 0":1200,"coil 0":true}), so that equal values are equal bytes.
type ReadBack struct {
	Intended json.RawMessage // what the write sets
	Before   json.RawMessage // read before the write was sent (nil: not known)
	After    json.RawMessage // read now, after the settle time, on a new connection
}

// ReadBacker is implemented by a driver whose devices cannot be asked
// about a key but whose writes of absolute values (set-points, coils) can
// be verified by reading the written points back (verify: readback;
// docs/design.md, "Read-back"). For such a device Queryable is true and
// the agent resolves an unknown write with ReadBack instead of Query.
type ReadBacker interface {
	// ReadsBack reports whether dev is configured to be read back.
	ReadsBack(dev string) bool
	// Before reads the points w would write, before w is sent; the agent
	// keeps the reading in the write's pending record (w.Before). An
	// error wrapping ErrRefused means w can never be sent (a parameter
	// that does not fit its point: failed/device_error); any other means
	// nothing was written (device_unreachable).
	Before(ctx context.Context, w Write) (json.RawMessage, error)
	// ReadBack reads the points w writes after a quiet period, on a new
	// connection, so that a request still in the device's buffer has
	// been processed. An error means the device could not be read (try
	// again later).
	ReadBack(ctx context.Context, w Write) (QueryResult, error)
}

// Bounded is implemented by a driver whose writes and queries take more
// than one request's timeout (the agent bounds each with these).
type Bounded interface {
	// Bounds are the longest one Apply and one Query (or ReadBack) of dev
	// can take.
	Bounds(dev string) (write, query time.Duration)
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
