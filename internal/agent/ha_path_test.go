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
	// Queued (its admission committed, so before the floor below) and
	// in the worker. Pending alone is not enough: it can still be 1 from
	// "before", whose Result is published before its worker lets go, and
	// a floor taken before held's admission makes held stale_fence.
	waitFor(t, "held to be queued and reach the worker", func() bool {
		var queued bool
		err := r.st.View(func(tx *store.Tx) error {
			o, ok, err := tx.Op("pump-1", "held")
			queued = ok && o.Status != store.OpFinal
			return err
		})
		d, derr := r.a.Device("pump-1")
		return err == nil && derr == nil && queued && d.Pending == 1 && d.QueueDepth == 1
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
	// Queued before the takeover's floor: the other agent may have run
	// it, so not final here (invariant 8); its resend is stale.
	wantCode(t, r.pub.waitResults(t, "held", 1)[0], wire.CodeFenceUnconfirmed, 100)
	r.send("pump-1", set("held", 6, 200))
	wantCode(t, r.pub.waitResults(t, "held", 2)[1], wire.CodeStaleFence, 100)
	if n := r.drv.applies("held"); n != 0 {
		t.Fatalf("held was written %d times; it is an older generation than the takeover's floor", n)
	}
}
