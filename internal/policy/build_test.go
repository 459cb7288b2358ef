package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
)

// The tests run real plugins built from source: the example plugins of
// plugins/ (Go and C) and the hostile ones of testdata/ (Go and WAT). They
// are built once per source hash into the user's cache directory, so a
// second run does not rebuild. A missing toolchain fails the tests: nothing
// is skipped.

var (
	buildOnce sync.Once
	built     map[string]string // name -> .wasm path
	buildErr  error
)

// goPlugins are the Go plugin packages, by name.
var goPlugins = map[string]string{
	"range-limit": "./plugins/range-limit",
	"ramp-limit":  "./plugins/ramp-limit",
	"interlock":   "./plugins/interlock",
	"allowlist":   "./plugins/allowlist",
	"time-window": "./plugins/time-window",
	"goloop":      "./internal/policy/testdata/goloop",
	"gomembomb":   "./internal/policy/testdata/gomembomb",
	"gopanic":     "./internal/policy/testdata/gopanic",
	"goexit":      "./internal/policy/testdata/goexit",
	"gosleep":     "./internal/policy/testdata/gosleep",
	"gonop":       "./internal/policy/testdata/gonop",
	"gorawnop":    "./internal/policy/testdata/gorawnop",
}

// cPlugins are the C plugins, by name.
var cPlugins = map[string]string{
	"range-limit-c": "plugins/range-limit-c/range_limit.c",
}

// plugins builds (or finds in the cache) every plugin and returns the
// path of the named one.
func pluginPath(t testing.TB, name string) string {
	t.Helper()
	buildOnce.Do(func() { built, buildErr = buildAll() })
	if buildErr != nil {
		t.Fatalf("building test plugins: %v", buildErr)
	}
	p, ok := built[name]
	if !ok {
		t.Fatalf("no test plugin %q", name)
	}
	return p
}

func moduleRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod above %s", wd)
		}
	}
}

func toolVersion(name string, args ...string) (string, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s is required to build the test plugins (apt-get install wabt clang lld): %w", name, err)
	}
	out, err := exec.Command(path, args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s %v: %v: %s", name, args, err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// sourceHash hashes every input of the build: the sources under plugins/
// and internal/policy/testdata/ (the SDK and its JSON scanner included),
// the go.mod and go.sum of both modules (the agent's, and the SDK's under
// plugins/sdk, which the agent's replaces with that directory) and the
// tools' versions.
func sourceHash(root string, versions []string) (string, error) {
	files, err := sourceFiles(root)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, v := range versions {
		io.WriteString(h, v+"\n")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		rel, _ := filepath.Rel(root, f)
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// sourceFiles lists the files sourceHash hashes, sorted.
func sourceFiles(root string) ([]string, error) {
	var files []string
	for _, dir := range []string{"plugins", "internal/policy/testdata"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "build" {
				return filepath.SkipDir
			}
			switch filepath.Ext(p) {
			case ".go", ".c", ".h", ".wat":
				files = append(files, p)
			}
			switch d.Name() {
			case "go.mod", "go.sum", "go.work", "go.work.sum":
				files = append(files, p)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	files = append(files, filepath.Join(root, "go.mod"), filepath.Join(root, "go.sum"))
	sort.Strings(files)
	return files, nil
}

// The plugin cache is keyed by every input of a plugin's build: a change
// to the SDK's module file or its JSON scanner (which moved there from
// internal/, outside the hashed folders) must rebuild the plugins.
func TestSourceHashCoversBothModules(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := sourceFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		have[filepath.ToSlash(rel)] = true
	}
	for _, want := range []string{"go.mod", "go.sum", "plugins/sdk/go.mod", "plugins/sdk/sdk.go",
		"plugins/sdk/jsonscan/jsonscan.go", "plugins/range-limit/main.go", "plugins/range-limit-c/range_limit.c"} {
		if !have[want] {
			t.Errorf("the plugin build cache's hash does not cover %s", want)
		}
	}
}

func buildAll() (map[string]string, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	goBin := "go" // the one on PATH, as every build in the project
	var versions []string
	for _, tool := range [][]string{{goBin, "version"}, {"wat2wasm", "--version"}, {"clang", "--version"}, {"wasm-ld", "--version"}} {
		v, err := toolVersion(tool[0], tool[1:]...)
		if err != nil {
			return nil, err
		}
		versions = append(versions, v)
	}
	hash, err := sourceHash(root, versions)
	if err != nil {
		return nil, err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "edge-agent-policy-test", hash)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	out := map[string]string{}
	type job struct {
		name string
		cmd  *exec.Cmd
	}
	var jobs []job
	for name, pkg := range goPlugins {
		dst := filepath.Join(dir, name+".wasm")
		out[name] = dst
		cmd := exec.Command(goBin, "build", "-buildmode=c-shared", "-o", dst+".tmp", pkg)
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		jobs = append(jobs, job{name, cmd})
	}
	for name, src := range cPlugins {
		dst := filepath.Join(dir, name+".wasm")
		out[name] = dst
		jobs = append(jobs, job{name, exec.Command("clang", cFlags(dst+".tmp", src)...)})
	}
	wats, _ := filepath.Glob(filepath.Join(root, "internal/policy/testdata/*.wat"))
	for _, src := range wats {
		name := strings.TrimSuffix(filepath.Base(src), ".wat")
		dst := filepath.Join(dir, name+".wasm")
		out[name] = dst
		jobs = append(jobs, job{name, exec.Command("wat2wasm", src, "-o", dst+".tmp")})
	}
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	for _, j := range jobs {
		dst := out[j.name]
		if _, err := os.Stat(dst); err == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			j.cmd.Dir = root
			if b, err := j.cmd.CombinedOutput(); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Sprintf("%s: %v: %s", j.name, err, b))
				mu.Unlock()
				return
			}
			if err := os.Rename(dst+".tmp", dst); err != nil {
				mu.Lock()
				errs = append(errs, err.Error())
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		sort.Strings(errs)
		return nil, fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return out, nil
}

// cFlags are the flags Makefile.plugins uses for C plugins.
func cFlags(dst, src string) []string {
	return []string{"--target=wasm32", "-O2", "-nostdlib", "-fno-builtin", "-Wall", "-Wextra", "-Werror",
		"-Wl,--no-entry", "-Wl,--export-dynamic", "-o", dst, src}
}
