package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// lintian, Debian's package checker, has nothing to say about the
// package: no error, no warning, and no override that is not needed.
// Skipped where lintian is missing (apt-get install lintian), except under
// CI (CI set in the environment), where it fails: .ci/run installs it.
func TestDebLintian(t *testing.T) {
	lintian, err := exec.LookPath("lintian")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("lintian not installed: CI must install it (.ci/run)")
		}
		t.Skip("lintian not installed (apt-get install lintian): the package is not checked")
	}
	arch, goenv, _ := debArch(t)
	deb, err := buildDeb(debInputs(t, arch, goenv, testVersion, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(lintian, "--no-cfg", "--display-info", "--fail-on", "error,warning", deb).CombinedOutput()
	var tags []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "E: ") || strings.HasPrefix(l, "W: ") || strings.Contains(l, "unused-override") || strings.Contains(l, "mismatched-override") {
			tags = append(tags, l)
		}
	}
	if err != nil || len(tags) > 0 {
		t.Fatalf("lintian %s: %v\n%s\nall it said:\n%s", deb, err, strings.Join(tags, "\n"), out)
	}
	t.Logf("lintian:\n%s", out)
}
