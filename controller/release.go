package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Release gives the locks back if this holder still owns them: each key is
// deleted only under the guard that its create revision is still this
// holder's fence, so a late release never removes a newer holder's lock;
// then the lease is revoked. It is best effort, bounded by
// LockOptions.ReleaseTimeout. If a delete or the revoke is not confirmed,
// the release does not count: Release waits until the lease's TTL has run
// out since its last confirmed renewal (or ctx ends, returning
// ErrReleaseUnconfirmed; until that time, Acquire in this process treats
// the names as held). On a LOST holder Release still sends the guarded
// deletes and returns ErrNotOwner when etcd refused them.
func (h *Holder) Release(ctx context.Context) error {
	h.mu.Lock()
	st := h.state
	h.mu.Unlock()
	switch st {
	case StateActive:
		if !h.transition(StateActive, StateReleasing) {
			return h.Release(ctx) // it moved on meanwhile: take its new state
		}
		h.cancel(ErrNotActive)
		return h.finishRelease(ctx, StateActive)
	case StateLost:
		return h.finishRelease(ctx, StateLost)
	case StateReleasing:
		// Another release (MaxHold's, or a concurrent call) runs: wait
		// for its result.
		select {
		case <-h.relDone:
			h.mu.Lock()
			defer h.mu.Unlock()
			return h.relErr
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrReleaseUnconfirmed, ctx.Err())
		}
	default:
		return fmt.Errorf("%w (%s)", ErrNotActive, st)
	}
}

// finishRelease does the release's I/O for a holder that was st (ACTIVE,
// now RELEASING, or LOST).
func (h *Holder) finishRelease(ctx context.Context, st State) (err error) {
	if st == StateActive {
		defer func() {
			h.mu.Lock()
			h.relErr = err
			h.mu.Unlock()
			close(h.relDone)
		}()
	}
	h.hbCancel()
	h.wg.Wait()
	if st == StateLost {
		select {
		case <-h.lostDone:
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrReleaseUnconfirmed, ctx.Err())
		}
	}

	h.mu.Lock()
	keys := make(map[string]string, len(h.keys))
	for k, v := range h.keys {
		keys[k] = v
	}
	fences := make(map[string]int64, len(h.fences))
	for k, v := range h.fences {
		fences[k] = v
	}
	sess, lease := h.sess, h.lease
	h.mu.Unlock()

	var errs []error
	unconfirmed := false
	notOwner := false
	rctx, cancel := context.WithTimeout(ctx, h.opts.ReleaseTimeout)
	defer cancel()
	for _, name := range h.names {
		key, ok := keys[name]
		if !ok {
			continue
		}
		resp, err := h.cli.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", fences[name])).
			Then(clientv3.OpDelete(key)).
			Commit()
		switch {
		case err != nil:
			unconfirmed = true
			errs = append(errs, fmt.Errorf("delete %s: %w", key, err))
		case !resp.Succeeded:
			notOwner = true
		}
	}
	var stopped time.Time
	if sess != nil {
		sess.Orphan()
		stopped = h.surelyExpired()
		if _, err := h.cli.Revoke(rctx, lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			unconfirmed = true
			errs = append(errs, fmt.Errorf("revoke lease %x: %w", lease, err))
		}
	}
	if st == StateLost {
		if notOwner {
			return fmt.Errorf("%w: %w", ErrNotOwner, h.Err())
		}
		return h.Err()
	}
	if unconfirmed {
		freeAt := stopped
		if freeAt.IsZero() {
			freeAt = h.surelyExpired()
		}
		h.opts.Registry.hold(h.names, freeAt)
		h.mu.Lock()
		h.freeAt = freeAt
		h.mu.Unlock()
		t := time.NewTimer(time.Until(freeAt))
		defer t.Stop()
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ErrReleaseUnconfirmed, errors.Join(errs...))
		case <-t.C:
		}
	}
	h.transition(StateReleasing, StateReleased)
	if notOwner {
		return ErrNotOwner
	}
	return nil
}
