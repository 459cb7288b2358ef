package store

import (
	"encoding/json"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// OpStatus is where an operation stands.
type OpStatus string

const (
	// OpQueued: in the inbox, not yet decided by its worker.
	OpQueued OpStatus = "queued"
	// OpPending: allowed, last_fence raised, the write under Key may be
	// under way. At start-up a pending record counts as unknown.
	OpPending OpStatus = "pending"
	// OpUnknown: the write under Key may or may not have happened.
	OpUnknown OpStatus = "unknown"
	// OpFinal: the outcome is recorded (Result fields are set).
	OpFinal OpStatus = "final"
)

// Device is a device's durable record.
type Device struct {
	LastFence int64           `json:"last_fence"`
	LastOpID  string          `json:"last_op_id,omitempty"`
	State     json.RawMessage `json:"state,omitempty"`
	// Finals counts the final op records ever written for the device; an op
	// record's FinalSeq against it says whether it is among the last N.
	Finals    uint64    `json:"finals"`
	UpdatedAt time.Time `json:"updated_at"`
	// FloorSeq is the ops sequence when the device's last fence floor was
	// taken (0: none): an op with InboxSeq at or below it was queued
	// before the floor. Kept in the fence memory's bucket, not in the
	// device record; Tx.Device fills it in.
	FloorSeq uint64 `json:"-"`
}

// Op is one operation's durable record (docs/design.md storage sketch).
type Op struct {
	Device string   `json:"device"`
	OpID   string   `json:"op_id"`
	Status OpStatus `json:"status"`

	// The outcome, set when Status is final (and unknown: the unknown Result).
	Result wire.Status     `json:"result,omitempty"`
	Code   wire.Code       `json:"code,omitempty"`
	Reason string          `json:"reason,omitempty"`
	Output json.RawMessage `json:"output,omitempty"`

	// The command as received.
	Fence       int64           `json:"fence"`
	Action      string          `json:"action"`
	Params      json.RawMessage `json:"params,omitempty"`
	Lock        string          `json:"lock,omitempty"`
	Holder      string          `json:"holder,omitempty"`
	ExpiresAt   *time.Time      `json:"expires_at,omitempty"`
	ReplyTo     string          `json:"reply_to,omitempty"`
	ContentHash []byte          `json:"content_hash"`

	// The write.
	ParamsSent json.RawMessage `json:"params_sent,omitempty"`
	Rewritten  bool            `json:"rewritten,omitempty"`
	Key        string          `json:"key,omitempty"`
	Keys       int             `json:"keys,omitempty"`        // how many keys were issued
	WasUnknown bool            `json:"was_unknown,omitempty"` // once unknown, never device_unreachable
	// UnknownSent: the op's unknown Result is in the outbox (published
	// once per op, also when the op was first counted unknown at a
	// restart).
	UnknownSent bool `json:"unknown_sent,omitempty"`
	// Before is what the device held at the points the write sets, read
	// before the write was sent (drivers that verify by reading back):
	// durable with the pending record, so a recovered write can still be
	// resolved by a read-back.
	Before json.RawMessage `json:"before,omitempty"`
	// Audit marks an operator's act recorded in the device's history
	// (ResetFence): never a command, never swept by retention.
	Audit bool `json:"audit,omitempty"`

	Worker string `json:"worker"`
	// InboxSeq is the record's place in arrival order: its key in the ops
	// bucket and its inbox entry's key.
	InboxSeq   uint64    `json:"inbox_seq"`
	ReceivedAt time.Time `json:"received_at"`
	DecidedAt  time.Time `json:"decided_at,omitempty"`
	FinalSeq   uint64    `json:"final_seq,omitempty"`
}

// Outbox is a Result waiting to be confirmed published.
type Outbox struct {
	Seq     uint64          `json:"-"`
	Topic   string          `json:"topic"`
	Payload json.RawMessage `json:"payload"`
	Device  string          `json:"device"`
	OpID    string          `json:"op_id"`
}

// InboxEntry is one queued command of a worker, in arrival order.
type InboxEntry struct {
	Worker string `json:"worker"`
	Seq    uint64 `json:"-"`
	Device string `json:"dev"`
	OpID   string `json:"op_id"`
}
