//go:build !mutant_unknown_failed

package mutant

// UnknownAsFailed is false: this build does not have the mutant mutant_unknown_failed.
const UnknownAsFailed = false
