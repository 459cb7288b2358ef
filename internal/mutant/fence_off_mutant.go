//go:build mutant_fence_off

package mutant

// FenceCheckOff is true in this mutant build (mutant_fence_off): a fence below last_fence is not rejected.
const FenceCheckOff = true
