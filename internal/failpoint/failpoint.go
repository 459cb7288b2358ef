// Package failpoint holds edge-agent's fault hooks: named points on the
// command path where a test or the chaos campaign (cmd/edge-chaos) can make
// the process SIGKILL itself, a commit fail, or a step slow. They exist only
// in builds with the build tag `failpoints` (go build -tags failpoints, as
// bbolt does with gofail): in any other build every function here is an
// empty stub the compiler removes and Enabled is false, so a released
// binary can never be told, by its environment or anything else, to crash.
//
// In a failpoints build the points are armed from the environment variable
// EDGE_AGENT_FAILPOINTS (read once, at the first hit), a list separated by
// ';' of POINT[:OP_ID]=ACTION, where ACTION is
//
//	crash        SIGKILL this process at the point
//	error        the point's operation fails (Err returns an error)
//	stall        the point never returns (a disk that stopped answering)
//	sleep(D)     the point waits D (a Go duration), e.g. a slow fsync
//
// optionally followed by @N (only the Nth hit of the point) or %P (each hit
// with probability P, 0 < P <= 1, from a generator seeded by
// EDGE_AGENT_FAILPOINTS_SEED, default 1). With :OP_ID the point is armed
// for that operation only. The older variables EDGE_AGENT_CRASH=POINT[:OP],
// EDGE_AGENT_FAULT_FAIL_COMMIT=N and EDGE_AGENT_FAULT_STALL_COMMIT=N mean
// POINT[:OP]=crash, commit=error@N and commit=stall@N.
package failpoint

// The points. docs/testing.md describes each.
const (
	// AfterInbox: a command's admission is durable in the inbox; its
	// PUBACK has not been sent.
	AfterInbox = "after_inbox"
	// BeforeAck: the command's Result was published (the agent waits up
	// to 10s for that); its PUBACK has not been sent.
	BeforeAck = "before_ack"
	// AfterPending: last_fence and the pending record with its key are
	// durable; nothing has been sent to the device.
	AfterPending = "after_pending"
	// DuringWrite: the request has been written to the device; no answer
	// has been read.
	DuringWrite = "during_write"
	// AfterWrite: the device answered; the outcome is not recorded.
	AfterWrite = "after_write"
	// AfterOutcome: the outcome and its Result are durable; the Result
	// has not been handed to the publisher.
	AfterOutcome = "after_outcome"
	// BeforePublish: a Result from the outbox is about to be published.
	BeforePublish = "before_publish"
	// AfterPublish: the broker acknowledged a Result; its outbox entry
	// has not been deleted.
	AfterPublish = "after_publish"
	// Recovery: the store has been read at start-up; no worker has run.
	Recovery = "recovery"
	// Commit: each group commit, inside its transaction (error fails the
	// commit as a disk would; sleep makes it slow, as a slow fsync).
	Commit = "commit"
	// Startup: the fence memory has started (with ha: this agent is
	// active); the plugins are not loaded, the MQTT client not made
	// (sleep: a slow start-up, e.g. plugins compiling on a small board).
	Startup = "startup"
)

// Points lists every point, for validation and the campaign.
var Points = []string{AfterInbox, BeforeAck, AfterPending, DuringWrite, AfterWrite, AfterOutcome,
	BeforePublish, AfterPublish, Recovery, Commit, Startup}
