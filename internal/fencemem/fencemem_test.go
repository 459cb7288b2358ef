package fencemem

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/store"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/etcdtest"
)

func etcdConf(eps []string) *config.Etcd {
	return &config.Etcd{Endpoints: eps, Prefix: "edge", DialTimeout: config.Duration(2 * time.Second), SessionTTL: config.Duration(2 * time.Second)}
}

func openStore(t *testing.T, path string) *store.Store {
	t.Helper()
	s, err := store.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	return s
}

// run starts a Memory on the store at path, checks it, and stops it.
func run(t *testing.T, e *config.Etcd, gw, path string, devs ...string) (*Memory, *store.Store, error) {
	t.Helper()
	s := openStore(t, path)
	m := New(Options{Etcd: e, Gateway: gw, Devices: devs, Store: s, Retry: 100 * time.Millisecond})
	err := m.Start(context.Background())
	return m, s, err
}

// floors returns dev's floor audit entries, newest first.
func floors(t *testing.T, s *store.Store, dev string) []store.Op {
	t.Helper()
	var out []store.Op
	s.View(func(tx *store.Tx) error {
		h, _, err := tx.History(dev, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range h {
			if o.Action == store.ActionFenceFloor {
				out = append(out, o)
			}
		}
		return nil
	})
	return out
}

func lastFence(s *store.Store, dev string) int64 {
	var d store.Device
	s.View(func(tx *store.Tx) error { d, _, _ = tx.Device(dev); return nil })
	return d.LastFence
}

// A new store takes the floor; a restart on the same store does not; a
// copy of the stopped store put back after the agent ran on does, and so
// does a store restored from a backup.
func TestFloorOnlyWhenMemoryMayBeIncomplete(t *testing.T) {
	c := etcdtest.Start(t, 1)
	e := etcdConf(c.Endpoints())
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.db")
	m, s, err := run(t, e, "gw-1", path, "pump-7")
	if err != nil {
		t.Fatal(err)
	}
	if !m.Confirmed("pump-7") || m.Status().State != "connected" {
		t.Fatalf("after the floor: %v %+v", m.Confirmed("pump-7"), m.Status())
	}
	f := floors(t, s, "pump-7")
	if len(f) != 1 || !strings.Contains(f[0].Reason, ReasonNewStore) || lastFence(s, "pump-7") != f[0].Fence || f[0].Fence < 1 {
		t.Fatalf("new store: floors %+v, last_fence %d", f, lastFence(s, "pump-7"))
	}
	m.Close()
	s.Close()
	copyFile(t, path, filepath.Join(dir, "copy.db"))

	m, s, err = run(t, e, "gw-1", path, "pump-7")
	if err != nil {
		t.Fatal(err)
	}
	if f := floors(t, s, "pump-7"); len(f) != 1 {
		t.Fatalf("a restart on the same store took a floor: %+v", f)
	}
	m.Close()
	s.Close()

	copyFile(t, filepath.Join(dir, "copy.db"), path)
	m, s, err = run(t, e, "gw-1", path, "pump-7")
	if err != nil {
		t.Fatal(err)
	}
	if f := floors(t, s, "pump-7"); len(f) != 2 || !strings.Contains(f[0].Reason, ReasonRestored) || !strings.Contains(f[0].Reason, "epoch") {
		t.Fatalf("a restored older copy: floors %+v", f)
	}
	var bak strings.Builder
	if _, err := s.Backup(context.Background(), &bak, "test backup"); err != nil {
		t.Fatal(err)
	}
	m.Close()
	s.Close()
	if err := os.WriteFile(path, []byte(bak.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	m, s, err = run(t, e, "gw-1", path, "pump-7")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { m.Close(); s.Close() }()
	if f := floors(t, s, "pump-7"); len(f) != 3 || !strings.Contains(f[0].Reason, "test backup") {
		t.Fatalf("a restored backup: floors %+v", f)
	}
}

// A second live agent as the same gateway is refused within session_ttl +
// 5 s, naming the other's host and pid; a device fronted by another live
// gateway is refused naming both.
func TestCloneAndClaimRefused(t *testing.T) {
	c := etcdtest.Start(t, 1)
	e := etcdConf(c.Endpoints())
	m1, s1, err := run(t, e, "gw-1", filepath.Join(t.TempDir(), "agent.db"), "pump-7")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { m1.Close(); s1.Close() }()
	start := time.Now()
	m2, s2, err := run(t, e, "gw-1", filepath.Join(t.TempDir(), "agent.db"), "pump-7")
	took := time.Since(start)
	defer func() { m2.Close(); s2.Close() }()
	if !errors.Is(err, ErrClone) || !strings.Contains(err.Error(), "gw-1") || !strings.Contains(err.Error(), "pid") {
		t.Fatalf("clone: %v", err)
	}
	if took > e.SessionTTL.D()+5*time.Second {
		t.Fatalf("clone refused after %s", took)
	}
	m3, s3, err := run(t, e, "gw-2", filepath.Join(t.TempDir(), "agent.db"), "pump-7")
	defer func() { m3.Close(); s3.Close() }()
	if !errors.Is(err, ErrClaimed) || !strings.Contains(err.Error(), "pump-7") || !strings.Contains(err.Error(), "gw-1") || !strings.Contains(err.Error(), "gw-2") {
		t.Fatalf("claim: %v", err)
	}
	if !m1.Confirmed("pump-7") || m1.Status().State != "connected" {
		t.Fatalf("the first agent was disturbed: %+v", m1.Status())
	}
}

// Without etcd at start, every device is unconfirmed; nothing is floored
// until etcd can be reached.
func TestUnreachableLeavesDevicesUnconfirmed(t *testing.T) {
	e := etcdConf([]string{"http://" + testkit.FreeAddr(t)})
	e.DialTimeout = config.Duration(500 * time.Millisecond)
	m, s, err := run(t, e, "gw-1", filepath.Join(t.TempDir(), "agent.db"), "pump-7")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { m.Close(); s.Close() }()
	st := m.Status()
	if m.Confirmed("pump-7") || st.State != "unreachable" || len(st.Unconfirmed) != 1 || !strings.Contains(st.Reason, "connection refused") {
		t.Fatalf("status %+v", st)
	}
	s.View(func(tx *store.Tx) error {
		if d := tx.Doubts(); d["pump-7"] != ReasonNewStore {
			t.Errorf("doubts %v", d)
		}
		return nil
	})
}

// Without coordination: every device confirmed, no floor, state off.
func TestOff(t *testing.T) {
	m, s, err := run(t, nil, "gw-1", filepath.Join(t.TempDir(), "agent.db"), "pump-7")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { m.Close(); s.Close() }()
	if !m.Confirmed("pump-7") || m.Status().State != "off" || len(floors(t, s, "pump-7")) != 0 {
		t.Fatalf("off: %+v", m.Status())
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A check-in that fails after the gateway is registered (here: etcd
// refuses the agent's user the store record until an operator grants it)
// leaves no registration behind: the next try registers again and checks
// in, never taking its own earlier registration for a clone's.
func TestCheckInRetriedAfterRegistering(t *testing.T) {
	c := etcdtest.Start(t, 1)
	ctx := context.Background()
	root := c.Client(t)
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(root.RoleAdd(ctx, "agent"))
	for _, p := range []string{"edge/gateways/", "edge/devices/"} {
		must(root.RoleGrantPermission(ctx, "agent", p, clientv3.GetPrefixRangeEnd(p), clientv3.PermissionType(clientv3.PermReadWrite)))
	}
	must(root.UserAdd(ctx, "agent", "agent-pw"))
	must(root.UserGrantRole(ctx, "agent", "agent"))
	must(root.UserAdd(ctx, "root", "root-pw"))
	must(root.UserGrantRole(ctx, "root", "root"))
	must(root.AuthEnable(ctx))
	admin, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), Username: "root", Password: "root-pw", DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()

	e := etcdConf(c.Endpoints())
	e.Username, e.Password = "agent", "agent-pw"
	m, s, err := run(t, e, "gw-1", filepath.Join(t.TempDir(), "agent.db"), "pump-7")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { m.Close(); s.Close() }()
	if m.Confirmed("pump-7") || !strings.Contains(m.Status().Reason, "permission denied") {
		t.Fatalf("before the grant: confirmed %v, %+v", m.Confirmed("pump-7"), m.Status())
	}
	must(admin.RoleGrantPermission(ctx, "agent", "edge/stores/", clientv3.GetPrefixRangeEnd("edge/stores/"), clientv3.PermissionType(clientv3.PermReadWrite)))
	deadline := time.Now().Add(e.SessionTTL.D() + 10*time.Second)
	for !m.Confirmed("pump-7") {
		select {
		case <-m.Failed():
			t.Fatalf("the retried check-in failed: %v", m.Err())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("never checked in: %+v", m.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := m.Status(); st.State != "connected" {
		t.Fatalf("status %+v", st)
	}
}

// Invariants 1 and 7 under a partition: an agent cut off from etcd stops
// confirming its devices before its lease can expire (lapse: its own
// keep-alives unanswered for session_ttl - margin), so once its
// registration has expired a clone of the running gateway (a VM snapshot:
// same store id, same epoch as etcd's, so no doubt and no floor) can
// register and be confirmed without two agents ever both being confirmed
// for a device. When the partition heals, the cut-off agent finds the
// clone's registration and fails (the process exits 1).
func TestPartitionedAgentIsNotConfirmedAlongsideAClone(t *testing.T) {
	c := etcdtest.Start(t, 1)
	px := testkit.NewProxy(t, c.Endpoints()[0])
	path := filepath.Join(t.TempDir(), "agent.db")
	m1, s1, err := run(t, etcdConf([]string{"http://" + px.Addr()}), "gw-1", path, "pump-7")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { m1.Close(); s1.Close() }()
	if !m1.Confirmed("pump-7") {
		t.Fatalf("first agent: %+v", m1.Status())
	}
	clone := filepath.Join(t.TempDir(), "agent.db")
	if _, err := s1.CompactTo(clone, 0o600); err != nil {
		t.Fatal(err)
	}
	px.Pause() // the first agent is cut off from etcd; the broker and its devices still reach it
	defer px.Resume()
	m2, s2, err := run(t, etcdConf(c.Endpoints()), "gw-1", clone, "pump-7")
	if err != nil {
		t.Fatalf("the clone: %v", err)
	}
	defer func() { m2.Close(); s2.Close() }()
	if !m2.Confirmed("pump-7") || m1.Confirmed("pump-7") {
		t.Fatalf("the clone confirmed %v, the partitioned agent %v (want only the clone: %+v)", m2.Confirmed("pump-7"), m1.Confirmed("pump-7"), m1.Status())
	}
	if m1.Proven() {
		t.Fatal("the partitioned agent may still send to its devices")
	}
	px.Resume()
	select {
	case <-m1.Failed():
		if !errors.Is(m1.Err(), ErrClone) {
			t.Fatalf("the partitioned agent failed with %v, want ErrClone", m1.Err())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the partitioned agent did not stop once etcd was back: %+v", m1.Status())
	}
	if m1.Confirmed("pump-7") {
		t.Fatal("the failed agent confirms pump-7")
	}
}

// Without ha, etcd going away for longer than session_ttl - margin
// unconfirms every device (fence_unconfirmed, nothing sent) before the
// lease can expire; when etcd is back and nobody else registered as the
// gateway, it checks in again and its devices are confirmed, with no
// floor (nothing could have served as it meanwhile).
func TestLapseAndCheckInAgain(t *testing.T) {
	c := etcdtest.Start(t, 1)
	e := etcdConf(c.Endpoints())
	e.DialTimeout = config.Duration(500 * time.Millisecond)
	m, s, err := run(t, e, "gw-1", filepath.Join(t.TempDir(), "agent.db"), "pump-7")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { m.Close(); s.Close() }()
	before := len(floors(t, s, "pump-7"))
	if !m.Confirmed("pump-7") || !m.Proven() {
		t.Fatalf("after Start: %+v", m.Status())
	}
	c.Kill(0)
	killed := time.Now()
	testkit.Eventually(t, 5*time.Second, "pump-7 unconfirmed once etcd is away", func() bool { return !m.Confirmed("pump-7") })
	if d, ttl := time.Since(killed), e.SessionTTL.D(); d >= ttl {
		t.Fatalf("confirmed for %s after etcd went away: at or past session_ttl %s, when the lease may have expired", d, ttl)
	}
	if m.Proven() || m.Status().State != "unreachable" {
		t.Fatalf("after the lapse: proven %v, %+v", m.Proven(), m.Status())
	}
	if err := c.Restart(0); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "pump-7 confirmed again once etcd is back", func() bool { return m.Confirmed("pump-7") && m.Proven() })
	if n := len(floors(t, s, "pump-7")); n != before {
		t.Fatalf("floors %d -> %d: a check-in again of the same store, with nobody else registered meanwhile, takes none", before, n)
	}
	if st := m.Status(); st.State != "connected" {
		t.Fatalf("status %+v", st)
	}
}
