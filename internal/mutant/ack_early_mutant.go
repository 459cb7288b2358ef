//go:build mutant_ack_early

package mutant

// AckBeforeCommit is true in this mutant build (mutant_ack_early): a command is acknowledged before its inbox commit is durable.
const AckBeforeCommit = true
