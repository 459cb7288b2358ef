// Package wire holds the external contract of docs/protocol.md in code: the MQTT
// topics, the Command, Result and DeviceState payloads, and the result
// codes. The agent, the controller side, edgectl and the tests all import
// it, so the contract has exactly one definition.
package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"
)

// Version is the only schema version that exists.
const Version = 1

// MaxCommandSize is the largest Command payload accepted, in bytes.
const MaxCommandSize = 64 << 10

// ActionFence is the reserved barrier action: it raises last_fence without
// touching the device.
const ActionFence = "fence"

// Status is the coarse outcome of a command.
type Status string

// The four statuses of docs/protocol.md §1.
const (
	StatusApplied  Status = "applied"
	StatusRejected Status = "rejected"
	StatusFailed   Status = "failed"
	StatusUnknown  Status = "unknown"
)

// Code is the machine-readable reason of a Result.
type Code string

// The result codes of docs/protocol.md §1.
const (
	CodeOK                Code = "ok"
	CodeInvalid           Code = "invalid"
	CodeUnknownDevice     Code = "unknown_device"
	CodeStaleFence        Code = "stale_fence"
	CodeLockMismatch      Code = "lock_mismatch"
	CodeOpConflict        Code = "op_conflict"
	CodePolicyDenied      Code = "policy_denied"
	CodePolicyError       Code = "policy_error"
	CodeExpired           Code = "expired"
	CodeBusy              Code = "busy"
	CodeDeviceError       Code = "device_error"
	CodeDeviceUnreachable Code = "device_unreachable"
	CodeNotApplied        Code = "not_applied"
	CodeOutcomeUnknown    Code = "outcome_unknown"
	CodeUnauthorized      Code = "unauthorized"
	// CodeFenceUnconfirmed: the gateway cannot yet confirm it remembers
	// the device's fences (docs/protocol.md §7); not recorded, not final:
	// retry with backoff, like busy.
	CodeFenceUnconfirmed Code = "fence_unconfirmed"
)

// StatusOf returns the status that goes with a code.
func StatusOf(c Code) Status {
	switch c {
	case CodeOK:
		return StatusApplied
	case CodeDeviceError, CodeDeviceUnreachable, CodeNotApplied:
		return StatusFailed
	case CodeOutcomeUnknown:
		return StatusUnknown
	default:
		return StatusRejected
	}
}

// Recorded reports whether an outcome with code c leaves an op record
// (docs/protocol.md §1, "What is recorded"): every final outcome and
// unknown, except the ones answered on arrival (unauthorized, invalid,
// unknown_device, op_conflict, busy). A command that leaves no record is
// handled afresh when it is sent again. policy_error and
// device_unreachable are recorded (final means final, invariant 8): a
// resend, a redelivery or a replay of their command gets the recorded
// outcome, never a run after a final Result.
func Recorded(c Code) bool {
	switch c {
	case CodeUnauthorized, CodeInvalid, CodeUnknownDevice, CodeOpConflict, CodeBusy, CodeFenceUnconfirmed:
		return false
	}
	return true
}

// Codes lists every code, for metrics and documentation.
var Codes = []Code{CodeOK, CodeInvalid, CodeUnknownDevice, CodeStaleFence,
	CodeLockMismatch, CodeOpConflict, CodePolicyDenied, CodePolicyError,
	CodeExpired, CodeBusy, CodeDeviceError, CodeDeviceUnreachable,
	CodeNotApplied, CodeOutcomeUnknown, CodeUnauthorized, CodeFenceUnconfirmed}

// Command is what a controller publishes on a device's cmd topic.
type Command struct {
	V         int             `json:"v,omitempty"`
	OpID      string          `json:"op_id"`
	Fence     int64           `json:"fence"`
	Action    string          `json:"action"`
	Params    json.RawMessage `json:"params,omitempty"`
	Lock      string          `json:"lock,omitempty"`
	Holder    string          `json:"holder,omitempty"`
	ReplyTo   string          `json:"reply_to,omitempty"`
	ExpiresAt *time.Time      `json:"expires_at,omitempty"`
	// Gateway and Device bind a signed command to one topic
	// (docs/protocol.md §6): in a signed command they must equal the
	// topic's gateway and device. A plain command may omit them; the
	// parser reads them when they are strings and ignores them otherwise
	// (before §6 they were unknown members, which are ignored).
	Gateway string `json:"gateway,omitempty"`
	Device  string `json:"device,omitempty"`
}

// Result is the agent's answer to one command.
type Result struct {
	V         int             `json:"v"`
	OpID      string          `json:"op_id,omitempty"`
	Device    string          `json:"device"`
	Fence     int64           `json:"fence,omitempty"`
	Status    Status          `json:"status"`
	Code      Code            `json:"code"`
	Reason    string          `json:"reason"`
	LastFence int64           `json:"last_fence"`
	Duplicate bool            `json:"duplicate"`
	Output    json.RawMessage `json:"output,omitempty"`
	// RewrittenParams is present only when the device's policy rewrote
	// the command's params (e.g. a clamp): the params actually sent to
	// the device (docs/protocol.md §1).
	RewrittenParams json.RawMessage `json:"rewritten_params,omitempty"`
	At              time.Time       `json:"at"`
	// PayloadSHA256 binds an unauthorized Result to the message it
	// refuses (docs/protocol.md §6): the SHA-256, in lowercase hex, of
	// that message's payload as received (PayloadDigest). Its op_id is
	// read unverified, so a publisher without a key could otherwise make
	// the agent answer unauthorized for another command's op_id; a
	// controller takes an unauthorized Result only when this names the
	// bytes it published. Empty for every other code.
	PayloadSHA256 string `json:"payload_sha256,omitempty"`
}

// PayloadDigest is a message payload's Result.PayloadSHA256.
func PayloadDigest(payload []byte) string {
	sum := sha256.Sum256(payload)
	return hex.EncodeToString(sum[:])
}

// Final reports whether the Result ends its operation (anything but unknown).
func (r Result) Final() bool { return r.Status != StatusUnknown }

// DeviceState is the retained per-device state message.
type DeviceState struct {
	Device    string          `json:"device"`
	LastFence int64           `json:"last_fence"`
	LastOpID  string          `json:"last_op_id"`
	State     json.RawMessage `json:"state"`
	At        time.Time       `json:"at"`
	// HeldWrites (extension, docs/protocol.md §1): the device's writes
	// whose outcome is unknown now (recorded unknown, not yet final),
	// each holding the device (or its group) until the device answers
	// or an operator resolves it; omitted when none.
	HeldWrites int `json:"held_writes,omitempty"`
}

// GatewayStatus is the retained payload of the status topic.
type GatewayStatus struct {
	State   string `json:"state"`
	Version string `json:"version,omitempty"`
	// Extensions (docs/protocol.md §1, §8): the publishing agent's role,
	// "single" or "active" (a standby has no broker session, so never
	// publishes), and its host; absent from agents before them.
	Role string `json:"role,omitempty"`
	Host string `json:"host,omitempty"`
}

// DeviceInfo is one row of the admin API's GET /v1/devices.
type DeviceInfo struct {
	Device     string `json:"device"`
	LastFence  int64  `json:"last_fence"`
	LastOpID   string `json:"last_op_id"`
	QueueDepth int    `json:"queue_depth"`
	Pending    int    `json:"pending"`
	// Extensions (docs/protocol.md §3, this implementation): the holder
	// of the last applied command, the device's group, its worker's queue
	// limit, whether the agent can ask it about a write (else an operator
	// resolves its unknown writes), and when its record last changed.
	Holder     string     `json:"holder,omitempty"`
	Group      string     `json:"group,omitempty"`
	QueueLimit int        `json:"queue_limit,omitempty"`
	Queryable  bool       `json:"queryable"`
	UpdatedAt  *time.Time `json:"updated_at,omitempty"`
	// FenceFloor is the last fence floor taken for the device (0: none)
	// and FenceConfirmed whether its fences are known complete
	// (docs/protocol.md §7).
	FenceFloor     int64 `json:"fence_floor"`
	FenceConfirmed bool  `json:"fence_confirmed"`
	// State is the device's last confirmed state ({} before any),
	// Reachable whether the last try to reach it (a write or a query)
	// got an answer, and LastContactAt when it last answered (absent
	// before any answer since the agent started) (docs/protocol.md §3).
	State         json.RawMessage `json:"state,omitempty"`
	Reachable     bool            `json:"reachable"`
	LastContactAt *time.Time      `json:"last_contact_at,omitempty"`
	// LastTryAt (extension) is when the last try to reach it ended:
	// absent before any since the agent started, so that reachable false
	// tells "tried, no answer" from "not tried yet".
	LastTryAt *time.Time `json:"last_try_at,omitempty"`
}
