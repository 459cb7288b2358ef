//go:build mutant_publish_early

package mutant

// PublishBeforeCommit is true in this mutant build (mutant_publish_early): an outcome's Result is published before its commit.
const PublishBeforeCommit = true
