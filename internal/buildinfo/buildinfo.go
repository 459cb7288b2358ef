// Package buildinfo says what a binary was built from: the version, commit
// and date the Makefile injects into each command's main package with
// -ldflags -X, the Go toolchain and the platform (PROTOCOL.md §4:
// `edge-agent version`, `edgectl --version`).
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Line is the one-line answer to `--version`:
//
//	edge-agent 1.2.0 (commit 13c51ed, built 2026-12-01T14:14:00Z) go1.26.8 linux/arm64
//
// An empty commit is read from the binary's own build information when the
// Go toolchain recorded it (a `go build` inside a git checkout), else
// "unknown"; an empty date is "unknown".
func Line(name, version, commit, date string) string {
	if version == "" {
		version = "unknown"
	}
	if commit == "" {
		commit = vcsRevision()
	}
	if date == "" {
		date = "unknown"
	}
	return fmt.Sprintf("%s %s (commit %s, built %s) %s %s/%s", name, version, commit, date,
		runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// Revision is commit, or when it is empty the one read from the binary's
// build information (as Line does): the revision label of
// edge_agent_build_info.
func Revision(commit string) string {
	if commit == "" {
		return vcsRevision()
	}
	return commit
}

// vcsRevision is the commit `go build` stamped into the binary, shortened
// as git does, or "unknown" (built with -buildvcs=false, or not from a
// checkout).
func vcsRevision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				if len(s.Value) > 12 {
					return s.Value[:12]
				}
				return s.Value
			}
		}
	}
	return "unknown"
}
