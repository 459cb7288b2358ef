// Package etcdtest starts real etcd servers (the system's /usr/bin/etcd) on
// free loopback ports for tests, one member or a cluster, and offers a TCP
// proxy that can freeze a client's traffic to etcd. Everything it starts is
// stopped in t.Cleanup.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edge-agent/edge-agent/internal/testkit"
	"go.uber.org/zap"
)

// Binary is the etcd server binary the helpers start.
var Binary = "/usr/bin/etcd"

// ErrNoLeader is returned by Cluster.Leader when no live member reports a
// leader.
var ErrNoLeader = errors.New("etcdtest: no leader")

// Member is one etcd server process.
type Member struct {
	Name      string
	ClientURL string
	PeerURL   string
	DataDir   string
	LogFile   string

	mu   sync.Mutex
	proc *testkit.Proc
}

// Cluster is a set of etcd members started together.
type Cluster struct {
	t       testing.TB
	Members []*Member
	initial string
}

// Start starts an n-member etcd cluster on free loopback ports, waits until
// every member serves requests and registers its stop with t.Cleanup. A
// port taken meanwhile by someone else is retried on new ports. It skips
// the test when the etcd binary is missing.
func Start(t testing.TB, n int) *Cluster {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		t.Skipf("etcdtest: %s not installed: %v", Binary, err)
	}
	var err error
	for try := 0; try < 3; try++ {
		var c *Cluster
		if c, err = tryStart(t, n); err == nil {
			return c
		}
	}
	t.Fatalf("etcdtest: %v", err)
	return nil
}

func tryStart(t testing.TB, n int) (*Cluster, error) {
	dir := t.TempDir()
	c := &Cluster{t: t}
	var parts []string
	for i := 0; i < n; i++ {
		m := &Member{
			Name:      fmt.Sprintf("m%d", i),
			ClientURL: "http://" + testkit.FreeAddr(t),
			PeerURL:   "http://" + testkit.FreeAddr(t),
		}
		m.DataDir = filepath.Join(dir, m.Name)
		m.LogFile = filepath.Join(dir, m.Name+".log")
		c.Members = append(c.Members, m)
		parts = append(parts, m.Name+"="+m.PeerURL)
	}
	c.initial = strings.Join(parts, ",")
	stopAll := func() {
		for _, m := range c.Members {
			m.stop()
		}
	}
	for i := range c.Members {
		if err := c.start(i, "new"); err != nil {
			stopAll()
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := c.WaitHealthy(ctx)
	for _, m := range c.Members {
		if err == nil && !m.Running() {
			err = fmt.Errorf("member %s exited", m.Name)
		}
	}
	if err != nil {
		for _, m := range c.Members {
			b, _ := os.ReadFile(m.LogFile)
			t.Logf("etcdtest: %s log:\n%s", m.Name, tail(b, 2000))
		}
		stopAll()
		return nil, fmt.Errorf("cluster not healthy: %w", err)
	}
	t.Cleanup(stopAll)
	return c, nil
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func (c *Cluster) start(i int, state string) error {
	m := c.Members[i]
	logf, err := os.OpenFile(m.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("member %s log: %w", m.Name, err)
	}
	p := testkit.StartProc(c.t, testkit.ProcOptions{Out: logf, StopSignal: syscall.SIGKILL}, Binary,
		"--name", m.Name,
		"--data-dir", m.DataDir,
		"--listen-client-urls", m.ClientURL,
		"--advertise-client-urls", m.ClientURL,
		"--listen-peer-urls", m.PeerURL,
		"--initial-advertise-peer-urls", m.PeerURL,
		"--initial-cluster", c.initial,
		"--initial-cluster-state", state,
		"--initial-cluster-token", "etcdtest",
		"--heartbeat-interval", "50",
		"--election-timeout", "500",
	)
	go func() {
		<-p.Done()
		logf.Close()
	}()
	m.mu.Lock()
	m.proc = p
	m.mu.Unlock()
	return nil
}

func (m *Member) stop() {
	m.mu.Lock()
	p := m.proc
	m.mu.Unlock()
	if p != nil {
		p.Kill()
	}
}

// Running reports whether the member's process is alive.
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.proc != nil && m.proc.Running()
}

// Endpoints returns every member's client URL.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, m := range c.Members {
		eps = append(eps, m.ClientURL)
	}
	return eps
}

// Kill kills member i with SIGKILL and waits for it to exit.
func (c *Cluster) Kill(i int) { c.Members[i].stop() }

// Restart starts member i again on its old data directory.
func (c *Cluster) Restart(i int) error { return c.start(i, "existing") }

// WaitHealthy waits until every running member answers a linearizable read.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	for _, m := range c.Members {
		if !m.Running() {
			continue
		}
		cli, err := NewClient([]string{m.ClientURL})
		if err != nil {
			return err
		}
		err = poll(ctx, func() error {
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			_, err := cli.Get(rctx, "health")
			return err
		})
		cli.Close()
		if err != nil {
			return fmt.Errorf("member %s: %w", m.Name, err)
		}
	}
	return nil
}

// Leader returns the index of the current leader as reported by a running
// member.
func (c *Cluster) Leader(ctx context.Context) (int, error) {
	for _, m := range c.Members {
		if !m.Running() {
			continue
		}
		cli, err := NewClient([]string{m.ClientURL})
		if err != nil {
			return -1, err
		}
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := cli.Status(rctx, m.ClientURL)
		cancel()
		cli.Close()
		if err != nil || st.Leader == 0 {
			continue
		}
		for i, o := range c.Members {
			if !o.Running() {
				continue
			}
			oc, err := NewClient([]string{o.ClientURL})
			if err != nil {
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			ost, err := oc.Status(rctx, o.ClientURL)
			cancel()
			oc.Close()
			if err == nil && ost.Header.MemberId == st.Leader {
				return i, nil
			}
		}
	}
	return -1, ErrNoLeader
}

func poll(ctx context.Context, f func() error) error {
	var last error
	for {
		if last = f(); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// NewClient returns a quiet etcd client for the endpoints.
func NewClient(endpoints []string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcdtest: client for %v: %w", endpoints, err)
	}
	return cli, nil
}

// Client returns a client for the cluster closed in t.Cleanup.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := NewClient(c.Endpoints())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
