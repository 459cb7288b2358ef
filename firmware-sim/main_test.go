package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/simonvetter/modbus"
)

// TestMain lets the test binary stand in for the firmware-sim binary: run
// with FIRMWARE_SIM_MAIN=1 it is main.
func TestMain(m *testing.M) {
	if os.Getenv("FIRMWARE_SIM_MAIN") == "1" {
		os.Exit(run(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// startProcess runs the simulator as its own process and returns its URL.
func startProcess(t *testing.T, args ...string) (*exec.Cmd, string) {
	t.Helper()
	return startProcessWithStderr(t, os.Stderr, args...)
}

func startProcessWithStderr(t *testing.T, stderr io.Writer, args ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd, l := startLines(t, stderr, 1, args...)
	url, ok := strings.CutPrefix(strings.TrimSpace(l[0]), "firmware-sim listening on ")
	if !ok {
		t.Fatalf("first stdout line = %q", l[0])
	}
	return cmd, url
}

// startLines runs the simulator as its own process and returns its first n
// stdout lines (the listeners it opened, in order).
func startLines(t *testing.T, stderr io.Writer, n int, args ...string) (*exec.Cmd, []string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "FIRMWARE_SIM_MAIN=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	lines := make(chan []string, 1)
	go func() {
		r := bufio.NewReader(stdout)
		var l []string
		for range n {
			s, _ := r.ReadString('\n')
			l = append(l, s)
		}
		lines <- l
		io.Copy(io.Discard, stdout)
	}()
	select {
	case l := <-lines:
		return cmd, l
	case <-time.After(30 * time.Second):
		t.Fatalf("firmware-sim printed no %d stdout lines within 30s", n)
	}
	return nil, nil
}

// writeReadValve writes register 0 of unit 7 over Modbus at url and reads
// it back.
func writeReadValve(t *testing.T, url string) {
	t.Helper()
	c, err := modbus.NewClient(&modbus.ClientConfiguration{URL: url, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Open(); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetUnitId(7)
	if err := c.WriteRegister(0, 55); err != nil {
		t.Fatal(err)
	}
	if v, err := c.ReadRegister(0, modbus.HOLDING_REGISTER); err != nil || v != 55 {
		t.Fatalf("valve register 0 = %d, %v", v, err)
	}
}

func post(t *testing.T, url, key, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Fence-Token", "3")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// TestJournalSurvivesKill: what was answered 200 or 404 before a SIGKILL is
// still known after the restart.
func TestJournalSurvivesKill(t *testing.T) {
	journal := filepath.Join(t.TempDir(), "journal.jsonl")
	args := []string{"--listen", "127.0.0.1:0", "--journal", journal, "--devices", "pump-7:pump,valve-1:valve"}

	cmd, url := startProcess(t, args...)
	for i := range 5 {
		code, body := post(t, url+"/v1/devices/pump-7/apply", fmt.Sprint("k", i), fmt.Sprintf(`{"op_id":"o%d","action":"set","params":{"rpm":%d}}`, i, 100*i))
		if code != 200 {
			t.Fatalf("apply %d: %d %s", i, code, body)
		}
	}
	if code, _ := get(t, url+"/v1/devices/pump-7/ops/never"); code != 404 {
		t.Fatalf("query: %d", code)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	_, url = startProcess(t, args...)
	if code, body := get(t, url+"/v1/devices/pump-7/state"); code != 200 || body != `{"rpm":400}` {
		t.Fatalf("state after restart: %d %s", code, body)
	}
	if code, body := post(t, url+"/v1/devices/pump-7/apply", "k2", `{"op_id":"o2","action":"stop"}`); code != 200 || body != `{"applied":true,"state":{"rpm":200}}` {
		t.Fatalf("repeat after restart: %d %s", code, body)
	}
	if code, body := post(t, url+"/v1/devices/pump-7/apply", "never", `{"action":"stop"}`); code != 409 {
		t.Fatalf("tombstoned key after restart: %d %s", code, body)
	}
	code, body := get(t, url+"/v1/journal")
	if n := len(strings.Split(body, "\n")); code != 200 || n != 5 {
		t.Fatalf("journal after restart: %d, %d lines:\n%s", code, n, body)
	}
}

func TestStopsCleanlyOnSIGTERM(t *testing.T) {
	cmd, _ := startProcess(t, "--listen", "127.0.0.1:0", "--devices", "r:relay")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--devices", "pump-7"},
		{"--devices", "pump-7:toaster"},
		{"--devices", "a:pump,a:valve"},
		{"--bogus"},
		{"--devices", "r:relay", "--log-level", "loud"},
	} {
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), "FIRMWARE_SIM_MAIN=1")
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
			t.Errorf("%q: %v, want exit 2; output:\n%s", args, err, out)
		}
	}
}

// TestLogLevelWarnDropsTheWriteLines: --log-level warn silences the line
// per applied write (edge-bench runs the simulator so); the default logs it.
func TestLogLevelWarnDropsTheWriteLines(t *testing.T) {
	for _, c := range []struct {
		level string
		want  bool
	}{{"", true}, {"warn", false}} {
		args := []string{"--listen", "127.0.0.1:0", "--devices", "r:relay"}
		if c.level != "" {
			args = append(args, "--log-level", c.level)
		}
		var stderr bytes.Buffer // read after Wait: exec's copy has finished then
		cmd, url := startProcessWithStderr(t, &stderr, args...)
		if code, body := post(t, url+"/v1/devices/r/apply", "k1", `{"op_id":"o1","action":"toggle"}`); code != 200 {
			t.Fatalf("apply: %d %s", code, body)
		}
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if got := strings.Contains(stderr.String(), "msg=applied"); got != c.want {
			t.Errorf("--log-level %q: applied line logged = %v, want %v; stderr:\n%s", c.level, got, c.want, stderr.String())
		}
	}
}

func TestParseDevices(t *testing.T) {
	got, units, err := parseDevices(" pump-7:pump, valve-1:valve:9 ")
	if err != nil || len(got) != 2 || got["pump-7"] != "pump" || got["valve-1"] != "valve" {
		t.Fatalf("parseDevices = %v, %v", got, err)
	}
	if len(units) != 1 || units["valve-1"] != 9 {
		t.Fatalf("units = %v", units)
	}
	if _, _, err := parseDevices("p:pump:x"); err == nil || !strings.Contains(err.Error(), `unit "x"`) {
		t.Fatalf("a bad unit: %v", err)
	}
}

// TestModbusFlag: --modbus serves the devices over Modbus TCP, and the
// second stdout line says where and which unit each device is.
func TestModbusFlag(t *testing.T) {
	_, l := startLines(t, os.Stderr, 2, "--listen", "127.0.0.1:0", "--modbus", "127.0.0.1:0", "--devices", "p:pump,v:valve:7", "--log-level", "warn")
	rest, ok := strings.CutPrefix(strings.TrimSpace(l[1]), "firmware-sim modbus on ")
	addr, units, ok2 := strings.Cut(rest, " units ")
	if !ok || !ok2 || units != "p=1,v=7" {
		t.Fatalf("second stdout line = %q", l[1])
	}
	writeReadValve(t, "tcp://"+addr)
}

// TestModbusRTUFlag: --modbus-rtu serves the devices over Modbus
// RTU-over-TCP, and its stdout line (after --modbus's) says where and which
// unit each device is.
func TestModbusRTUFlag(t *testing.T) {
	_, l := startLines(t, os.Stderr, 3, "--listen", "127.0.0.1:0", "--modbus", "127.0.0.1:0", "--modbus-rtu", "127.0.0.1:0", "--devices", "p:pump,v:valve:7", "--log-level", "warn")
	rest, ok := strings.CutPrefix(strings.TrimSpace(l[2]), "firmware-sim modbus-rtu on ")
	addr, units, ok2 := strings.Cut(rest, " units ")
	if !ok || !ok2 || units != "p=1,v=7" || !strings.HasPrefix(l[1], "firmware-sim modbus on ") {
		t.Fatalf("stdout lines = %q", l)
	}
	writeReadValve(t, "rtuovertcp://"+addr)
}

// --version prints version, commit, build date, Go version and OS/arch and
// exits 0 without needing --devices.
func TestVersionFlag(t *testing.T) {
	cmd := exec.Command(os.Args[0], "--version")
	cmd.Env = append(os.Environ(), "FIRMWARE_SIM_MAIN=1")
	out, err := cmd.CombinedOutput()
	want := "firmware-sim " + Version + " (commit unknown, built unknown) " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
	if err != nil || string(out) != want {
		t.Fatalf("%v: %q, want %q", err, out, want)
	}
}
