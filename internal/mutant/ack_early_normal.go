//go:build !mutant_ack_early

package mutant

// AckBeforeCommit is false: this build does not have the mutant mutant_ack_early.
const AckBeforeCommit = false
