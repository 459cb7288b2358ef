//go:build mutant_recovery_skip

package mutant

// RecoverySkipsPending is true in this mutant build (mutant_recovery_skip): recovery re-sends a pending write as queued, without asking the device.
const RecoverySkipsPending = true
