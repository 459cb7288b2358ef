package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/edge-agent/edge-agent/internal/rig"
)

// buildBinaries builds edge-agent and firmware-sim into dir/bin.
func buildBinaries(dir string) (string, error) {
	bin := filepath.Join(dir, "bin")
	for _, pkg := range []string{"./cmd/edge-agent", "./firmware-sim"} {
		cmd := exec.Command("go", "build", "-o", bin+"/", pkg)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("go build %s (run from the repository root): %w", pkg, err)
		}
	}
	return bin, nil
}

// startEchoProcess runs this binary as the echo baseline (-echo); closing
// its stdin stops it.
// With a device URL it is the device-echo baseline (startEcho).
func startEchoProcess(broker, deviceURL string, n int, m *cpuMeter) (func(), error) {
	in, stdin := io.Pipe()
	p, err := rig.Start(rig.Options{Stdin: in, Stderr: os.Stderr, Lines: true}, os.Args[0], "-echo", broker, "-echo-device", deviceURL, "-echo-devices", fmt.Sprint(n))
	if err != nil {
		return nil, err
	}
	line, err := p.Lines().ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		stdin.Close()
		p.Kill()
		return nil, fmt.Errorf("echo process did not start: %q %v", line, err)
	}
	go io.Copy(io.Discard, p.Lines())
	m.add("echo", p.PID())
	return func() { stdin.Close(); p.Stop(syscall.SIGTERM, 5*time.Second) }, nil
}

// startSimProcess runs firmware-sim with n generic devices d0.. (unit IDs
// 1..n) and returns its URL and, with modbus, its Modbus TCP address.
func startSimProcess(bins string, n int, m *cpuMeter, modbus bool) (string, string, func(), error) {
	var devs []string
	for i := 0; i < n; i++ {
		devs = append(devs, fmt.Sprintf("d%d:generic:%d", i, i+1))
	}
	args := []string{"--listen", "127.0.0.1:0", "--log-level", "warn", "--devices", strings.Join(devs, ",")}
	if modbus {
		args = append(args, "--modbus", "127.0.0.1:0")
	}
	// The simulator stands in for device firmware, which runs on hardware
	// of its own, not on the gateway's cores: one P keeps its share of
	// this machine's two cores small (65 against 77 us of CPU per
	// command with the default, measured 2026-11-30) so the agent is what
	// is measured.
	sim, err := rig.Start(rig.Options{Env: []string{"GOMAXPROCS=1"}, Lines: true}, filepath.Join(bins, "firmware-sim"), args...)
	if err != nil {
		return "", "", nil, err
	}
	r := sim.Lines()
	line, err := r.ReadString('\n')
	url := strings.TrimSpace(strings.TrimPrefix(line, "firmware-sim listening on "))
	if err != nil || !strings.HasPrefix(url, "http://") {
		sim.Stop(syscall.SIGTERM, time.Second)
		return "", "", nil, fmt.Errorf("firmware-sim did not start: %q %v", line, err)
	}
	var mbAddr string
	if modbus {
		line, err = r.ReadString('\n')
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "firmware-sim modbus on ")
		if mbAddr, _, _ = strings.Cut(rest, " "); err != nil || !ok {
			sim.Stop(syscall.SIGTERM, time.Second)
			return "", "", nil, fmt.Errorf("firmware-sim's Modbus listener did not start: %q %v", line, err)
		}
	}
	go io.Copy(io.Discard, r)
	m.add("firmware-sim", sim.PID())
	return url, mbAddr, func() { sim.Stop(syscall.SIGTERM, 5*time.Second) }, nil
}

// startAgentProcesses runs firmware-sim and edge-agent (with every commit
// fsynced, as configured by default) as processes, the agent's admin API on
// a free port to wait for /readyz; extra is added to its configuration.
func startAgentProcesses(bins, dir, broker, keyFile, extra string, n int, m *cpuMeter, k kind) (func(), string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, "", err
	}
	url, mbAddr, stopSim, err := startSimProcess(bins, n, m, k.modbus())
	if err != nil {
		return nil, "", err
	}
	admin, err := rig.FreeAddr()
	if err != nil {
		stopSim()
		return nil, "", err
	}
	cfg := filepath.Join(dir, "agent.yaml")
	yaml := agentYAML(filepath.Join(dir, "data"), broker, admin, url, keyFile, n)
	if k.modbus() {
		yaml = modbusYAML(filepath.Join(dir, "data"), broker, admin, mbAddr, n, k == agentReadBackKind)
	}
	if err := os.WriteFile(cfg, []byte(yaml+extra), 0o600); err != nil {
		stopSim()
		return nil, "", err
	}
	agent, err := rig.Start(rig.Options{Env: agentEnv, Stderr: os.Stderr}, filepath.Join(bins, "edge-agent"), "run", "--config", cfg, "--log-level", "warn")
	if err != nil {
		stopSim()
		return nil, "", err
	}
	stop := func() {
		agent.Stop(syscall.SIGTERM, 10*time.Second)
		stopSim()
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				m.add("edge-agent", agent.PID())
				return stop, admin, nil
			}
		}
		if time.Now().After(deadline) {
			stop()
			return nil, "", fmt.Errorf("edge-agent not ready on %s within 20s", admin)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
