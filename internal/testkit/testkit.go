// Package testkit is the project's one test kit: a polling wait
// (Eventually), free loopback ports, a TCP proxy that can cut, refuse and
// freeze connections (Proxy), a process starter that stops only what it
// started, by PID (StartProc), and a builder of the project's binaries,
// once per test binary (Build). The ports, processes and proxy are
// internal/rig's (which the chaos campaign and the benchmarks use too),
// tied here to a test's failure and cleanup. The brokers and etcd servers
// tests need are in its subpackages mqtttest and etcdtest.
package testkit

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/rig"
)

// Eventually polls cond every 5ms until it holds, and fails the test with
// what when within passes first. Use it instead of sleeping: it waits no
// longer than the condition needs.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// FreePort returns a loopback TCP port that is free now (rig.FreePort:
// below the kernel's ephemeral range when it can).
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := rig.FreePort()
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	return port
}

// FreeAddr is 127.0.0.1 with a FreePort.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(FreePort(t))
}

// SyncBuffer is a buffer that goroutines may write and read at once (a
// process's output collected while a test reads it).
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Tail is the last n bytes of s.
func Tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

var builds struct {
	mu   sync.Mutex
	dir  string
	done map[string]*build
}

type build struct {
	once sync.Once
	path string
	err  error
}

// Build builds the main package pkg (a path relative to the test's
// package, such as "../cmd/edge-agent", or an import path) with the build
// tags, once per test binary, and returns the binary's path. The binaries
// live in one temporary directory that Main removes.
func Build(t testing.TB, pkg string, tags ...string) string {
	t.Helper()
	key := pkg + " " + strings.Join(tags, ",")
	builds.mu.Lock()
	if builds.done == nil {
		builds.done = map[string]*build{}
	}
	if builds.dir == "" {
		d, err := os.MkdirTemp("", "edge-agent-testbin")
		if err != nil {
			builds.mu.Unlock()
			t.Fatalf("testkit: %v", err)
		}
		builds.dir = d
	}
	b := builds.done[key]
	if b == nil {
		b = &build{}
		builds.done[key] = b
	}
	dir := builds.dir
	n := len(builds.done)
	builds.mu.Unlock()
	b.once.Do(func() {
		b.path = filepath.Join(dir, fmt.Sprintf("%d-%s", n, filepath.Base(pkg)))
		args := []string{"build", "-o", b.path}
		if len(tags) > 0 {
			args = append(args, "-tags", strings.Join(tags, ","))
		}
		out, err := exec.Command("go", append(args, pkg)...).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("testkit: go build %s: %v\n%s", key, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// Main runs a package's tests (call it from TestMain), then the cleanups,
// then removes the binaries Build made, and exits with the tests' status.
func Main(m *testing.M, cleanups ...func()) {
	code := m.Run()
	for _, c := range cleanups {
		c()
	}
	builds.mu.Lock()
	if builds.dir != "" {
		os.RemoveAll(builds.dir)
	}
	builds.mu.Unlock()
	os.Exit(code)
}
