package agent

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/store"
)

// Invariants 1 and 7 with ha (docs/protocol.md §8): while the session is
// not proven alive (a deposed active), a command the agent accepted is not
// written; once proven again, the takeover's floor taken meanwhile makes
// it stale_fence, and it never reached the device.
func TestNoWriteWhileTheSessionIsNotProven(t *testing.T) {
	r := newRig(t, newFakeDriver(true))
	r.send("pump-1", set("before", 5, 100))
	wantCode(t, r.pub.waitResults(t, "before", 1)[0], wire.CodeOK, 5)

	r.proven = &atomic.Bool{} // not proven from now on
	r.send("pump-1", set("held", 6, 200))
	waitFor(t, "held to reach the worker", func() bool {
		d, err := r.a.Device("pump-1")
		return err == nil && d.Pending == 1
	})
	if n := r.drv.applies("held"); n != 0 {
		t.Fatalf("held was written %d times while the session was not proven", n)
	}
	err := r.st.Update(context.Background(), func(tx *store.Tx) error {
		_, _, err := tx.TakeFloor("pump-1", 100, "test", "takeover", time.Now())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	r.proven.Store(true)
	wantCode(t, r.pub.waitResults(t, "held", 1)[0], wire.CodeStaleFence, 100)
	if n := r.drv.applies("held"); n != 0 {
		t.Fatalf("held was written %d times; it is an older generation than the takeover's floor", n)
	}
}
