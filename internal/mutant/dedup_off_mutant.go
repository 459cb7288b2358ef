//go:build mutant_dedup_off

package mutant

// DedupOff is true in this mutant build (mutant_dedup_off): a resend of a recorded op is admitted as a new command.
const DedupOff = true
