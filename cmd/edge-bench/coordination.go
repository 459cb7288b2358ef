package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/edge-agent/edge-agent/internal/rig"
)

// The cost of coordination.etcd (-coordination, docs/protocol.md §7): the
// agent's CPU per command at n devices with and without it, alternating
// runs against the same broker, and its start-up time to ready (a new
// store, then a restart on it) with and without it. etcd is not on the
// per-command path (the session's keep-alives are), so the CPU should
// differ by less than 5%; a start with coordination checks in (session,
// registration, a claim per device, the identity, and on a new store the
// fence floor) before it is ready.

// coordFence is the fence of every command in these runs, with and
// without coordination alike: above any floor the agent takes on a new
// store (etcd's revision then).
const coordFence = 1 << 40

// startEtcdMember runs one etcd member on free loopback ports with its data
// in dir and returns its client URL.
func startEtcdMember(dir string) (string, func(), error) {
	c, err := rig.FreeAddr()
	if err != nil {
		return "", nil, err
	}
	p, err := rig.FreeAddr()
	if err != nil {
		return "", nil, err
	}
	client, peer := "http://"+c, "http://"+p
	proc, err := rig.Start(rig.Options{Stderr: os.Stderr}, "/usr/bin/etcd", "--name", "bench", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "bench="+peer, "--log-level", "error")
	if err != nil {
		return "", nil, fmt.Errorf("etcd (apt-get install etcd-server): %w", err)
	}
	stop := func() { proc.Stop(syscall.SIGTERM, 5*time.Second) }
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		stop()
		return "", nil, err
	}
	defer cli.Close()
	ok := rig.WaitFor(20*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := cli.Get(ctx, "health")
		return err == nil
	})
	if !ok {
		stop()
		return "", nil, fmt.Errorf("etcd not healthy on %s within 20s", client)
	}
	return client, stop, nil
}

// coordYAML is the coordination block for the agent's configuration.
func coordYAML(endpoint string) string {
	if endpoint == "" {
		return ""
	}
	return fmt.Sprintf("coordination:\n  etcd:\n    endpoints: [%s]\n", endpoint)
}

// startCoordBench is what -coordination and -takeover run on: a temporary
// directory (named after prefix), mosquitto, the binaries built into it
// and one etcd member; stop ends them all.
func startCoordBench(prefix string) (tmp, broker, bins, etcd string, stop func(), err error) {
	tmp, err = os.MkdirTemp("", prefix)
	if err != nil {
		return
	}
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	stops = append(stops, func() { os.RemoveAll(tmp) })
	broker, brokerPid, stopBroker, err := startMosquitto(tmp)
	if err != nil {
		stop()
		return
	}
	mosquittoPid = brokerPid
	stops = append(stops, stopBroker)
	if bins, err = buildBinaries(tmp); err != nil {
		stop()
		return
	}
	etcd, stopEtcd, err := startEtcdMember(tmp)
	if err != nil {
		stop()
		return
	}
	stops = append(stops, stopEtcd)
	return
}

// runCoordination is -coordination: rounds alternating runs at n devices
// without and with coordination, then rounds of start-ups.
func runCoordination(dur time.Duration, n, rounds int, out string) error {
	tmp, broker, bins, etcd, stop, err := startCoordBench("edge-bench-coord")
	if err != nil {
		return err
	}
	defer stop()
	var rate, cpu [2][]float64
	fmt.Printf("%-8s %-12s %10s %9s %9s\n", "devices", "target", "cmds/s", "p50", "p99")
	for r := 0; r < rounds; r++ {
		for i, ep := range []string{"", etcd} {
			st, err := measure(broker, n, dur, target{bins: bins, kind: agentKind, fence: coordFence, coordination: ep,
				dir: filepath.Join(tmp, fmt.Sprintf("run-%d-%d", r, i))})
			if err != nil {
				return fmt.Errorf("coordination %v, round %d: %w", ep != "", r, err)
			}
			fmt.Printf("%-8d %-12s %10.0f %9s %9s   coordination.etcd: %v\n         %s\n", n, "edge-agent", st.perSec, st.p50.Round(time.Microsecond), st.p99.Round(time.Microsecond), ep != "", st.cpu)
			rate[i] = append(rate[i], st.perSec)
			cpu[i] = append(cpu[i], float64(agentCPU(st).Microseconds()))
		}
	}
	var fresh, restart [2][]time.Duration
	for r := 0; r < rounds; r++ {
		for i, ep := range []string{"", etcd} {
			f, rs, err := startupTimes(bins, broker, filepath.Join(tmp, fmt.Sprintf("start-%d-%d", r, i)), ep, n)
			if err != nil {
				return fmt.Errorf("start-up, coordination %v, round %d: %w", ep != "", r, err)
			}
			fmt.Printf("start-up, %d devices, coordination.etcd %v: new store %s, restart %s\n", n, ep != "", f.Round(time.Millisecond), rs.Round(time.Millisecond))
			fresh[i], restart[i] = append(fresh[i], f), append(restart[i], rs)
		}
	}
	cw, cc := median(cpu[0]), median(cpu[1])
	// Each round's pair ran back to back: its ratio is the steadier
	// figure on a machine shared with other work.
	var pairs []float64
	for r := range cpu[0] {
		pairs = append(pairs, (cpu[1][r]/cpu[0][r]-1)*100)
	}
	fmt.Printf("agent CPU per command at %d devices: %.0f µs without, %.0f µs with coordination.etcd (median of %d): %+.1f%%; median of the rounds' pairs %+.1f%%\n", n, cw, cc, rounds, (cc/cw-1)*100, median(pairs))
	if out == "" {
		return nil
	}
	f, err := os.OpenFile(out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintf(f, "\n`go run ./cmd/edge-bench -coordination -devices %d -duration %s -coordination-rounds %d`, %s (alternating runs; one etcd member on loopback):\n\n", n, dur, rounds, time.Now().UTC().Format("2006-01-02"))
	fmt.Fprintln(f, "| coordination.etcd | cmds/s (runs) | median | agent CPU µs/cmd (runs) | median |")
	fmt.Fprintln(f, "|---|---|---|---|---|")
	for i, name := range []string{"off", "on"} {
		fmt.Fprintf(f, "| %s | %s | %.0f | %s | **%.0f** |\n", name, fmtRuns(rate[i]), median(rate[i]), fmtRuns(cpu[i]), median(cpu[i]))
	}
	fmt.Fprintf(f, "\nAgent CPU per command with coordination against without: %+.1f%% (medians); each round's pair, run back to back: %s%%, median %+.1f%%.\n\n", (cc/cw-1)*100, fmtPcts(pairs), median(pairs))
	fmt.Fprintln(f, "| coordination.etcd | start to ready, new store (runs) | median | restart to ready (runs) | median |")
	fmt.Fprintln(f, "|---|---|---|---|---|")
	for i, name := range []string{"off", "on"} {
		fmt.Fprintf(f, "| %s | %s | **%s** | %s | **%s** |\n", name, fmtDurs(fresh[i]), medianDur(fresh[i]), fmtDurs(restart[i]), medianDur(restart[i]))
	}
	return nil
}

// startupTimes starts the agent of n devices on a new store in dir and
// times it to ready (GET /readyz 200), stops it (SIGTERM), and times a
// start on the same store.
func startupTimes(bins, broker, dir, etcd string, n int) (fresh, restart time.Duration, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, 0, err
	}
	url, _, stopSim, err := startSimProcess(bins, n, &cpuMeter{}, false)
	if err != nil {
		return 0, 0, err
	}
	defer stopSim()
	admin, err := rig.FreeAddr()
	if err != nil {
		return 0, 0, err
	}
	cfg := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfg, []byte(agentYAML(filepath.Join(dir, "data"), broker, admin, url, "", n)+coordYAML(etcd)), 0o600); err != nil {
		return 0, 0, err
	}
	once := func() (time.Duration, error) {
		t0 := time.Now()
		p, err := rig.Start(rig.Options{Env: agentEnv, Stderr: os.Stderr}, filepath.Join(bins, "edge-agent"), "run", "--config", cfg, "--log-level", "warn")
		if err != nil {
			return 0, err
		}
		defer p.Stop(syscall.SIGTERM, 10*time.Second)
		hc := http.Client{Timeout: time.Second}
		ready := rig.WaitFor(30*time.Second, func() bool {
			resp, err := hc.Get("http://" + admin + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
		if !ready {
			return 0, fmt.Errorf("edge-agent not ready on %s within 30s (%s)", admin, p.Ended())
		}
		return time.Since(t0), nil
	}
	if fresh, err = once(); err != nil {
		return 0, 0, err
	}
	restart, err = once()
	return fresh, restart, err
}

func medianDur(v []time.Duration) time.Duration {
	s := append([]time.Duration(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2].Round(time.Millisecond)
}

func fmtDurs(v []time.Duration) string {
	var out string
	for i, d := range v {
		if i > 0 {
			out += ", "
		}
		out += d.Round(time.Millisecond).String()
	}
	return out
}

func fmtPcts(v []float64) string {
	var out string
	for i, x := range v {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprintf("%+.1f", x)
	}
	return out
}
