package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/store"
)

var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "edge-agent-cli")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "edge-agent")
	// With the fault hooks (internal/failpoint): notify_test.go stalls and
	// fails commits; the released binary's lack of them is checked in
	// internal/failpoint.
	if out, err := exec.Command("go", "build", "-tags", "failpoints", "-o", bin, ".").CombinedOutput(); err != nil {
		os.Stderr.Write(out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func runBin(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("edge-agent %v did not exit", args)
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

const goodDevices = `devices:
  - id: pump-7
    type: pump
    driver: {url: "http://127.0.0.1:1"}
`

// Configuration errors exit 2 with a message naming the key.
func TestConfigErrorsExit2NamingTheKey(t *testing.T) {
	base := "gateway_id: gw-1\ndata_dir: " + t.TempDir() + "\nmqtt: {broker: \"tcp://127.0.0.1:1\"}\nadmin: {listen: \"\"}\n"
	cases := []struct{ name, yaml, want string }{
		{"unknown key", base + "colour: blue\n" + goodDevices, "colour"},
		{"unknown nested key", base + "dedup: {retension: 1h}\n" + goodDevices, "retension"},
		{"bad duration", base + "shutdown_timeout: soon\n" + goodDevices, `"soon" is not a duration`},
		{"bad driver timeout", base + "devices:\n  - id: p\n    type: pump\n    driver: {url: \"http://x\", timeout: 5}\n", "not a duration"},
		{"duplicate device", base + "devices:\n  - {id: p, type: pump, driver: {url: \"http://x\"}}\n  - {id: p, type: pump, driver: {url: \"http://x\"}}\n", `devices[1] (p).id: duplicate device "p"`},
		{"missing driver url", base + "devices:\n  - {id: p, type: pump, driver: {kind: http}}\n", "devices[0] (p).driver.url: required"},
		{"bad device type", base + "devices:\n  - {id: p, type: toaster, driver: {url: \"http://x\"}}\n", "devices[0] (p).type"},
		{"no gateway", "mqtt: {broker: embedded}\n" + goodDevices, "gateway_id: required"},
		{"bad broker", "gateway_id: g\nmqtt: {broker: \"http://x\"}\n" + goodDevices, "mqtt.broker"},
		{"no devices", base, "devices: at least one"},
		{"queue zero", base + "devices:\n  - {id: p, type: pump, queue: 0, driver: {url: \"http://x\"}}\n", "devices[0] (p).queue"},
		{"missing plugin", base + "plugins: {dir: " + t.TempDir() + "}\ndevices:\n  - {id: p, type: pump, driver: {url: \"http://x\"}, policy: {plugin: nope}}\n", "nope"},
		// docs/protocol.md §3, §5 and §6 (2026-12-01).
		{"admin off loopback without a token", "gateway_id: g\ndata_dir: " + t.TempDir() + "\nmqtt: {broker: embedded}\nadmin: {listen: \"0.0.0.0:9464\"}\n" + goodDevices, "admin.token: required when admin.listen"},
		{"embedded broker off loopback, anonymous", "gateway_id: g\ndata_dir: " + t.TempDir() + "\nmqtt: {broker: embedded, embedded_listen: \"0.0.0.0:1883\"}\nadmin: {listen: \"\"}\n" + goodDevices, "mqtt.embedded_listen"},
		{"a bad key file", base + "security: {keys: [{id: ctl-a, public_key_file: /dev/null}]}\n" + goodDevices, "security.keys[0] (ctl-a).public_key_file"},
		{"retention shorter than max_ttl", base + "dedup: {retention: 1m}\n" + goodDevices, "dedup.retention"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "agent.yaml")
			os.WriteFile(p, []byte(tc.yaml), 0o600)
			code, out := runBin(t, "run", "--config", p)
			if code != 2 {
				t.Fatalf("exit %d, want 2\n%s", code, out)
			}
			if !strings.Contains(out, tc.want) {
				t.Fatalf("message does not name %q:\n%s", tc.want, out)
			}
		})
	}
	if code, out := runBin(t, "run", "--config", "/nonexistent/agent.yaml"); code != 2 || !strings.Contains(out, "/nonexistent/agent.yaml") {
		t.Fatalf("missing file: exit %d\n%s", code, out)
	}
	if code, _ := runBin(t, "run", "--bogus"); code != 2 {
		t.Fatalf("unknown flag: exit %d, want 2", code)
	}
}

// inspect on a store held by a running agent exits 1 within 2 s saying so.
func TestInspectHeldStoreExits1Quickly(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "agent.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	start := time.Now()
	code, out := runBin(t, "inspect", "--data-dir", dir)
	if code != 1 || !strings.Contains(out, "held by another process") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %s", d)
	}
	st.Close()
	code, out = runBin(t, "inspect", "--data-dir", dir, "--json")
	if code != 0 || !strings.HasPrefix(strings.TrimSpace(out), "[") {
		t.Fatalf("inspect of a free store: exit %d\n%s", code, out)
	}
}

// version and --version print one line: version, commit, build date, Go
// version, OS/arch (PROTOCOL.md §4), as injected by the Makefile's -ldflags.
func TestVersion(t *testing.T) {
	injected := filepath.Join(t.TempDir(), "edge-agent")
	ld := "-X main.Version=9.8.7 -X main.Commit=abc1234 -X main.Date=2026-12-01T00:00:00Z"
	if out, err := exec.Command("go", "build", "-ldflags", ld, "-o", injected, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -ldflags: %v\n%s", err, out)
	}
	platform := " " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
	for _, tc := range []struct {
		name, bin, want string
	}{
		{"default", bin, "edge-agent 0.1.0-dev (commit "},
		{"injected", injected, "edge-agent 9.8.7 (commit abc1234, built 2026-12-01T00:00:00Z)" + platform},
	} {
		for _, args := range [][]string{{"version"}, {"--version"}} {
			t.Run(tc.name+"/"+args[0], func(t *testing.T) {
				cmd := exec.Command(tc.bin, args...)
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("%v: %v\n%s", args, err, out)
				}
				if !strings.HasPrefix(string(out), tc.want) || !strings.HasSuffix(string(out), platform) {
					t.Fatalf("%v printed %q, want %q...%q", args, out, tc.want, platform)
				}
			})
		}
	}
}

// policy test evaluates one plugin (built from source here) on one command.
func TestPolicyTestCommand(t *testing.T) {
	dir := t.TempDir()
	wasm := buildPlugin(t, dir, "range-limit")
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o600)
		return p
	}
	cfg := write("config.json", `{"param":"rpm","min":0,"max":3000,"clamp":false}`)
	clamp := write("clamp.json", `{"param":"rpm","min":0,"max":3000,"clamp":true}`)
	high := write("high.json", `{"op_id":"o1","fence":1,"action":"set","params":{"rpm":4000}}`)
	ok := write("ok.json", `{"op_id":"o2","fence":1,"action":"set","params":{"rpm":100}}`)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"deny", []string{"--command", high, "--config", cfg}, 0, []string{"decision: deny", "reason: rpm 4000 above max 3000", "time: "}},
		{"allow", []string{"--command", ok, "--config", cfg, "--state", write("state.json", `{"rpm":50}`)}, 0, []string{"decision: allow"}},
		{"rewrite", []string{"--command", high, "--config", clamp}, 0, []string{"decision: allow", `params rewritten: {"rpm":3000}`}},
		{"not wasm", []string{"--command", ok, "--config", cfg, "--plugin-override", write("bad.wasm", "garbage")}, 1, []string{"bad.wasm"}},
		{"missing command", nil, 2, []string{"--command"}},
		// The plugin's own reason for failing is printed.
		{"config rejected", []string{"--command", ok, "--config", write("badcfg.json", `{"param":""}`)}, 1,
			[]string{"error: ", `plugin says (ERROR): policy.config: "param" must be a non-empty string`}},
		{"json", []string{"--command", high, "--config", cfg, "--json"}, 0,
			[]string{`"decision":"deny"`, `"reason":"rpm 4000 above max 3000"`, `"plugin_log":[]`, `"time_us":`}},
		{"json failure", []string{"--command", ok, "--config", write("badcfg2.json", `{"param":""}`), "--json"}, 1,
			[]string{`"error":"`, `"plugin_log":[{"level":"ERROR","stream":"log","msg":"policy.config: \"param\" must be a non-empty string"}]`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"policy", "test", "--plugin", wasm}, tc.args...)
			for i, a := range args {
				if a == "--plugin-override" { // replace the plugin
					args = append(append([]string{"policy", "test", "--plugin", args[i+1]}, args[4:i]...), args[i+2:]...)
					break
				}
			}
			code, out := runBin(t, args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\n%s", code, tc.code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Fatalf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

// config check prints every problem of a configuration, one per line
// naming its key, and exits 2; a sound one exits 0.
func TestConfigCheck(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("gateway_id: \"gw 1\"\nmqtt: {broker: \"http://x\"}\ndevices:\n  - {id: p, type: toaster, queue: 0, driver: {url: \"ftp://x\"}}\n"), 0o600)
	code, out := runBin(t, "config", "check", "--config", bad)
	if code != 2 {
		t.Fatalf("exit %d, want 2\n%s", code, out)
	}
	for _, key := range []string{"gateway_id", "mqtt.broker", "devices[0] (p).type", "devices[0] (p).queue", "devices[0] (p).driver.url", "5 problem(s)"} {
		if !strings.Contains(out, key) {
			t.Errorf("output does not name %q:\n%s", key, out)
		}
	}
	// A plugin that is missing is a problem too (loaded as run loads it).
	missing := filepath.Join(dir, "missing.yaml")
	os.WriteFile(missing, []byte("gateway_id: gw-1\nmqtt: {broker: embedded}\nplugins: {dir: "+dir+"}\n"+
		"devices:\n  - {id: p, type: pump, driver: {url: \"http://127.0.0.1:1\"}, policy: {plugin: nope}}\n"), 0o600)
	if code, out := runBin(t, "config", "check", "--config", missing); code != 2 || !strings.Contains(out, "nope") {
		t.Fatalf("missing plugin: exit %d\n%s", code, out)
	}
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("gateway_id: gw-1\nmqtt: {broker: embedded}\n"+goodDevices), 0o600)
	if code, out := runBin(t, "config", "check", "--config", good); code != 0 || !strings.Contains(out, "ok: gateway gw-1, 1 devices") {
		t.Fatalf("good config: exit %d\n%s", code, out)
	}
	if code, _ := runBin(t, "config", "check"); code != 2 {
		t.Fatalf("no --config: exit %d, want 2", code)
	}
}

// inspect --config reads the configuration's data_dir.
func TestInspectWithConfig(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "agent.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	st.Start()
	if err := st.Update(t.Context(), func(tx *store.Tx) error { return tx.PutDevice("pump-7", store.Device{LastFence: 42}) }); err != nil {
		t.Fatal(err)
	}
	st.Close()
	cfg := filepath.Join(t.TempDir(), "agent.yaml")
	os.WriteFile(cfg, []byte("gateway_id: gw-1\ndata_dir: "+dir+"\nmqtt: {broker: embedded}\n"+goodDevices), 0o600)
	code, out := runBin(t, "inspect", "--config", cfg)
	if code != 0 || !strings.Contains(out, "device pump-7") || !strings.Contains(out, "last_fence 42") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if code, _ := runBin(t, "inspect", "--config", cfg, "--data-dir", dir); code != 2 {
		t.Fatalf("both flags: exit %d, want 2", code)
	}
}

// buildPlugin builds plugins/NAME into dir/NAME.wasm.
func buildPlugin(t *testing.T, dir, name string) string {
	t.Helper()
	wasm := filepath.Join(dir, name+".wasm")
	build := exec.Command("go", "build", "-buildmode=c-shared", "-o", wasm, "../../plugins/"+name)
	build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the plugin: %v\n%s", err, out)
	}
	return wasm
}

// config check reports every problem in the words of the file (key path,
// line, the key a typo was likely meant to be), counts them right, says
// what a plugin said of the config it rejected, and checks that the paths
// the file names exist.
func TestConfigCheckInTheUsersWords(t *testing.T) {
	dir := t.TempDir()
	plugins := filepath.Join(dir, "plugins")
	os.Mkdir(plugins, 0o755)
	buildPlugin(t, plugins, "range-limit")
	notADir := filepath.Join(dir, "file")
	os.WriteFile(notADir, nil, 0o600)
	headWith := func(mqtt string) string {
		return "gateway_id: gw-1\nmqtt: " + mqtt + "\nadmin: {listen: \"\"}\ndata_dir: " + filepath.Join(dir, "data") + "\nplugins: {dir: " + plugins + "}\n"
	}
	head := headWith("{broker: embedded}")
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"typos", `gateway_id: gw-1
mqtt:
  broker: embedded
  embeded_listen: 127.0.0.1:1883
devices:
  - id: pump-7
    type: pmp
    driver:
      url: htp://127.0.0.1:8081
`, []string{
			"config: invalid: mqtt.embeded_listen (line 4): unknown key; did you mean embedded_listen?\n",
			`config: invalid: devices[0] (pump-7).type: "pmp": want pump, valve, relay or generic` + "\n",
			`config: invalid: devices[0] (pump-7).driver.url: "htp://127.0.0.1:8081": want http:// or https://` + "\n",
			": 3 problem(s)\n",
		}},
		{"plugin config typo", head + "devices:\n  - {id: p, type: pump, driver: {url: \"http://127.0.0.1:1\"}, policy: {plugin: range-limit, config: {parm: rpm, min: 0, max: 3000}}}\n", []string{
			`config: invalid: devices[0] (p).policy.config: rejected by plugin range-limit (`,
			`; the plugin says: policy.config: unknown key "parm"` + "\n",
			": 1 problem(s)\n",
		}},
		{"missing plugin", head + "devices:\n  - {id: p, type: pump, driver: {url: \"http://127.0.0.1:1\"}, policy: {plugin: nope}}\n", []string{
			`config: invalid: devices[0] (p).policy.plugin: "nope": no file nope.wasm in plugins.dir (` + plugins + ")\n",
			": 1 problem(s)\n",
		}},
		{"missing plugins.dir", strings.Replace(head, plugins, filepath.Join(dir, "nowhere"), 1) + "devices:\n  - {id: p, type: pump, driver: {url: \"http://127.0.0.1:1\"}, policy: {plugin: range-limit}}\n", []string{
			"config: invalid: plugins.dir: stat " + filepath.Join(dir, "nowhere") + ": no such file or directory (devices[0] (p) binds plugin range-limit)\n",
		}},
		{"data_dir cannot be created", strings.Replace(head, filepath.Join(dir, "data"), filepath.Join(notADir, "data"), 1) + goodDevices, []string{
			"config: invalid: data_dir: " + filepath.Join(notADir, "data") + " does not exist, and cannot be created: " + notADir + " is not a directory\n",
		}},
		{"missing tls file", headWith("{broker: \"ssl://127.0.0.1:8883\", tls: {ca_file: "+filepath.Join(dir, "ca.pem")+"}}") + goodDevices, []string{
			"config: invalid: mqtt.tls.ca_file: stat " + filepath.Join(dir, "ca.pem") + ": no such file or directory\n",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "agent.yaml")
			os.WriteFile(p, []byte(tc.yaml), 0o600)
			code, out := runBin(t, "config", "check", "--config", p)
			if code != 2 {
				t.Fatalf("exit %d, want 2\n%s", code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
	// run names the key of a missing plugin too.
	p := filepath.Join(t.TempDir(), "agent.yaml")
	os.WriteFile(p, []byte(head+"devices:\n  - {id: p, type: pump, driver: {url: \"http://127.0.0.1:1\"}, policy: {plugin: nope}}\n"), 0o600)
	if code, out := runBin(t, "run", "--config", p); code != 2 || !strings.Contains(out, `devices[0] (p).policy.plugin: "nope": no file nope.wasm`) {
		t.Fatalf("run with a missing plugin: exit %d\n%s", code, out)
	}
}

// fence reset records who by the real uid, which the kernel vouches for;
// $SUDO_USER only as what it is, a variable the caller set.
func TestFenceResetRecordsTheRealUser(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "agent.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	st.Start()
	if err := st.Update(t.Context(), func(tx *store.Tx) error { return tx.PutDevice("pump-7", store.Device{LastFence: 1 << 62}) }); err != nil {
		t.Fatal(err)
	}
	st.Close()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	real := fmt.Sprintf("%s (uid %d)@%s", u.Username, os.Getuid(), host)
	cmd := exec.Command(bin, "fence", "reset", "--data-dir", dir, "--device", "pump-7", "--to", "41", "--reason", "poisoned")
	cmd.Env = append(os.Environ(), "SUDO_USER=alice")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("fence reset: %v\n%s", err, out)
	}
	if want := "by " + real + `, SUDO_USER="alice"` + "\n"; !strings.Contains(string(out), want) {
		t.Fatalf("fence reset says:\n%s\nwant %q", out, want)
	}
	code, insp := runBin(t, "inspect", "--data-dir", dir, "--device", "pump-7")
	if code != 0 || !strings.Contains(insp, "to 41 by "+real+`, SUDO_USER="alice": poisoned`) {
		t.Fatalf("inspect: exit %d\n%s", code, insp)
	}
}
