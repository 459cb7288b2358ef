package agent

import (
	"context"
	"strings"
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

// A deposed active talks to no device (§8), questions included: a write
// whose outcome became unknown as the session stopped being proven is not
// asked about until it is proven again; then it is, and ends applied.
func TestNoQuestionWhileTheSessionIsNotProven(t *testing.T) {
	drv := newFakeDriver(true)
	drv.hang["h"] = true // takes effect, then times out: unknown
	r := newRig(t, drv)
	proven := &atomic.Bool{}
	proven.Store(true)
	r.proven = proven // before the send: the worker reads it after
	r.send("pump-1", set("h", 5, 100))
	select {
	case <-drv.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the write never reached the driver")
	}
	proven.Store(false)
	if rs := r.pub.waitResults(t, "h", 1); rs[0].Status != wire.StatusUnknown {
		t.Fatalf("first Result %+v, want unknown", rs[0])
	}
	// Asked at once without the gate (the first question has no pause):
	// a second with no question shows the gate.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		for _, e := range drv.events() {
			if strings.HasPrefix(e, "query ") {
				t.Fatalf("the device was asked while the session was not proven: %v", drv.events())
			}
		}
	}
	proven.Store(true)
	rs := r.pub.waitResults(t, "h", 2)
	wantCode(t, rs[1], wire.CodeOK, 5)
	if count1(drv.events(), "query h ok") == 0 {
		t.Fatalf("resolved without asking: %v", drv.events())
	}
}
