package controller

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/etcdtest"
)

func TestTwoContendersOneActive(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t)
	ctx := context.Background()
	opts := func(l *stateLog) *LockOptions {
		return &LockOptions{TTL: 2 * time.Second, AcquireTimeout: 1500 * time.Millisecond, OnState: l.on}
	}
	var la, lb stateLog
	a := NewHolder(cli, []string{"locks/two"}, opts(&la))
	b := NewHolder(cli, []string{"locks/two"}, opts(&lb))
	type res struct {
		h   *Holder
		err error
		dur time.Duration
	}
	out := make(chan res, 2)
	for _, h := range []*Holder{a, b} {
		go func() {
			start := time.Now()
			err := h.Acquire(ctx)
			out <- res{h, err, time.Since(start)}
		}()
	}
	first := <-out
	if first.err != nil {
		t.Fatalf("first acquire: %v", first.err)
	}
	other := a
	if first.h == a {
		other = b
	}
	// While the winner holds, the other is ACQUIRING, not ACTIVE.
	if s := other.State(); s != StateAcquiring {
		t.Fatalf("other holder is %s while the first is ACTIVE", s)
	}
	if s := first.h.State(); s != StateActive {
		t.Fatalf("winner is %s", s)
	}
	second := <-out
	if !errors.Is(second.err, ErrAcquireTimeout) {
		t.Fatalf("second acquire: got %v, want ErrAcquireTimeout", second.err)
	}
	if second.dur < 1400*time.Millisecond || second.dur > 2500*time.Millisecond {
		t.Fatalf("second acquire ended after %v, want about its 1.5s bound", second.dur)
	}
	if s := other.State(); s != StateReleased {
		t.Fatalf("loser state %s, want RELEASED", s)
	}
	if got := keysUnder(t, cli, "locks/two"); len(got) != 1 || got[0].Rev != first.h.Fence() {
		t.Fatalf("keys under lock: %+v, want only the winner's (fence %d)", got, first.h.Fence())
	}
	if err := first.h.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	if got := keysUnder(t, cli, "locks/two"); len(got) != 0 {
		t.Fatalf("keys after release: %+v", got)
	}
	wantW := []State{StateAcquiring, StateActive, StateReleasing, StateReleased}
	wl := &la
	if first.h == b {
		wl = &lb
	}
	if got := wl.states(); !slices.Equal(got, wantW) {
		t.Fatalf("winner transitions %v, want %v", got, wantW)
	}
	// A used holder never acquires again.
	if err := first.h.Acquire(ctx); !errors.Is(err, ErrUsed) {
		t.Fatalf("re-acquire: %v, want ErrUsed", err)
	}
}
