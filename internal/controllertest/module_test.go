package controllertest

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const sdkModule = "github.com/edge-agent/edge-agent/controller"

// outsideProgram imports the three packages of the SDK and uses each: a
// command signed with a fresh key, read back as the agent reads it.
const outsideProgram = `package main

import (
	"crypto/ed25519"
	"fmt"
	"os"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
)

func main() {
	_, priv, _ := ed25519.GenerateKey(nil)
	cmd := fmt.Sprintf(` + "`" + `{"op_id":%q,"fence":7,"action":"set","gateway":"gw-1","device":"pump-7"}` + "`" + `, controller.NewOpID())
	msg, err := jws.Sign(priv, "ctl-1", []byte(cmd))
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	tok, err := jws.Parse(msg)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	c, err := wire.ParseCommand(tok.Payload)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println(wire.CmdTopic(wire.DefaultPrefix, c.Gateway, c.Device), c.Fence, c.Action)
}
`

// goIn runs the go tool in dir with env added (GOWORK off and GOFLAGS
// cleared first, so neither a go.work above the checkout nor the caller's
// flags decide what the module sees) and returns its combined output; a
// failure fails the test.
func goIn(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"GOWORK=off", "GOFLAGS="}, env...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("(cd %s && %s go %s): %v\n%s", dir, strings.Join(env, " "), strings.Join(args, " "), err, out)
	}
	return string(out)
}

// modJSON is the part of `go mod edit -json` this test reads.
type modJSON struct {
	Module  struct{ Path string }
	Go      string
	Require []struct{ Path string }
	Replace []struct {
		Old struct{ Path string }
		New struct{ Path string }
	}
	Toolchain string
}

func readModJSON(t *testing.T, dir string) modJSON {
	t.Helper()
	var m modJSON
	if err := json.Unmarshal([]byte(goIn(t, dir, nil, "mod", "edit", "-json")), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// A program in a module of its own, outside this repository, imports
// controller, controller/wire and controller/wire/jws as a user's would:
// one replace (the SDK's path to this checkout's controller/, where a user
// requires a released version) and the SDK's go.sum as its checksums.
// The first build may fetch, through the module proxy as the environment
// gives it, what a fresh module cache lacks of the SDK's dependencies'
// go.mod files (the SDK's own path is never looked up: it is replaced);
// then, with the proxy off, it builds again and its build list is read, so
// nothing else is needed. It runs, and its build list holds none of what
// only the agent and the project's tools use.
func TestSDKBuildsInAModuleOutsideTheRepository(t *testing.T) {
	sdkDir, err := filepath.Abs("../../controller")
	if err != nil {
		t.Fatal(err)
	}
	sdk := readModJSON(t, sdkDir)
	if sdk.Module.Path != sdkModule {
		t.Fatalf("controller/go.mod is module %q, want %q", sdk.Module.Path, sdkModule)
	}
	if len(sdk.Replace) != 0 {
		t.Fatalf("controller/go.mod has replace directives %+v: a user's build ignores them", sdk.Replace)
	}
	if sdk.Go != "1.26.0" || sdk.Toolchain != "go1.26.8" {
		t.Fatalf("controller/go.mod: go %q, toolchain %q; want go 1.26.0 and toolchain go1.26.8", sdk.Go, sdk.Toolchain)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(outsideProgram), 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(sdkDir, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	offline := []string{"GOPROXY=off", "GOFLAGS=-mod=mod"}
	goIn(t, dir, nil, "mod", "init", "example.com/outside")
	goIn(t, dir, nil, "mod", "edit", "-require", sdkModule+"@v0.0.0-00010101000000-000000000000", "-replace", sdkModule+"="+sdkDir)
	exe := filepath.Join(t.TempDir(), "outside")
	goIn(t, dir, []string{"GOFLAGS=-mod=mod"}, "build", "-o", exe, ".")
	goIn(t, dir, offline, "build", "-o", exe, ".")

	m := readModJSON(t, dir)
	if len(m.Replace) != 1 || m.Replace[0].Old.Path != sdkModule {
		t.Fatalf("the outside module's replace directives %+v, want only the SDK's", m.Replace)
	}
	out, err := exec.Command(exe).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "edge/gw-1/devices/pump-7/cmd 7 set" {
		t.Fatalf("the outside program: %v\n%s", err, out)
	}

	all := goIn(t, dir, nil, "list", "-m", "all")
	for _, f := range []string{
		"github.com/Shopify/toxiproxy", "github.com/anishathalye/porcupine", "github.com/chromedp/",
		"github.com/google/pprof", "github.com/rs/zerolog", "github.com/mochi-mqtt/",
		"github.com/tetratelabs/wazero", "go.etcd.io/bbolt",
		"github.com/edge-agent/edge-agent/plugins/sdk", "github.com/edge-agent/edge-agent ",
	} {
		if strings.Contains(all+"\n", f) {
			t.Errorf("the outside module's build list holds %s:\n%s", strings.TrimSpace(f), all)
		}
	}
	if !strings.Contains(all, sdkModule+" v0.0.0-00010101000000-000000000000 => "+sdkDir) {
		t.Errorf("the build list does not take the SDK from %s:\n%s", sdkDir, all)
	}
}
