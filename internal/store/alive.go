package store

import (
	"context"
	"fmt"
)

// Alive reports whether the group-commit loop still commits, for a
// watchdog: it submits a no-op update and returns nil once that update's
// commit is durable. If ctx ends first it returns ctx's error, wrapped; the
// abandoned update stays queued and is committed with whatever batch it
// ends up in, so a caller that probes again before the store has committed
// anything since would only pile up probes. After a failed commit it
// returns ErrFailed at once, after Close ErrClosed.
//
// Cost: one commit (bbolt rewrites and fsyncs its meta page: one 4 KiB
// page) when the store is idle; nothing extra when it rides along with a
// batch of other updates.
func (s *Store) Alive(ctx context.Context) error {
	select {
	case err := <-s.Submit(ctx, func(*Tx) error { return nil }):
		return err
	case <-ctx.Done():
		return fmt.Errorf("store: the commit loop committed nothing within the probe's time: %w", ctx.Err())
	}
}
