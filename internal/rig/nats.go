package rig

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// NATSBinary is where FindNATS looks first (Debian's nats-server package
// installs it there); then it searches PATH.
const NATSBinary = "/usr/sbin/nats-server"

// ErrNoNATS is FindNATS's error when there is no nats-server binary.
var ErrNoNATS = errors.New("nats-server not found (" + NATSBinary + ", PATH): apt-get install nats-server")

// FindNATS returns the nats-server binary's path.
func FindNATS() (string, error) {
	if _, err := os.Stat(NATSBinary); err == nil {
		return NATSBinary, nil
	}
	if p, err := exec.LookPath("nats-server"); err == nil {
		return p, nil
	}
	return "", ErrNoNATS
}

// NATSOptions say how StartNATS runs a cluster. Zero values are the
// documented defaults.
type NATSOptions struct {
	// Dir holds each node's configuration, JetStream store and log
	// (required; the caller removes it).
	Dir string
	// Nodes is the cluster's size (default 3). The MQTT streams are
	// replicated on min(Nodes, 3) of them.
	Nodes int
	// AckWait is how long a node waits for a PUBACK before it sends a
	// QoS 1 message again (mqtt ack_wait; NATS's own default is 30s).
	// Default 3s: a client that crashed with unacknowledged commands gets
	// them again that long after it reconnects, not half a minute later.
	AckWait time.Duration
	// MaxAckPending is how many QoS 1 messages a node sends one
	// subscription without a PUBACK (mqtt max_ack_pending, 1..65535;
	// NATS's default 1024). Default 1024.
	MaxAckPending int
	// Binary is the nats-server to run ("": FindNATS).
	Binary string
	// Ready is how long StartNATS and Restart wait for a node to accept
	// an MQTT CONNECT and SUBSCRIBE (default 3 minutes: a fresh node waits
	// for a JetStream meta leader, and its MQTT streams, before it does).
	Ready time.Duration
}

// NATSNode is one nats-server of a NATSCluster.
type NATSNode struct {
	Name       string
	MQTTPort   int    // the MQTT listener (the agent's broker URL)
	ClientPort int    // the NATS client listener
	RoutePort  int    // the cluster route listener
	StoreDir   string // the JetStream store
	ConfPath   string
	LogPath    string

	mu   sync.Mutex
	proc *Proc // nil while stopped
}

// URL is the node's MQTT listener, tcp://127.0.0.1:port.
func (n *NATSNode) URL() string { return "tcp://" + n.MQTTAddr() }

// MQTTAddr is 127.0.0.1:port of the MQTT listener.
func (n *NATSNode) MQTTAddr() string { return "127.0.0.1:" + strconv.Itoa(n.MQTTPort) }

// Running reports whether the node's process is alive.
func (n *NATSNode) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc != nil && n.proc.Running()
}

// PID is the node's process ID (0 while stopped).
func (n *NATSNode) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc == nil {
		return 0
	}
	return n.proc.PID()
}

// NATSCluster is a NATS server cluster with JetStream and its MQTT
// interface on loopback, as StartNATS started it: the broker cluster of
// docs/protocol.md §9 for the tests (internal/testkit/mqtttest.StartNATS),
// the chaos campaign and the benchmarks.
type NATSCluster struct {
	Nodes []*NATSNode
	o     NATSOptions
	bin   string
}

// NATSConf is the configuration of one node of a loopback NATS cluster:
// JetStream storing under storeDir, the cluster "edge" with routes to
// every port in routes (its own among them: NATS ignores a route to
// itself), and the MQTT listener with its streams replicated
// streamReplicas times, ack_wait and max_ack_pending. It is what StartNATS
// writes; a campaign or bench that runs nats-server itself can use it.
func NATSConf(name string, clientPort, routePort, mqttPort int, routes []int, storeDir string,
	streamReplicas int, ackWait time.Duration, maxAckPending int) string {
	var rs []string
	for _, p := range routes {
		rs = append(rs, "nats-route://127.0.0.1:"+strconv.Itoa(p))
	}
	return fmt.Sprintf(`# a node of a loopback NATS cluster (internal/rig.NATSConf)
server_name: %s
listen: 127.0.0.1:%d
jetstream {
  store_dir: %q
}
cluster {
  name: edge
  listen: 127.0.0.1:%d
  routes: [%s]
}
mqtt {
  listen: 127.0.0.1:%d
  stream_replicas: %d
  ack_wait: "%s"
  max_ack_pending: %d
}
`, name, clientPort, storeDir, routePort, strings.Join(rs, ", "), mqttPort, streamReplicas, ackWait, maxAckPending)
}

// StartNATS starts a NATS cluster on free loopback ports and returns once
// every node accepts an MQTT CONNECT and a QoS 1 SUBSCRIBE (within
// o.Ready). Its processes are killed if this process dies; Stop ends them.
// A port someone took meanwhile makes it try again on new ports (3 tries).
func StartNATS(o NATSOptions) (*NATSCluster, error) {
	if o.Dir == "" {
		return nil, errors.New("rig: StartNATS without a Dir")
	}
	if o.Nodes <= 0 {
		o.Nodes = 3
	}
	if o.AckWait <= 0 {
		o.AckWait = 3 * time.Second
	}
	if o.MaxAckPending <= 0 {
		o.MaxAckPending = 1024
	}
	if o.Ready <= 0 {
		o.Ready = 3 * time.Minute
	}
	bin := o.Binary
	if bin == "" {
		var err error
		if bin, err = FindNATS(); err != nil {
			return nil, err
		}
	}
	var err error
	for try := 1; try <= 3; try++ {
		var c *NATSCluster
		if c, err = tryNATS(o, bin, try); err == nil {
			return c, nil
		}
	}
	return nil, err
}

func tryNATS(o NATSOptions, bin string, try int) (*NATSCluster, error) {
	c := &NATSCluster{o: o, bin: bin}
	var routes []int
	taken := map[int]bool{}
	port := func() (int, error) {
		for {
			p, err := FreePort()
			if err != nil || !taken[p] {
				taken[p] = true
				return p, err
			}
		}
	}
	for i := range o.Nodes {
		n := &NATSNode{Name: fmt.Sprintf("n%d", i+1)}
		var err error
		for _, p := range []*int{&n.MQTTPort, &n.ClientPort, &n.RoutePort} {
			if *p, err = port(); err != nil {
				return nil, err
			}
		}
		dir := filepath.Join(o.Dir, fmt.Sprintf("try%d", try), n.Name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		n.StoreDir, n.ConfPath, n.LogPath = filepath.Join(dir, "store"), filepath.Join(dir, "nats.conf"), filepath.Join(dir, "nats.log")
		routes = append(routes, n.RoutePort)
		c.Nodes = append(c.Nodes, n)
	}
	replicas := min(o.Nodes, 3)
	for _, n := range c.Nodes {
		conf := NATSConf(n.Name, n.ClientPort, n.RoutePort, n.MQTTPort, routes, n.StoreDir, replicas, o.AckWait, o.MaxAckPending)
		if err := os.WriteFile(n.ConfPath, []byte(conf), 0o600); err != nil {
			return nil, err
		}
	}
	for i := range c.Nodes {
		if err := c.start(i); err != nil {
			c.Stop()
			return nil, err
		}
	}
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i := range c.Nodes {
		wg.Go(func() { errs[i] = c.WaitReady(i, o.Ready) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *NATSCluster) start(i int) error {
	n := c.Nodes[i]
	logf, err := os.OpenFile(n.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	p, err := Start(Options{Out: logf}, c.bin, "-c", n.ConfPath)
	if err != nil {
		logf.Close()
		return err
	}
	go func() {
		<-p.Done()
		logf.Close()
	}()
	n.mu.Lock()
	n.proc = p
	n.mu.Unlock()
	return nil
}

// URLs are the nodes' MQTT URLs, in node order.
func (c *NATSCluster) URLs() []string {
	var us []string
	for _, n := range c.Nodes {
		us = append(us, n.URL())
	}
	return us
}

// Kill kills node i (SIGKILL) and waits for it to exit: what it had not
// written to its store is lost, as in a crash. The others keep serving
// (a 3-node cluster keeps its JetStream quorum with one node down).
func (c *NATSCluster) Kill(i int) {
	n := c.Nodes[i]
	n.mu.Lock()
	p := n.proc
	n.proc = nil
	n.mu.Unlock()
	if p != nil {
		p.Kill()
	}
}

// Restart starts node i again (killing it first if it runs) on the same
// ports and store and waits until it accepts MQTT clients again.
func (c *NATSCluster) Restart(i int) error {
	c.Kill(i)
	if err := c.start(i); err != nil {
		return err
	}
	return c.WaitReady(i, c.o.Ready)
}

// Stop kills every node.
func (c *NATSCluster) Stop() {
	for i := range c.Nodes {
		c.Kill(i)
	}
}

// Log is the tail (last n bytes) of node i's log, without the lines a
// node writes every second while a route to a stopped node is refused.
func (c *NATSCluster) Log(i, n int) string {
	b, _ := os.ReadFile(c.Nodes[i].LogPath)
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, "Error trying to connect to route") {
			keep = append(keep, l)
		}
	}
	s := strings.Join(keep, "\n")
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return s
}

// WaitReady waits up to within until node i accepts an MQTT CONNECT
// (clean session, so that nothing is left behind) and a QoS 1 SUBSCRIBE:
// a node refuses CONNECT until JetStream has a meta leader and the MQTT
// streams exist, and a SUBSCRIBE until it can create the subscription's
// consumer.
func (c *NATSCluster) WaitReady(i int, within time.Duration) error {
	n := c.Nodes[i]
	deadline := time.Now().Add(within)
	var last error
	for {
		n.mu.Lock()
		p := n.proc
		n.mu.Unlock()
		if p == nil || !p.Running() {
			return fmt.Errorf("rig: nats node %s is not running\n%s", n.Name, c.Log(i, 2000))
		}
		if last = mqttProbe(n.MQTTAddr(), "rig-probe-"+n.Name); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("rig: nats node %s does not accept MQTT clients on %s after %s: %v\n%s",
				n.Name, n.MQTTAddr(), within, last, c.Log(i, 2000))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// mqttProbe connects to addr with MQTT 3.1.1 (clean session), subscribes
// to a topic at QoS 1 and disconnects; nil when the broker accepted both.
func mqttProbe(addr, clientID string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	str := func(s string) []byte { return append([]byte{byte(len(s) >> 8), byte(len(s))}, s...) }
	packet := func(typ byte, body []byte) []byte {
		b := []byte{typ}
		n := len(body)
		for {
			d := byte(n % 128)
			n /= 128
			if n > 0 {
				d |= 0x80
			}
			b = append(b, d)
			if n == 0 {
				break
			}
		}
		return append(b, body...)
	}
	// CONNECT: "MQTT", level 4, clean session, keep alive 30s.
	body := append(str("MQTT"), 4, 0x02, 0, 30)
	body = append(body, str(clientID)...)
	if _, err := conn.Write(packet(0x10, body)); err != nil {
		return err
	}
	r := bufio.NewReader(conn)
	read := func() (byte, []byte, error) {
		typ, err := r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		n, mul := 0, 1
		for {
			d, err := r.ReadByte()
			if err != nil {
				return 0, nil, err
			}
			n += int(d&0x7f) * mul
			if d&0x80 == 0 {
				break
			}
			mul *= 128
		}
		b := make([]byte, n)
		_, err = io.ReadFull(r, b)
		return typ, b, err
	}
	typ, b, err := read()
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if typ != 0x20 || len(b) != 2 || b[1] != 0 {
		return fmt.Errorf("connect refused: packet %#x %v", typ, b)
	}
	// SUBSCRIBE packet id 1, the probe's own topic, QoS 1.
	sub := append([]byte{0, 1}, str("rig/probe/"+clientID)...)
	sub = append(sub, 1)
	if _, err := conn.Write(packet(0x82, sub)); err != nil {
		return err
	}
	typ, b, err = read()
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	if typ != 0x90 || len(b) != 3 || b[2] != 1 {
		return fmt.Errorf("subscribe refused: packet %#x %v", typ, b)
	}
	_, _ = conn.Write([]byte{0xe0, 0})
	return nil
}

// Signal sends sig to node i (SIGSTOP and SIGCONT pause and resume it).
func (c *NATSCluster) Signal(i int, sig syscall.Signal) error {
	n := c.Nodes[i]
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if p == nil {
		return fmt.Errorf("rig: nats node %s is not running", n.Name)
	}
	return p.Signal(sig)
}
