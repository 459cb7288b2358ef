package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edge-agent/edge-agent/internal/store"
	"github.com/edge-agent/edge-agent/internal/testkit/etcdtest"
)

// Invariants 1 and 7 offline: `fence floor --from-etcd` makes every
// generation issued so far stale, the current holder's included, even
// when its lock key was etcd's last write (a quiet cluster: lease
// keep-alives do not move the revision). Equal fences pass, so a floor
// equal to the holder's fence would let it on.
func TestFenceFloorFromEtcdFencesTheCurrentHolder(t *testing.T) {
	c := etcdtest.Start(t, 1)
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "agent.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	st.Start()
	if err := st.Update(t.Context(), func(tx *store.Tx) error { return tx.PutDevice("pump-7", store.Device{LastFence: 1}) }); err != nil {
		t.Fatal(err)
	}
	st.Close()
	lock, err := c.Client(t).Put(context.Background(), "locks/pump-7/holder", "")
	if err != nil {
		t.Fatal(err)
	}
	holder := lock.Header.Revision // the holder's fence: the lock key's revision, etcd's last write
	code, out := runBin(t, "fence", "floor", "--data-dir", dir, "--device", "pump-7", "--from-etcd",
		"--etcd", strings.Join(c.Endpoints(), ","), "--reason", "restored without coordination")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	st, err = store.Open(filepath.Join(dir, "agent.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var d store.Device
	st.View(func(tx *store.Tx) error { d, _, err = tx.Device("pump-7"); return err })
	if d.LastFence <= holder {
		t.Fatalf("last_fence %d after the floor: the holder's fence %d is not stale\n%s", d.LastFence, holder, out)
	}
}
