package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Acquire creates a holder for names and acquires it; see Holder.Acquire.
func Acquire(ctx context.Context, cli *clientv3.Client, names []string, opts *LockOptions) (*Holder, error) {
	h := NewHolder(cli, names, opts)
	if err := h.Acquire(ctx); err != nil {
		return nil, err
	}
	return h, nil
}

func validNames(names []string) error {
	if len(names) == 0 {
		return fmt.Errorf("%w: no names", ErrNoLocks)
	}
	for i, n := range names {
		if n == "" || strings.ContainsRune(n, 0) {
			return fmt.Errorf("%w: %q", ErrNoLocks, n)
		}
		if i > 0 && names[i-1] == n {
			return fmt.Errorf("%w: %q given twice", ErrNoLocks, n)
		}
		if i > 0 && strings.HasPrefix(n, names[i-1]+"/") {
			return fmt.Errorf("%w: %q is inside %q", ErrNoLocks, n, names[i-1])
		}
	}
	return nil
}

// Acquire takes every lock in sorted-name order, all under one etcd lease.
// It returns once all are held (state ACTIVE) or with ErrAcquireTimeout
// once LockOptions.AcquireTimeout has passed or ctx ended (state RELEASED,
// nothing held). Failed attempts are retried with exponential backoff and
// full jitter. All attempts of one Acquire share one lease: a lock request
// whose outcome is unknown (timed out) is simply repeated under the same
// lease, which finds and reuses its key if the first request did land, so
// one Acquire never has two sessions competing. When it gives up it
// revokes the lease; if that revoke cannot be confirmed, the names count
// as held in this process until the TTL has run out.
func (h *Holder) Acquire(ctx context.Context) error {
	if err := validNames(h.names); err != nil {
		return err
	}
	if !h.transition(StateIdle, StateAcquiring) {
		return ErrUsed
	}
	actx, cancel := context.WithTimeout(ctx, h.opts.AcquireTimeout)
	defer cancel()

	var last error
	if err := h.opts.Registry.wait(actx, h.names); err != nil {
		return h.giveUp(fmt.Errorf("waiting out an unconfirmed release in this process: %w", err))
	}
	for n := 0; ; n++ {
		h.mu.Lock()
		h.attempts = append(h.attempts, time.Now())
		h.mu.Unlock()
		err := h.attempt(actx)
		if err == nil {
			return h.activate()
		}
		last = err
		if actx.Err() != nil {
			break
		}
		select {
		case <-actx.Done():
		case <-time.After(Backoff(n, h.opts.BackoffBase, h.opts.BackoffMax)):
		}
		if actx.Err() != nil {
			break
		}
	}
	return h.giveUp(last)
}

func (h *Holder) giveUp(last error) error {
	h.hbCancel()
	h.dropSession(true)
	err := fmt.Errorf("%w: locks %v: %v", ErrAcquireTimeout, h.names, last)
	h.mu.Lock()
	h.err = err
	h.mu.Unlock()
	h.transition(StateAcquiring, StateReleased)
	h.cancel(err)
	return err
}

// attempt does one pass: a lease (reused across attempts), then each lock
// not yet held, in order.
func (h *Holder) attempt(actx context.Context) error {
	h.mu.Lock()
	sess := h.sess
	h.mu.Unlock()
	if sess != nil {
		select {
		case <-sess.Done():
			// The lease is gone, and every key with it.
			h.dropSession(true)
			sess = nil
		default:
		}
	}
	if sess == nil {
		rctx, cancel := context.WithTimeout(actx, h.opts.RequestTimeout)
		sent := time.Now()
		// A grant whose answer is lost leaves a lease nobody renews and
		// nothing is attached to: it expires by itself.
		resp, err := h.cli.Grant(rctx, ttlSeconds(h.opts.TTL))
		cancel()
		if err != nil {
			return fmt.Errorf("grant lease: %w", err)
		}
		s, err := concurrency.NewSession(h.cli, concurrency.WithLease(resp.ID), concurrency.WithTTL(int(ttlSeconds(h.opts.TTL))))
		if err != nil {
			h.revoke(resp.ID)
			return fmt.Errorf("session for lease %x: %w", resp.ID, err)
		}
		h.mu.Lock()
		h.sess, h.lease, h.lastSent = s, resp.ID, sent
		h.fences = map[string]int64{}
		h.keys = map[string]string{}
		h.mu.Unlock()
		sess = s
	}
	for _, name := range h.names {
		h.mu.Lock()
		_, held := h.fences[name]
		h.mu.Unlock()
		if held {
			continue
		}
		lctx, cancel := actx, context.CancelFunc(func() {})
		if h.opts.AttemptWait > 0 {
			lctx, cancel = context.WithTimeout(actx, h.opts.AttemptWait)
		}
		m := concurrency.NewMutex(sess, name)
		err := m.Lock(lctx)
		cancel()
		if err != nil {
			if errors.Is(err, concurrency.ErrSessionExpired) {
				h.dropSession(true)
			}
			return fmt.Errorf("lock %s: %w", name, err)
		}
		cmp := m.IsOwner()
		rev, ok := cmp.GetCompare().TargetUnion.(*pb.Compare_CreateRevision)
		if !ok || rev.CreateRevision <= 0 {
			return fmt.Errorf("lock %s: no create revision for key %q", name, m.Key())
		}
		h.mu.Lock()
		h.fences[name] = rev.CreateRevision
		h.keys[name] = m.Key()
		h.mu.Unlock()
	}
	// One timed renewal before going ACTIVE: it proves the lease (and so
	// every key) is alive and starts the ownership clock from its send.
	if err := h.renewOnce(actx); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			h.dropSession(true)
		}
		return err
	}
	return nil
}

func (h *Holder) activate() error {
	h.mu.Lock()
	sess := h.sess
	h.mu.Unlock()
	if !h.transition(StateAcquiring, StateActive) {
		return ErrUsed
	}
	h.wg.Add(2)
	renewed := make(chan struct{}, 1)
	go h.renewLoop(renewed)
	go h.watch(sess, renewed)
	return nil
}
