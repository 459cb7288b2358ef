//go:build !mutant_fence_off

package mutant

// FenceCheckOff is false: this build does not have the mutant mutant_fence_off.
const FenceCheckOff = false
