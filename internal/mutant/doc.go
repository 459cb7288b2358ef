// Package mutant holds the deliberate bugs that prove the chaos campaign
// (cmd/edge-chaos) catches a broken agent: each is a constant that is false
// in every normal build and true only in a build with its own tag, so the
// compiler removes the broken branch from the released binary (and from
// every build but the one mutant build that asks for it).
//
//	tag                     constant              the bug
//	mutant_fence_off        FenceCheckOff         decide.go Check: a fence below last_fence is not stale
//	mutant_dedup_off        DedupOff              decide.go Dedup: a resend of a recorded op is a new command
//	mutant_ack_early        AckBeforeCommit       intake.go intakeLoop: PUBACK on arrival, before the inbox commit is durable
//	mutant_publish_early    PublishBeforeCommit   worker.go recordOutcome: the Result is published before its commit
//	mutant_unknown_failed   UnknownAsFailed       decide.go AfterWrite: an unknown write ends device_unreachable (not recorded, so resendable)
//	mutant_recovery_skip    RecoverySkipsPending  recovery.go: a pending write is re-sent as queued, without asking the device
//
// `make chaos-mutants` builds the agent with each tag and shows that the
// campaign reports a violation for every one (docs/testing.md, "Chaos
// campaign"). Never build a release with a mutant_* tag.
package mutant

// Tags lists every mutant's build tag, in the order of the table above.
var Tags = []string{
	"mutant_fence_off",
	"mutant_dedup_off",
	"mutant_ack_early",
	"mutant_publish_early",
	"mutant_unknown_failed",
	"mutant_recovery_skip",
}
