package controller

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Registry remembers locks whose release or revoke was not confirmed: their
// lease may still be alive in etcd until the TTL has run out, so no holder
// that shares the registry may treat them as free before then (its Acquire
// waits). Holders share DefaultRegistry unless LockOptions.Registry says
// otherwise: one per process is right when every holder of a lock in the
// process may collide; a test or a program that runs independent
// controllers in one process gives each its own.
type Registry struct {
	mu    sync.Mutex
	until map[string]time.Time
}

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry { return &Registry{until: map[string]time.Time{}} }

// DefaultRegistry is the process-wide Registry.
var DefaultRegistry = NewRegistry()

// hold marks names as possibly held until t.
func (r *Registry) hold(names []string, t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range names {
		if t.After(r.until[n]) {
			r.until[n] = t
		}
	}
}

// wait blocks until none of names is marked held, or ctx ends.
func (r *Registry) wait(ctx context.Context, names []string) error {
	for {
		var latest time.Time
		r.mu.Lock()
		now := time.Now()
		for _, n := range names {
			t, ok := r.until[n]
			if !ok {
				continue
			}
			if !now.Before(t) {
				delete(r.until, n)
				continue
			}
			if t.After(latest) {
				latest = t
			}
		}
		r.mu.Unlock()
		if latest.IsZero() {
			return nil
		}
		tm := time.NewTimer(time.Until(latest))
		select {
		case <-ctx.Done():
			tm.Stop()
			return fmt.Errorf("lock still counts as held until %s: %w", latest.Format(time.RFC3339Nano), ctx.Err())
		case <-tm.C:
		}
	}
}
