package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// pathWithout is a directory of links to the given tools only: a PATH on
// which clang and wasm-ld are missing.
func pathWithout(t *testing.T, tools ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, tool := range tools {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Skipf("%s not installed", tool)
		}
		if err := os.Symlink(p, filepath.Join(dir, tool)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func makeIn(t *testing.T, path string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("make", append([]string{"--no-print-directory"}, args...)...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "PATH="+path)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// make build needs Go only: without clang and wasm-ld the C plugin is
// skipped with a message; with them it is built. make plugins-c (which
// make test depends on) fails without them. Dry runs (-n -B): nothing is
// built or touched.
func TestMakeBuildsTheCPluginOnlyWithClang(t *testing.T) {
	goOnly := pathWithout(t, "make", "go", "mkdir")
	out, err := makeIn(t, goOnly, "-n", "-B", "build")
	if err != nil {
		t.Fatalf("make -n build with Go only: %v\n%s", err, out)
	}
	if !strings.Contains(out, "skipped the C plugins (range-limit-c)") || strings.Contains(out, "clang --target") {
		t.Fatalf("make -n build without clang:\n%s", out)
	}
	for _, want := range []string{"plugins/build/range-limit.wasm", "CGO_ENABLED=0 go build -trimpath -ldflags \"-s -w -X main.Version=", "-o bin/edge-agent"} {
		if !strings.Contains(out, want) {
			t.Fatalf("make -n build lacks %q:\n%s", want, out)
		}
	}
	if out, err := makeIn(t, goOnly, "-B", "plugins-c"); err == nil || !strings.Contains(out, "clang and wasm-ld are required") {
		t.Fatalf("make plugins-c without clang: %v\n%s", err, out)
	}
	if _, err := exec.LookPath("clang"); err != nil {
		t.Log("clang not installed: the build with it is not checked")
		return
	}
	if _, err := exec.LookPath("wasm-ld"); err != nil {
		t.Log("wasm-ld not installed: the build with it is not checked")
		return
	}
	out, err = makeIn(t, os.Getenv("PATH"), "-n", "-B", "plugins")
	if err != nil || !strings.Contains(out, "clang --target=wasm32") || strings.Contains(out, "skipped") {
		t.Fatalf("make -n plugins with clang: %v\n%s", err, out)
	}
}
