package fencemem

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/testkit/etcdtest"
)

// The active's safety margin (docs/protocol.md §8): when etcd goes away,
// Proven turns false no later than session_ttl - safety_margin after the
// last confirmed keepalive (plus one renewal's timeout), so before the
// session could have expired; the agent stands down (OnRole false). When
// etcd is back and the registration free, it is active again with the
// floor for every device taken (reason takeover: the memory cannot know
// what another agent did meanwhile).
func TestHAStandsDownBeforeTheSessionCanExpire(t *testing.T) {
	c := etcdtest.Start(t, 1)
	e := &config.Etcd{Endpoints: c.Endpoints(), Prefix: "edge", DialTimeout: config.Duration(500 * time.Millisecond), SessionTTL: config.Duration(3 * time.Second)}
	const margin = time.Second
	s := openStore(t, filepath.Join(t.TempDir(), "agent.db"))
	m := New(Options{Etcd: e, Gateway: "gw-1", Devices: []string{"pump-1"}, Store: s, Retry: 100 * time.Millisecond,
		HA: true, SafetyMargin: margin})
	var roles atomic.Int32 // +1 per stand-down, +100 per activation
	m.OnRole(func(active bool) {
		if active {
			roles.Add(100)
		} else {
			roles.Add(1)
		}
	})
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if r, _ := m.Role(); r != RoleActive || !m.Proven() {
		t.Fatalf("after Start: role %s, proven %v", r, m.Proven())
	}
	c.Kill(0)
	killed := time.Now()
	for m.Proven() {
		if time.Since(killed) > 3*time.Second {
			t.Fatal("still proven a session_ttl after etcd went away")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The last confirmed keepalive was sent at most one renewal interval
	// before the kill; the gate closes at that send + ttl - margin.
	if d := time.Since(killed); d > e.SessionTTL.D()-margin+50*time.Millisecond {
		t.Fatalf("proven for %s after etcd went away, want at most session_ttl - safety_margin", d)
	}
	deadline := time.Now().Add(5 * time.Second)
	for roles.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("role changes %d, want one stand-down", roles.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r, _ := m.Role(); r != RoleStandby {
		t.Fatalf("role after standing down: %s", r)
	}
	if err := c.Restart(0); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(20 * time.Second)
	for roles.Load() != 101 || !m.Proven() {
		if time.Now().After(deadline) {
			t.Fatalf("not active again once etcd is back: role changes %d", roles.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	fl := floors(t, s, "pump-1")
	if len(fl) < 2 || fl[0].Reason == "" || !strings.Contains(fl[0].Reason, ReasonTakeover) {
		t.Fatalf("floors once active again: %+v", fl)
	}
}

// A pause (SIGSTOP, a frozen VM) longer than session_ttl - safety_margin
// but shorter than the lease: once the proof has lapsed, Proven was false
// (the worker sent nothing, the app refused deliveries unacknowledged),
// so the agent stands down (docs/protocol.md §8: "it then stops serving
// and returns to standby"), even though its next keepalive succeeds. Were
// the proof simply renewed, the refused deliveries would stay unanswered
// on a connection that never closes, and hold every later PUBACK behind
// them (e2e TestHARefusedDeliveryIsTakenOnceProvenAgain). The pause is
// the send time of the last confirmed keepalive moved back past the
// proof, as a frozen process finds it when it wakes.
func TestHAStandsDownAfterAPauseEvenIfTheLeaseSurvived(t *testing.T) {
	c := etcdtest.Start(t, 1)
	e := &config.Etcd{Endpoints: c.Endpoints(), Prefix: "edge", DialTimeout: config.Duration(500 * time.Millisecond), SessionTTL: config.Duration(6 * time.Second)}
	const margin = 3 * time.Second
	s := openStore(t, filepath.Join(t.TempDir(), "agent.db"))
	m := New(Options{Etcd: e, Gateway: "gw-1", Devices: []string{"pump-1"}, Store: s, Retry: 100 * time.Millisecond,
		HA: true, SafetyMargin: margin})
	var downs atomic.Int32
	m.OnRole(func(active bool) {
		if !active {
			downs.Add(1)
		}
	})
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.mu.Lock()
	m.lastSent = time.Now().Add(-(e.SessionTTL.D() - margin) - 100*time.Millisecond)
	m.mu.Unlock()
	if m.Proven() {
		t.Fatal("proven after the pause")
	}
	// Within two renewals the next keepalive has been answered.
	deadline := time.Now().Add(2*m.renewInterval() + time.Second)
	for downs.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no stand-down after the proof lapsed (proven again: %v)", m.Proven())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
