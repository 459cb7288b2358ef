package controller

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// local remembers, for this process, locks whose release or revoke was not
// confirmed: their lease may still be alive in etcd until the TTL has run
// out, so nothing in this process may treat them as free before then.
var local = &registry{until: map[string]time.Time{}}

type registry struct {
	mu    sync.Mutex
	until map[string]time.Time
}

// hold marks names as possibly held until t.
func (r *registry) hold(names []string, t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range names {
		if t.After(r.until[n]) {
			r.until[n] = t
		}
	}
}

// wait blocks until none of names is marked held, or ctx ends.
func (r *registry) wait(ctx context.Context, names []string) error {
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
