package store

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// Alive answers nil while commits go through, a deadline error while a
// commit hangs (the abandoned probe is committed once the commit loop
// moves again), and ErrFailed after a failed commit.
func TestAliveFollowsTheCommitLoop(t *testing.T) {
	release := make(chan struct{})
	var stall, fail atomic.Bool
	entered := make(chan struct{}, 16)
	failCommits(t, func() error {
		if stall.Load() {
			entered <- struct{}{}
			<-release
		}
		if fail.Load() {
			return errors.New("injected")
		}
		return nil
	})
	s := openTest(t, nil)
	ctx := context.Background()
	if err := s.Alive(ctx); err != nil {
		t.Fatalf("healthy store: %v", err)
	}
	before := s.Commits()

	stall.Store(true)
	// A real update gets stuck inside its commit (the loop is busy).
	stuck := s.Submit(ctx, func(*Tx) error { return nil })
	<-entered
	pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err := s.Alive(pctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stuck commit loop: Alive = %v, want a deadline error", err)
	}
	if got := s.Commits(); got != before {
		t.Fatalf("commits moved from %d to %d while the loop was stuck", before, got)
	}
	stall.Store(false)
	close(release)
	if err := <-stuck; err != nil {
		t.Fatal(err)
	}
	if err := s.Alive(ctx); err != nil {
		t.Fatalf("after the stall: %v", err)
	}
	// The stuck update, the abandoned probe (in its own batch or with the
	// next one) and the last probe were committed.
	if got := s.Commits(); got < before+2 {
		t.Fatalf("commits %d -> %d, want at least 2 more", before, got)
	}

	fail.Store(true)
	if err := s.Alive(ctx); !errors.Is(err, ErrFailed) {
		t.Fatalf("failing commit: %v, want ErrFailed", err)
	}
	if err := s.Alive(ctx); !errors.Is(err, ErrFailed) {
		t.Fatalf("after a failed commit: %v, want ErrFailed", err)
	}
}
