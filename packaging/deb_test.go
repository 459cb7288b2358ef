package main

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// The package is built from real binaries and a real plugin, then taken
// apart with dpkg-deb as dpkg would. Skipped only where dpkg-deb is
// missing (apt-get install dpkg); the unit check is skipped where
// systemd-analyze is missing.

const testVersion = "9.8.7-rc1"

// debArch is the Debian name of this machine's architecture, so the
// packaged binaries can be run here.
func debArch(t *testing.T) (arch string, goenv []string, machine elf.Machine) {
	switch runtime.GOARCH {
	case "amd64":
		return "amd64", []string{"GOARCH=amd64"}, elf.EM_X86_64
	case "arm64":
		return "arm64", []string{"GOARCH=arm64"}, elf.EM_AARCH64
	case "arm":
		return "armhf", []string{"GOARCH=arm", "GOARM=7"}, elf.EM_ARM
	}
	t.Skipf("no Debian package for GOARCH %s", runtime.GOARCH)
	return
}

func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

var inputs struct {
	once              sync.Once
	bin, man, plugins string
	err               string
}

// debInputs are the options of a package built from buildInputs' files.
func debInputs(t *testing.T, arch string, goenv []string, version, out string) debOptions {
	t.Helper()
	bin, man, plugins := buildInputs(t, goenv)
	return debOptions{Arch: arch, Version: version, BinDir: bin, ManDir: man, PluginsDir: plugins, RepoDir: "..", OutDir: out}
}

// buildInputs builds the three programs (as make deb does: static,
// trimmed, version injected), their man pages (as make deb does, with
// their hidden man command) and one Go plugin, once for all tests.
func buildInputs(t *testing.T, goenv []string) (bin, man, plugins string) {
	t.Helper()
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("dpkg-deb not installed (apt-get install dpkg)")
	}
	inputs.once.Do(func() {
		tmp, err := os.MkdirTemp("", "edge-agent-deb-inputs")
		if err != nil {
			inputs.err = err.Error()
			return
		}
		inputs.bin, inputs.man, inputs.plugins, inputs.err = build(tmp, goenv)
	})
	if inputs.err != "" {
		t.Fatal(inputs.err)
	}
	return inputs.bin, inputs.man, inputs.plugins
}

func TestMain(m *testing.M) {
	code := m.Run()
	if inputs.bin != "" {
		os.RemoveAll(filepath.Dir(inputs.bin))
	}
	os.Exit(code)
}

func build(tmp string, goenv []string) (bin, man, plugins, failure string) {
	bin, man, plugins = filepath.Join(tmp, "bin"), filepath.Join(tmp, "man"), filepath.Join(tmp, "plugins")
	env := append([]string{"CGO_ENABLED=0", "GOOS=linux"}, goenv...)
	ld := "-s -w -X main.Version=" + testVersion + " -X main.Commit=abc123 -X main.Date=2026-12-01T00:00:00Z"
	goBuild := func(env []string, args ...string) string {
		cmd := exec.Command("go", append([]string{"build"}, args...)...)
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Sprintf("go build %v: %v\n%s", args, err, out)
		}
		return ""
	}
	for _, p := range []struct{ name, pkg string }{{"edge-agent", "./cmd/edge-agent"}, {"edgectl", "./cmd/edgectl"}, {"firmware-sim", "./firmware-sim"}} {
		if f := goBuild(env, "-trimpath", "-ldflags", ld, "-o", filepath.Join(bin, p.name), p.pkg); f != "" {
			return "", "", "", f
		}
	}
	for _, p := range []string{"edge-agent", "edgectl"} {
		cmd := exec.Command(filepath.Join(bin, p), "man", man)
		cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=1796000000")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", "", "", fmt.Sprintf("%s man: %v\n%s", p, err, out)
		}
	}
	f := goBuild([]string{"GOOS=wasip1", "GOARCH=wasm"}, "-buildmode=c-shared", "-o", filepath.Join(plugins, "range-limit.wasm"), "./plugins/range-limit")
	return bin, man, plugins, f
}

func TestDebLayout(t *testing.T) {
	arch, goenv, machine := debArch(t)
	deb, err := buildDeb(debInputs(t, arch, goenv, testVersion, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	if want := "edge-agent_9.8.7~rc1-1_" + arch + ".deb"; filepath.Base(deb) != want {
		t.Fatalf("file %s, want %s", filepath.Base(deb), want)
	}

	// Control fields.
	for field, want := range map[string]string{
		"Package": "edge-agent", "Version": "9.8.7~rc1-1", "Architecture": arch, "Depends": "adduser, procps",
	} {
		if got := strings.TrimSpace(run(t, "", nil, "dpkg-deb", "-f", deb, field)); got != want {
			t.Errorf("%s: %q, want %q", field, got, want)
		}
	}

	// Control archive: the one conffile, the maintainer scripts.
	ctrl := filepath.Join(t.TempDir(), "DEBIAN")
	run(t, "", nil, "dpkg-deb", "-e", deb, ctrl)
	if b, err := os.ReadFile(filepath.Join(ctrl, "conffiles")); err != nil || string(b) != confFile+"\n" {
		t.Errorf("conffiles: %q %v, want %q", b, err, confFile+"\n")
	}
	for _, s := range []string{"postinst", "prerm", "postrm"} {
		p := filepath.Join(ctrl, s)
		fi, err := os.Stat(p)
		if err != nil {
			t.Errorf("no %s: %v", s, err)
			continue
		}
		if fi.Mode().Perm() != 0o755 {
			t.Errorf("%s mode %v", s, fi.Mode())
		}
		run(t, "", nil, "bash", "-n", p)
		if _, err := exec.LookPath("dash"); err == nil { // /bin/sh on Debian
			run(t, "", nil, "dash", "-n", p)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ctrl, "postinst")); !bytes.Contains(b, []byte("adduser --system")) ||
		!bytes.Contains(b, []byte("install -d -o edge-agent -g edge-agent -m 0750 /var/lib/edge-agent")) {
		t.Errorf("postinst creates neither the user nor the state directory:\n%s", b)
	}

	// Every entry is root's.
	for _, l := range strings.Split(strings.TrimSpace(run(t, "", nil, "dpkg-deb", "-c", deb)), "\n") {
		if f := strings.Fields(l); len(f) < 6 || f[1] != "root/root" {
			t.Errorf("not owned by root/root: %s", l)
		}
	}

	// The files, where the unit and the config expect them.
	root := t.TempDir()
	run(t, "", nil, "dpkg-deb", "-x", deb, root)
	for p, in := range programs {
		path := filepath.Join(root, in)
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v %v", path, fi, err)
			continue
		}
		f, err := elf.Open(path)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if f.Machine != machine {
			t.Errorf("%s: %v, want %v", p, f.Machine, machine)
		}
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				t.Errorf("%s is dynamically linked", p)
			}
		}
		f.Close()
		if v := run(t, "", nil, path, "--version"); !strings.HasPrefix(v, p+" "+testVersion+" (commit abc123") {
			t.Errorf("%s --version: %q", p, v)
		}
	}
	same := func(inPkg, inRepo string) {
		t.Helper()
		a, err := os.ReadFile(filepath.Join(root, inPkg))
		b, _ := os.ReadFile(filepath.Join("..", inRepo))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s is not %s (%v)", inPkg, inRepo, err)
		}
	}
	same(confFile, "configs/agent-production.yaml")
	same(unitFile, "configs/edge-agent.service")
	for _, ex := range []string{"mosquitto.conf", "mosquitto.acl", "agent-modbus.yaml", "agent-mosquitto.yaml", "agent-coordinated.yaml"} {
		same(docDir+"/examples/"+ex, "configs/"+ex)
	}
	// Gateways get no simulator on PATH.
	if _, err := os.Stat(filepath.Join(root, binDir, "firmware-sim")); err == nil {
		t.Error("firmware-sim is in /usr/bin")
	}
	// Debian's documentation files, compressed as gzip -9n would.
	gunzip := func(p string) string {
		t.Helper()
		f, err := os.Open(filepath.Join(root, p))
		if err != nil {
			t.Error(err)
			return ""
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			return ""
		}
		if zr.Name != "" || !zr.ModTime.IsZero() {
			t.Errorf("%s: gzip header has name %q, time %v", p, zr.Name, zr.ModTime)
		}
		b, err := io.ReadAll(zr)
		if err != nil {
			t.Errorf("%s: %v", p, err)
		}
		return string(b)
	}
	if cl := gunzip(docDir + "/changelog.Debian.gz"); !strings.HasPrefix(cl, "edge-agent (9.8.7~rc1-1) unstable; urgency=medium\n") {
		t.Errorf("changelog.Debian.gz:\n%s", cl)
	}
	for _, page := range []string{"edge-agent.1", "edge-agent-run.1", "edge-agent-config-check.1", "edgectl.1", "edgectl-send.1"} {
		if m := gunzip(manDir + "/" + page + ".gz"); !strings.Contains(m, ".TH \""+strings.ToUpper(strings.TrimSuffix(page, ".1"))+"\" \"1\"") {
			t.Errorf("man page %s:\n%.300s", page, m)
		}
	}
	if _, err := os.Stat(filepath.Join(root, manDir, "edge-agent-man.1.gz")); err == nil {
		t.Error("the hidden man command has a page")
	}
	if b, err := os.ReadFile(filepath.Join(root, docDir, "copyright")); err != nil || !bytes.HasPrefix(b, []byte("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n")) {
		t.Errorf("copyright: %v\n%s", err, b)
	}
	if b, err := os.ReadFile(filepath.Join(root, pluginsDir, "range-limit.wasm")); err != nil || !bytes.HasPrefix(b, []byte("\x00asm")) {
		t.Errorf("plugin: %v", err)
	}
	conf, _ := os.ReadFile(filepath.Join(root, confFile))
	// The comments name the paths and the command that are this package's.
	if unit, _ := os.ReadFile(filepath.Join(root, unitFile)); !bytes.Contains(unit, []byte("installs it as "+unitFile+";")) {
		t.Errorf("the unit's comment does not name %s", unitFile)
	}
	for _, want := range []string{"edge-agent config check --config " + confFile, "/usr/lib/edge-agent/firmware-sim --devices pump-7:pump", "broker: tcp://127.0.0.1:1883"} {
		if !bytes.Contains(conf, []byte(want)) {
			t.Errorf("the packaged config's comments lack %q", want)
		}
	}
	for _, want := range []string{"data_dir: /var/lib/edge-agent", "dir: /usr/lib/edge-agent/plugins", "broker: embedded", "embedded_listen: 127.0.0.1:"} {
		if !bytes.Contains(conf, []byte(want)) {
			t.Errorf("the packaged config lacks %q", want)
		}
	}

	// The unit, with the packaged binary, passes systemd-analyze verify
	// without a word (it exits 0 even on unknown keys: any output fails).
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze not installed: unit not verified")
		return
	}
	unit, _ := os.ReadFile(filepath.Join(root, unitFile))
	if !bytes.Contains(unit, []byte("ExecStart=/usr/bin/edge-agent ")) {
		t.Fatal("the unit does not run /usr/bin/edge-agent")
	}
	unit = bytes.ReplaceAll(unit, []byte("/usr/bin/edge-agent"), []byte(filepath.Join(root, binDir, "edge-agent")))
	check := filepath.Join(t.TempDir(), "edge-agent.service")
	if err := os.WriteFile(check, unit, 0o644); err != nil {
		t.Fatal(err)
	}
	if vout, err := exec.Command(sa, "verify", check).CombinedOutput(); err != nil || len(bytes.TrimSpace(vout)) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, vout)
	}
}

// The same inputs and SOURCE_DATE_EPOCH give the same bytes.
func TestDebIsReproducible(t *testing.T) {
	arch, goenv, _ := debArch(t)
	t.Setenv("SOURCE_DATE_EPOCH", "1796000000")
	var debs [][]byte
	for i := 0; i < 2; i++ {
		deb, err := buildDeb(debInputs(t, arch, goenv, testVersion, t.TempDir()))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(deb)
		if err != nil {
			t.Fatal(err)
		}
		debs = append(debs, b)
	}
	if !bytes.Equal(debs[0], debs[1]) {
		t.Fatal("two builds of the same package differ")
	}
	sparc := debInputs(t, arch, goenv, testVersion, t.TempDir())
	sparc.Arch = "sparc"
	if _, err := buildDeb(sparc); err == nil ||
		!strings.Contains(err.Error(), "amd64, arm64 or armhf") {
		t.Fatalf("unknown arch: %v", err)
	}
}
