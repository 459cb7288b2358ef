//go:build !mutant_recovery_skip

package mutant

// RecoverySkipsPending is false: this build does not have the mutant mutant_recovery_skip.
const RecoverySkipsPending = false
