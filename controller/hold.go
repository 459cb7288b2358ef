package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// renewOnce sends one keepalive and, once confirmed, moves lastSent to
// when it was sent.
func (h *Holder) renewOnce(ctx context.Context) error {
	h.mu.Lock()
	lease := h.lease
	h.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, h.opts.RequestTimeout)
	defer cancel()
	sent := time.Now()
	resp, err := h.cli.KeepAliveOnce(rctx, lease)
	h.opts.Metrics.renewed(time.Since(sent), err)
	if err != nil {
		return fmt.Errorf("renew lease %x: %w", lease, err)
	}
	if resp.TTL < ttlSeconds(h.opts.TTL) {
		// Granted less than asked (should not happen): count from the
		// server's figure, which is the conservative one.
		sent = sent.Add(time.Duration(resp.TTL)*time.Second - h.opts.TTL)
	}
	h.mu.Lock()
	if sent.After(h.lastSent) {
		h.lastSent = sent
	}
	h.mu.Unlock()
	return nil
}

// dropSession stops renewing the current lease and revokes it (best
// effort). If the revoke is not confirmed, the names count as held in
// this process until the lease has surely expired. reset forgets the keys
// (during acquisition); a LOST holder keeps them for a late Release.
func (h *Holder) dropSession(reset bool) {
	h.mu.Lock()
	s, lease := h.sess, h.lease
	h.sess = nil
	if reset {
		h.lease = clientv3.NoLease
		h.fences = map[string]int64{}
		h.keys = map[string]string{}
	}
	h.mu.Unlock()
	if s == nil {
		return
	}
	s.Orphan()
	if err := h.revoke(lease); err != nil {
		h.opts.Registry.hold(h.names, h.surelyExpired())
	}
}

// surelyExpired is when a lease whose renewals stopped now has run out:
// the session's own keepalive may have sent a renewal up to now, so the
// TTL counts from now, plus one request timeout for a renewal still on
// its way (and never earlier than from the last confirmed renewal).
func (h *Holder) surelyExpired() time.Time {
	return time.Now().Add(h.opts.TTL + h.opts.RequestTimeout)
}

func (h *Holder) revoke(lease clientv3.LeaseID) error {
	ctx, cancel := context.WithTimeout(context.Background(), h.opts.ReleaseTimeout)
	defer cancel()
	_, err := h.cli.Revoke(ctx, lease)
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("revoke lease %x: %w", lease, err)
	}
	return nil
}

// renewLoop sends a timed renewal every RenewInterval until stop.
func (h *Holder) renewLoop(renewed chan<- struct{}) {
	defer h.wg.Done()
	t := time.NewTicker(h.opts.RenewInterval)
	defer t.Stop()
	for {
		select {
		case <-h.hb.Done():
			return
		case <-t.C:
		}
		err := h.renewOnce(h.hb)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			h.lose(fmt.Errorf("%w: %w", ErrSessionEnded, err))
			return
		}
		if err == nil {
			select {
			case renewed <- struct{}{}:
			default:
			}
		}
	}
}

// watch turns the end of the session, an overdue renewal or MaxHold into
// the holder's end.
func (h *Holder) watch(sess *concurrency.Session, renewed <-chan struct{}) {
	defer h.wg.Done()
	var maxHold <-chan time.Time
	if h.opts.MaxHold > 0 {
		t := time.NewTimer(h.opts.MaxHold)
		defer t.Stop()
		maxHold = t.C
	}
	for {
		wait := time.Until(h.deadline())
		if wait <= 0 {
			h.lose(ErrRenewalOverdue)
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-h.hb.Done():
			t.Stop()
			return
		case <-sess.Done():
			t.Stop()
			h.lose(ErrSessionEnded)
			return
		case <-renewed:
		case <-t.C:
		case <-maxHold:
			t.Stop()
			if !h.transition(StateActive, StateReleasing) {
				return
			}
			h.mu.Lock()
			h.err = ErrMaxHold
			h.mu.Unlock()
			h.cancel(ErrMaxHold)
			// release waits for this goroutine, so it runs apart; Release
			// and relDone wait for it.
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), h.opts.ReleaseTimeout+h.opts.TTL)
				defer cancel()
				h.finishRelease(ctx, StateActive)
			}()
			return
		}
		t.Stop()
	}
}

// deadline is when ownership stops counting: the send time of the last
// confirmed renewal plus TTL minus the safety margin, on the monotonic
// clock (time.Time from time.Now carries it).
func (h *Holder) deadline() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lastSent.Add(h.opts.TTL - h.opts.SafetyMargin)
}

// lose moves an ACTIVE holder to LOST: its context is cancelled so work in
// progress stops, renewals stop, and the lease is revoked best effort. It
// never re-acquires.
func (h *Holder) lose(cause error) {
	err := fmt.Errorf("%w: %w", ErrLost, cause)
	h.mu.Lock()
	if h.state != StateActive {
		h.mu.Unlock()
		return
	}
	h.err = err
	h.mu.Unlock()
	if !h.transition(StateActive, StateLost) {
		return
	}
	h.opts.Metrics.lost(cause)
	h.cancel(err)
	h.hbCancel()
	go func() {
		// lose may run on a heartbeat goroutine, so the revoke runs
		// apart; Release waits for lostDone.
		h.dropSession(false)
		close(h.lostDone)
	}()
}

// Lose moves an ACTIVE holder to LOST with cause (Sender calls it on a
// stale_fence or a newer last_fence). It is a no-op in any other state.
func (h *Holder) Lose(cause error) { h.lose(cause) }
