//go:build !mutant_dedup_off

package mutant

// DedupOff is false: this build does not have the mutant mutant_dedup_off.
const DedupOff = false
