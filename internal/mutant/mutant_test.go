package mutant

import "testing"

// A build without a mutant_* tag (every build but make chaos-mutants')
// has none of the deliberate bugs.
func TestNormalBuildHasNoMutant(t *testing.T) {
	for name, on := range map[string]bool{
		"FenceCheckOff":        FenceCheckOff,
		"DedupOff":             DedupOff,
		"AckBeforeCommit":      AckBeforeCommit,
		"PublishBeforeCommit":  PublishBeforeCommit,
		"UnknownAsFailed":      UnknownAsFailed,
		"RecoverySkipsPending": RecoverySkipsPending,
	} {
		if on {
			t.Errorf("%s is on in a build without its mutant_* tag", name)
		}
	}
	if len(Tags) != 6 {
		t.Errorf("Tags lists %d mutants, want 6", len(Tags))
	}
}
