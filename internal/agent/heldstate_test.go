package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// heldStates is every DeviceState published for dev with its place among
// all the messages, and the place of op's Results.
func (p *recPublisher) heldStates(t *testing.T, dev, op string) (states []wire.DeviceState, at []int, results []int) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, m := range p.msgs {
		switch {
		case strings.HasSuffix(m.topic, "/devices/"+dev+"/state"):
			var s wire.DeviceState
			if err := json.Unmarshal(m.payload, &s); err != nil {
				t.Fatalf("state %s: %v", m.payload, err)
			}
			states, at = append(states, s), append(at, i)
		case strings.HasSuffix(m.topic, "/result"):
			var r wire.Result
			if json.Unmarshal(m.payload, &r) == nil && r.OpID == op {
				results = append(results, i)
			}
		}
	}
	return states, at, results
}

// The DeviceState's held_writes (docs/protocol.md §1) follows the device's
// writes held unknown: 1 once the write is unknown (published after its
// unknown Result), 1 again at the next start while it is still held, 0
// (omitted) once an operator resolved it (after its final Result). The
// held write is never resent meanwhile (invariant 6).
func TestDeviceStateCountsHeldWrites(t *testing.T) {
	drv := newFakeDriver(false) // cannot be asked: held for an operator
	drv.hang["h"] = true
	r := newRig(t, drv)
	r.send("pump-1", set("h", 2, 100))
	if un := r.pub.waitResults(t, "h", 1)[0]; un.Status != wire.StatusUnknown {
		t.Fatalf("h: %+v, want unknown", un)
	}
	held := func(want int) (int, []int) {
		t.Helper()
		var pos int
		var res []int
		waitFor(t, fmt.Sprintf("a DeviceState of pump-1 with held_writes %d", want), func() bool {
			states, at, rs := r.pub.heldStates(t, "pump-1", "h")
			if len(states) == 0 || states[len(states)-1].HeldWrites != want {
				return false
			}
			pos, res = at[len(at)-1], rs
			return true
		})
		return pos, res
	}
	pos, res := held(1)
	if len(res) != 1 || res[0] > pos {
		t.Fatalf("the held state (message %d) before h's unknown Result (%v)", pos, res)
	}
	if s := r.a.Summary(); s.HeldUnknown != 1 {
		t.Fatalf("summary: %d held", s.HeldUnknown)
	}

	// A restart while it is held: the first state says so again.
	r.stop(5 * time.Second)
	r.pub = &recPublisher{}
	r.start(r.path)
	held(1)

	drv.hang["h"] = false
	waitFor(t, "resolve_settle to pass", func() bool {
		_, err := r.a.Resolve(context.Background(), "pump-1", "h", true, json.RawMessage(`{"rpm":100}`))
		return err == nil
	})
	pos, res = held(0)
	if len(res) == 0 || res[len(res)-1] > pos {
		t.Fatalf("the state without held writes (message %d) before h's final Result (%v)", pos, res)
	}
	states, _, _ := r.pub.heldStates(t, "pump-1", "h")
	if last := states[len(states)-1]; last.LastOpID != "h" || string(last.State) != `{"rpm":100}` {
		t.Fatalf("the state after the resolution: %+v", last)
	}
	if n := drv.applies("h"); n != 1 {
		t.Fatalf("h reached the device %d times, want 1 (never resent)", n)
	}
}
