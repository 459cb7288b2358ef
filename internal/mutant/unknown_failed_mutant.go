//go:build mutant_unknown_failed

package mutant

// UnknownAsFailed is true in this mutant build (mutant_unknown_failed): an unknown write ends device_unreachable (not recorded).
const UnknownAsFailed = true
