package agent

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/store"
	"github.com/edge-agent/edge-agent/internal/testkit/etcdtest"
)

// effects counts the writes of op that took effect on the device (one per
// key the device applied).
func (d *fakeDriver) effects(op string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, o := range d.applied {
		if o == op {
			n++
		}
	}
	return n
}

// Invariants 2 and 7 at recovery: a copy of a stopped store put back holds
// a write pending that the agent, running on, since resent and applied. On
// the copy, with etcd away (the floor cannot be taken), recovery asks the
// device about the copy's key: not applied (it was lost on the way, and is
// now tombstoned). The write must not be sent again under a new key while
// the device's fences are unconfirmed: once etcd is back, the floor makes
// it stale_fence, and the op has taken effect once.
func TestRecoveredWriteIsNotResentUntilTheFloor(t *testing.T) {
	c := etcdtest.Start(t, 1)
	coord := &config.Etcd{Endpoints: c.Endpoints(), Prefix: "edge",
		DialTimeout: config.Duration(500 * time.Millisecond), SessionTTL: config.Duration(2 * time.Second)}
	drv := newFakeDriver(true)
	drv.bound = time.Minute // the lost write waits until the hard stop
	drv.lose["p"] = true
	r := newCoordRig(t, drv, coord)
	lock, err := c.Client(t).Put(context.Background(), "locks/pump-1", "holder-1")
	if err != nil {
		t.Fatal(err)
	}
	fence := lock.Header.Revision // the holder's fence, above the new store's floor
	r.send("pump-1", set("p", fence, 100))
	select {
	case <-drv.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("p never reached the device")
	}
	// The copy: p pending under its first key, which never took effect.
	copied := filepath.Join(t.TempDir(), "agent.db")
	if _, err := r.st.CompactTo(copied, 0o600); err != nil {
		t.Fatal(err)
	}
	r.stop(0) // p is unknown

	// The agent runs on: the device says the first key was not applied,
	// p is sent again under a new key, applied, ok.
	r.start(r.path)
	var rs []wire.Result
	waitFor(t, "p's final result", func() bool {
		rs = r.pub.results(t, "p")
		return len(rs) > 0 && rs[len(rs)-1].Final()
	})
	wantCode(t, rs[len(rs)-1], wire.CodeOK, fence)
	if n := drv.effects("p"); n != 1 {
		t.Fatalf("p took effect %d times, want 1", n)
	}
	r.stop(time.Second)

	// The copy is put back and started while etcd is away.
	c.Kill(0)
	r.pub = &recPublisher{}
	r.start(copied)
	waitFor(t, "the copy's recovery to ask about p", func() bool {
		return count1(drv.events(), "query  ok") >= 1 // the copy's key is not one the device applied
	})
	if err := c.Restart(0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "p's final result on the copy", func() bool {
		rs = r.pub.results(t, "p")
		return len(rs) > 0 && rs[len(rs)-1].Final()
	})
	if n := drv.effects("p"); n != 1 {
		t.Fatalf("p took effect %d times, want 1 (sent again on a copied store before its fence floor): %v", n, drv.events())
	}
	// The copy cannot know the original ended p ok: not final here
	// (invariant 8), and its resend is judged against the floor.
	if last := rs[len(rs)-1]; last.Code != wire.CodeFenceUnconfirmed || last.LastFence <= fence {
		t.Fatalf("p on the copy: %s last_fence %d (%s), want fence_unconfirmed above %d", last.Code, last.LastFence, last.Reason, fence)
	}
	n := len(rs)
	r.send("pump-1", set("p", fence, 100))
	rs = r.pub.waitResults(t, "p", n+1)
	if last := rs[len(rs)-1]; last.Code != wire.CodeStaleFence || last.LastFence <= fence {
		t.Fatalf("p resent to the copy: %s last_fence %d (%s), want stale_fence above %d", last.Code, last.LastFence, last.Reason, fence)
	}
	if n := drv.effects("p"); n != 1 {
		t.Fatalf("p took effect %d times after its resend, want 1", n)
	}
}

// blockedWriter takes nothing until open is closed, as an HTTP client that
// stops reading; writing is closed at its first Write.
type blockedWriter struct {
	writing chan struct{}
	once    *sync.Once
	open    <-chan struct{}
}

func (w blockedWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.writing) })
	<-w.open
	return len(p), nil
}

// An online backup sent to a client that stops reading (GET /v1/backup)
// does not hold the store: a commit that grows the file (bbolt remaps it
// only once no read transaction is open) completes while the client
// reads nothing, and so do the commands behind it (invariants 4 and 5:
// the command path never waits on an admin client).
func TestOnlineBackupToAStalledClient(t *testing.T) {
	r := newRig(t, newFakeDriver(true))
	open := make(chan struct{})
	w := blockedWriter{writing: make(chan struct{}), once: &sync.Once{}, open: open}
	backup := make(chan error, 1)
	go func() { backup <- r.a.Backup(context.Background(), w) }()
	defer func() {
		close(open)
		if err := <-backup; err != nil {
			t.Errorf("backup: %v", err)
		}
	}()
	select {
	case <-w.writing:
	case <-time.After(10 * time.Second):
		t.Fatal("the backup never wrote")
	}
	grew := r.st.Submit(context.Background(), func(tx *store.Tx) error {
		return tx.PutDevice("pad", store.Device{State: []byte(`{"pad":"` + strings.Repeat("x", 4<<20) + `"}`)})
	})
	select {
	case err := <-grew:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a commit that grows the store waits for a backup's client to read")
	}
	r.send("pump-1", set("after", 1, 100))
	wantCode(t, r.pub.waitResults(t, "after", 1)[0], wire.CodeOK, 1)
}
