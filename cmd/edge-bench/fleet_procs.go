package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/edge-agent/edge-agent/internal/rig"
)

// The processes of the fleet run (-fleet, fleet.go): the broker (one
// mosquitto, or a NATS cluster), one etcd member, and per gateway a
// firmware-sim and an edge-agent.

// fleetBroker is a broker the fleet runs on: its nodes' MQTT URLs and the
// PIDs whose CPU counts as the broker's.
type fleetBroker struct {
	name string
	urls []string
	pids []int
	stop func()
}

// startFleetBroker starts the broker named kind (mosquitto, nats) with its
// data under dir.
func startFleetBroker(kind, dir string) (*fleetBroker, error) {
	switch kind {
	case "mosquitto":
		url, pid, stop, err := startMosquitto(dir)
		if err != nil {
			return nil, err
		}
		return &fleetBroker{name: kind, urls: []string{url}, pids: []int{pid}, stop: stop}, nil
	case "nats":
		return startFleetNATS(dir)
	}
	return nil, fmt.Errorf("-fleet-broker %q: want mosquitto or nats", kind)
}

// rotate returns urls starting at the i-th (mod len): the i-th gateway's
// own first node, the others after it in order.
func rotate(urls []string, i int) []string {
	if len(urls) == 0 {
		return nil
	}
	k := i % len(urls)
	return append(append([]string(nil), urls[k:]...), urls[:k]...)
}

// startFleetEtcd runs one etcd member on free loopback ports with its data
// in dir, as startEtcdMember (coordination.go) does, and also returns its
// PID, for the CPU accounting.
func startFleetEtcd(dir string) (string, int, func(), error) {
	c, err := rig.FreeAddr()
	if err != nil {
		return "", 0, nil, err
	}
	p, err := rig.FreeAddr()
	if err != nil {
		return "", 0, nil, err
	}
	client, peer := "http://"+c, "http://"+p
	// Its log (raft's INFO lines come whatever --log-level says) goes to
	// a file, shown when it does not start.
	logf, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		return "", 0, nil, err
	}
	defer logf.Close()
	proc, err := rig.Start(rig.Options{Out: logf}, "/usr/bin/etcd", "--name", "fleet", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "fleet="+peer, "--log-level", "error")
	if err != nil {
		return "", 0, nil, fmt.Errorf("etcd (apt-get install etcd-server): %w", err)
	}
	stop := func() { proc.Stop(syscall.SIGTERM, 5*time.Second) }
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		stop()
		return "", 0, nil, err
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
		b, _ := os.ReadFile(logf.Name())
		return "", 0, nil, fmt.Errorf("etcd not healthy on %s within 20s; its log:\n%s", client, b)
	}
	return client, proc.PID(), stop, nil
}

// startSimOf runs firmware-sim with the generic devices ids (unit IDs
// 1..) and returns its URL and PID. One P, as startSimProcess's: the
// simulator stands in for firmware on hardware of its own.
func startSimOf(bins string, ids []string) (string, int, func(), error) {
	devs := make([]string, len(ids))
	for i, id := range ids {
		devs[i] = fmt.Sprintf("%s:generic:%d", id, i+1)
	}
	sim, err := rig.Start(rig.Options{Env: []string{"GOMAXPROCS=1"}, Lines: true, Stderr: os.Stderr}, filepath.Join(bins, "firmware-sim"),
		"--listen", "127.0.0.1:0", "--log-level", "warn", "--devices", strings.Join(devs, ","))
	if err != nil {
		return "", 0, nil, err
	}
	line, err := sim.Lines().ReadString('\n')
	url := strings.TrimSpace(strings.TrimPrefix(line, "firmware-sim listening on "))
	if err != nil || !strings.HasPrefix(url, "http://") {
		sim.Stop(syscall.SIGTERM, time.Second)
		return "", 0, nil, fmt.Errorf("firmware-sim did not start: %q %v", line, err)
	}
	go io.Copy(io.Discard, sim.Lines())
	return url, sim.PID(), func() { sim.Stop(syscall.SIGTERM, 5*time.Second) }, nil
}

// fleetGateway is one gateway of the fleet: its agent and simulator.
type fleetGateway struct {
	id       string
	devices  []string
	agentPID int
	admin    string // the agent's admin API (/metrics)
	simPID   int
	stop     func()
}

// startFleetGateway runs the i-th gateway: a firmware-sim of its devices
// and an edge-agent (every commit fsynced, coordination.etcd on etcd, the
// broker's nodes from its own first one), and waits until it is ready.
func startFleetGateway(bins, dir string, i, devices int, brokers []string, etcd string) (*fleetGateway, error) {
	g := &fleetGateway{id: fleetGatewayID(i)}
	for d := 0; d < devices; d++ {
		g.devices = append(g.devices, fleetDeviceID(i, d))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	url, simPID, stopSim, err := startSimOf(bins, g.devices)
	if err != nil {
		return nil, err
	}
	g.simPID = simPID
	admin, err := rig.FreeAddr()
	if err != nil {
		stopSim()
		return nil, err
	}
	cfg := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfg, []byte(fleetAgentYAML(g.id, filepath.Join(dir, "data"), admin, url, etcd, rotate(brokers, i), g.devices)), 0o600); err != nil {
		stopSim()
		return nil, err
	}
	// Errors only: on a new store each device logs its fence floor at
	// warn, 320 lines a run at 20 gateways.
	agent, err := rig.Start(rig.Options{Env: agentEnv, Stderr: os.Stderr}, filepath.Join(bins, "edge-agent"), "run", "--config", cfg, "--log-level", "error")
	if err != nil {
		stopSim()
		return nil, err
	}
	g.agentPID, g.admin = agent.PID(), admin
	g.stop = func() {
		agent.Stop(syscall.SIGTERM, 10*time.Second)
		stopSim()
	}
	hc := http.Client{Timeout: 2 * time.Second}
	ready := rig.WaitFor(60*time.Second, func() bool {
		resp, err := hc.Get("http://" + admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if !ready {
		g.stop()
		return nil, fmt.Errorf("gateway %s: edge-agent not ready on %s within 60s (%s)", g.id, admin, agent.Ended())
	}
	return g, nil
}

// fleetGatewayID and fleetDeviceID name the i-th gateway and its d-th
// device: device IDs are unique across the fleet, as the directory
// ({prefix}/devices/{dev}/gateway) needs.
func fleetGatewayID(i int) string   { return fmt.Sprintf("gw%02d", i) }
func fleetDeviceID(i, d int) string { return fmt.Sprintf("gw%02d-d%02d", i, d) }

// fleetLock is the lock a device's controller takes, and the one the
// agent binds the device to (devices[].lock): a command must name it.
func fleetLock(dev string) string { return "locks/device/" + dev }

// fleetAgentYAML is one fleet gateway's configuration: brokers (the
// cluster's nodes, its own first; one: mqtt.broker), coordination.etcd
// on etcd, each device bound to its lock.
func fleetAgentYAML(gateway, dataDir, admin, simURL, etcd string, brokers, devices []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "gateway_id: %s\ndata_dir: %s\nmqtt:\n", gateway, dataDir)
	if len(brokers) == 1 {
		fmt.Fprintf(&b, "  broker: %s\n", brokers[0])
	} else {
		fmt.Fprintf(&b, "  brokers: [%s]\n", strings.Join(brokers, ", "))
	}
	fmt.Fprintf(&b, "  client_id: edge-fleet-%s\nadmin:\n  listen: %q\n", gateway, admin)
	fmt.Fprintf(&b, "coordination:\n  etcd:\n    endpoints: [%s]\n", etcd)
	b.WriteString("devices:\n")
	for _, d := range devices {
		fmt.Fprintf(&b, "  - id: %s\n    type: generic\n    lock: %s\n    driver: {url: %s, idempotent: true, queryable: true}\n", d, fleetLock(d), simURL)
	}
	return b.String()
}

// storeCommits is what an agent's store has committed so far, from its
// /metrics: group commits, the updates in them and their time (fsync
// included): edge_agent_store_commit_updates and _seconds.
type storeCommits struct {
	commits, updates float64
	seconds          float64
}

func (g *fleetGateway) storeCommits() (storeCommits, error) {
	hc := http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get("http://" + g.admin + "/metrics")
	if err != nil {
		return storeCommits{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return storeCommits{}, err
	}
	return parseStoreCommits(string(b)), nil
}

// parseStoreCommits reads the commit histograms' _count and _sum from a
// Prometheus text exposition.
func parseStoreCommits(text string) storeCommits {
	var c storeCommits
	for _, line := range strings.Split(text, "\n") {
		name, val, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		switch name {
		case "edge_agent_store_commit_updates_count":
			c.commits = v
		case "edge_agent_store_commit_updates_sum":
			c.updates = v
		case "edge_agent_store_commit_seconds_sum":
			c.seconds = v
		}
	}
	return c
}
