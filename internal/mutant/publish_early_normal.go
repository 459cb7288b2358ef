//go:build !mutant_publish_early

package mutant

// PublishBeforeCommit is false: this build does not have the mutant mutant_publish_early.
const PublishBeforeCommit = false
