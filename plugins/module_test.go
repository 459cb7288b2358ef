// Package plugins_test checks the plugin SDK as the module a plugin author
// depends on (plugins/sdk/go.mod): it requires nothing, its own tests pass
// (they are outside this module, so `go test ./...` here does not reach
// them), and a plugin built in a module of its own that requires only the
// SDK has no dependency of the agent in its go.sum, and runs in the agent's
// policy host.
package plugins_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edge-agent/edge-agent/internal/policy"
)

const sdkModule = "github.com/edge-agent/edge-agent/plugins/sdk"

// examples are the Go example plugins (directories beside this file).
var examples = []string{"range-limit", "ramp-limit", "interlock", "allowlist", "time-window"}

func goBin() string { return "go" } // the one on PATH, as every build in the project

// goCmd runs the go tool in dir with extra environment and returns its
// combined output; a failure fails the test.
func goCmd(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(goBin(), args...)
	cmd.Dir = dir
	// GOWORK=off: a go.work above the checkout must not decide what the
	// module sees. GOFLAGS is cleared so -mod settings of the caller do not
	// leak in.
	cmd.Env = append(os.Environ(), append([]string{"GOWORK=off", "GOFLAGS="}, env...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("(cd %s && %s go %s): %v\n%s", dir, strings.Join(env, " "), strings.Join(args, " "), err, out)
	}
	return string(out)
}

// modFile is the part of `go mod edit -json` these tests read.
type modFile struct {
	Module  struct{ Path string }
	Go      string
	Require []struct{ Path, Version string }
	Replace []struct {
		Old struct{ Path string }
		New struct{ Path, Version string }
	}
}

func readMod(t *testing.T, dir string) modFile {
	t.Helper()
	var m modFile
	if err := json.Unmarshal([]byte(goCmd(t, dir, nil, "mod", "edit", "-json")), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func sdkDir(t *testing.T) string {
	d, err := filepath.Abs("sdk")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The SDK module requires nothing and has no go.sum: everything a plugin
// author's build pulls in through it is the standard library.
func TestSDKModuleRequiresNothing(t *testing.T) {
	m := readMod(t, sdkDir(t))
	if m.Module.Path != sdkModule {
		t.Fatalf("plugins/sdk/go.mod is module %q, want %q", m.Module.Path, sdkModule)
	}
	if len(m.Require) != 0 {
		t.Fatalf("plugins/sdk/go.mod requires %v: a plugin author's go.sum would hold them", m.Require)
	}
	if b, err := os.ReadFile(filepath.Join(sdkDir(t), "go.sum")); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		t.Fatalf("plugins/sdk/go.sum is not empty:\n%s", b)
	}
	// The agent's module takes the SDK from this directory.
	root := readMod(t, "..")
	var required, replaced bool
	for _, r := range root.Require {
		required = required || r.Path == sdkModule
	}
	for _, r := range root.Replace {
		replaced = replaced || (r.Old.Path == sdkModule && r.New.Path == "./plugins/sdk" && r.New.Version == "")
	}
	if !required || !replaced {
		t.Fatalf("go.mod: want `require %s` and `replace %s => ./plugins/sdk` (required %v, replaced %v)", sdkModule, sdkModule, required, replaced)
	}
}

// The SDK module's own checks: go vet (for the host and for wasip1, where
// the ABI exports live) and its tests, which `go test ./...` of the agent's
// module does not reach.
func TestSDKModuleVetAndTests(t *testing.T) {
	dir := sdkDir(t)
	goCmd(t, dir, nil, "vet", "./...")
	goCmd(t, dir, []string{"GOOS=wasip1", "GOARCH=wasm"}, "vet", "./...")
	args := []string{"test", "-count=1"}
	if raceEnabled {
		args = append(args, "-race")
	}
	out := goCmd(t, dir, nil, append(args, "./...")...)
	for _, pkg := range []string{sdkModule, sdkModule + "/jsonscan"} {
		if !strings.Contains(out, "ok  \t"+pkg) {
			t.Errorf("go test in plugins/sdk did not pass %s:\n%s", pkg, out)
		}
	}
}

// A plugin author's module: `go mod init`, a replace of the SDK to this
// checkout (a released SDK is required by version instead), `go mod tidy`
// with the module proxy off (nothing is fetched: the SDK requires
// nothing), every example's source copied in, built for wasip1 as the
// Makefile builds it. Its go.sum and build list hold none of the agent's
// dependencies (etcd, gRPC, paho, wazero ...), and the plugins it built
// decide in the agent's policy host.
func TestExamplesBuildInAModuleThatRequiresOnlyTheSDK(t *testing.T) {
	dir := t.TempDir()
	for _, name := range examples {
		src, err := os.ReadFile(filepath.Join(name, "main.go"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "main.go"), src, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	offline := []string{"GOPROXY=off", "GOFLAGS=-mod=mod"}
	goCmd(t, dir, nil, "mod", "init", "example.com/my-plugins")
	goCmd(t, dir, nil, "mod", "edit", "-replace", sdkModule+"="+sdkDir(t))
	goCmd(t, dir, offline, "mod", "tidy")

	m := readMod(t, dir)
	if len(m.Require) != 1 || m.Require[0].Path != sdkModule {
		t.Fatalf("the plugin module requires %v, want only %s", m.Require, sdkModule)
	}
	sum, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	// Every module the agent's module requires, directly or not.
	forbidden := []string{"go.etcd.io", "google.golang.org/grpc", "google.golang.org/protobuf"}
	for _, r := range readMod(t, "..").Require {
		if r.Path != sdkModule {
			forbidden = append(forbidden, r.Path)
		}
	}
	all := goCmd(t, dir, []string{"GOPROXY=off"}, "list", "-m", "all")
	for _, f := range forbidden {
		if strings.Contains(string(sum), f) {
			t.Errorf("the plugin module's go.sum holds %s:\n%s", f, sum)
		}
		if strings.Contains(all, f) {
			t.Errorf("the plugin module's build list holds %s:\n%s", f, all)
		}
	}
	if len(strings.TrimSpace(string(sum))) != 0 {
		t.Errorf("the plugin module's go.sum is not empty (the SDK requires nothing):\n%s", sum)
	}

	out := t.TempDir()
	for _, name := range examples {
		goCmd(t, dir, append([]string{"GOOS=wasip1", "GOARCH=wasm"}, offline...),
			"build", "-buildmode=c-shared", "-o", filepath.Join(out, name+".wasm"), "./"+name)
	}

	// Two of them run in the agent's policy host, as `edge-agent policy
	// test` runs them: the decisions are the examples' own.
	ctx := context.Background()
	cases := []struct {
		plugin, config, command string
		allow                   bool
		reason                  string
	}{
		{"range-limit", `{"param":"rpm","max":3000}`, `{"op_id":"a","fence":1,"action":"set","params":{"rpm":4000}}`, false, "rpm"},
		{"range-limit", `{"param":"rpm","max":3000}`, `{"op_id":"b","fence":1,"action":"set","params":{"rpm":1200}}`, true, ""},
		{"allowlist", `{"actions":["stop"]}`, `{"op_id":"c","fence":1,"action":"set"}`, false, "action set is not allowed"},
		{"allowlist", `{"actions":["stop"]}`, `{"op_id":"d","fence":1,"action":"stop"}`, true, ""},
	}
	for _, c := range cases {
		d, _, err := policy.TestOnce(ctx, filepath.Join(out, c.plugin+".wasm"), []byte(c.command), nil, []byte(c.config))
		if err != nil {
			t.Fatalf("%s on %s: %v", c.plugin, c.command, err)
		}
		if d.Allow != c.allow || !strings.Contains(d.Reason, c.reason) {
			t.Errorf("%s on %s: %+v, want allow %v with a reason containing %q", c.plugin, c.command, d, c.allow, c.reason)
		}
	}
}
