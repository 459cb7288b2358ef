package fencemem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// A standby that takes over (docs/protocol.md §8, docs/design.md). With
// ha, the agent that holds {cp}/gateways/{gw} is active; another one with
// the same gateway_id waits as standby inside Start (so nothing after it
// runs: no broker session, no device) until the key is gone, then
// registers and takes the floor for every device with reason takeover.
//
// The active proves its session with keepalives of its own (besides the
// session's): each confirmed one moves lastSent to when it was sent, on
// the monotonic clock, and Proven is true only while less than
// session_ttl - safety_margin has passed since. When it stops being true
// the active stands down: the session is revoked (so the standby need not
// wait for it to expire) and it waits as standby, which the worker's gate
// turns into "no write is sent".

// Roles of an agent (GET /v1/status).
const (
	RoleActive  = "active"
	RoleStandby = "standby"
	RoleSingle  = "single"
)

// ReasonTakeover is the floor's reason when a standby becomes active.
const ReasonTakeover = "takeover"

// Role returns the agent's role and, on a standby, the active's host.
func (m *Memory) Role() (role, activeHost string) {
	if !m.o.HA {
		return RoleSingle, ""
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.active {
		return RoleActive, ""
	}
	return RoleStandby, m.activeHost
}

// OnRole sets the function told when, after Start, the agent stands
// down (active false: it stops serving) and when it becomes active again
// (true: the floor for every device is taken, it may serve).
func (m *Memory) OnRole(fn func(active bool)) {
	m.mu.Lock()
	m.onRole = fn
	m.mu.Unlock()
}

func (m *Memory) tell(active bool) {
	m.mu.Lock()
	fn := m.onRole
	m.mu.Unlock()
	if fn != nil {
		fn(active)
	}
}

// Proven reports whether the session is proven alive: always without ha;
// with it, while this agent is active and less than session_ttl -
// safety_margin has passed since the send of the last keepalive etcd
// confirmed. The worker sends no write to a device while it is false.
//
// Without ha it is the same with coordination once the gateway has
// checked in (before that, every device is unconfirmed anyway: recovery
// may still ask devices about unresolved writes), and always true without
// coordination.
func (m *Memory) Proven() bool {
	if m.o.Etcd == nil {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.o.HA && !m.everActive {
		return true
	}
	return m.active && time.Since(m.lastSent) < m.o.Etcd.SessionTTL.D()-m.o.SafetyMargin
}

// renewInterval is the pause between the active's own keepalives: a third
// of the time a confirmed one proves the session for, so a lost one or
// two do not close the gate.
func (m *Memory) renewInterval() time.Duration {
	return max((m.o.Etcd.SessionTTL.D()-m.o.SafetyMargin)/3, 50*time.Millisecond)
}

// becomeActive marks the agent active from the send time sent of the
// session's grant, and starts proving the session.
func (m *Memory) becomeActive(sess *concurrency.Session, sent time.Time) {
	m.mu.Lock()
	m.active, m.activeHost, m.lastSent, m.everActive = true, "", sent, true
	m.mu.Unlock()
	m.wg.Add(1)
	go m.prove(sess)
}

// prove sends a keepalive every renewInterval and moves lastSent on each
// confirmed one; once Proven is false it stands down.
func (m *Memory) prove(sess *concurrency.Session) {
	defer m.wg.Done()
	t := time.NewTicker(m.renewInterval())
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		sent := time.Now()
		ctx, cancel := context.WithTimeout(m.ctx, m.renewInterval())
		_, err := m.cli.KeepAliveOnce(ctx, sess.Lease())
		cancel()
		// Once the proof has lapsed (a pause longer than session_ttl -
		// margin, woken before the lease ran out), Proven was false and
		// may have been seen so: the worker held its writes, the app
		// refused deliveries unacknowledged on a connection that only a
		// stand-down closes. So a lapse is a stand-down (a lapse without
		// ha) even when this keepalive succeeds: judged before its answer
		// counts (lastSent has only this writer, and the clock is
		// monotonic, so whoever saw Proven false before sees it here).
		lapsed := !m.Proven()
		if err == nil && !lapsed {
			m.mu.Lock()
			if sent.After(m.lastSent) {
				m.lastSent = sent
			}
			m.mu.Unlock()
		}
		if lapsed || !m.Proven() {
			if lapsed && err == nil {
				err = errors.New("the proof lapsed before this keepalive was answered (a pause?)")
			}
			if m.o.HA {
				m.standDown(err)
			} else {
				m.lapse(err)
			}
			return
		}
	}
}

// standDown ends the active's session and waits as standby until it can
// register again: then it is active again, the floor for every device
// (reason takeover) taken first.
func (m *Memory) standDown(cause error) {
	m.log.Error("ha: the etcd session cannot be proven alive within session_ttl - safety_margin; no write is sent to any device, this agent stands down as standby",
		"session_ttl", m.o.Etcd.SessionTTL.D(), "safety_margin", m.o.SafetyMargin, "err", cause)
	m.setState("unreachable", "stood down: the session could not be proven alive")
	m.dropSession()
	m.tell(false)
	if m.checkInAgain(false) {
		m.log.Info("ha: active again; the floor for every device is taken", "gateway", m.o.Gateway)
		m.tell(true)
	}
}

// lapse is standDown without ha: the session could not be proven alive
// within session_ttl - margin (etcd away or cut off), so another agent may
// register as this gateway once the lease expires: a copy of the running
// gateway (a VM snapshot, same store id and epoch) would find no doubt and
// serve (invariant 7). So, before the lease can expire, every device is
// unconfirmed (fence_unconfirmed) and nothing is sent to a device
// (Proven), until the check-in succeeds again: it exits 1 when another
// agent registered as this gateway meanwhile (ErrClone), and takes the
// floor where that agent may have accepted fences (its check-in raised
// the epoch etcd holds). The session is revoked first where etcd can
// still be reached, so the new check-in need not wait for it.
func (m *Memory) lapse(cause error) {
	for _, c := range m.confirmed {
		c.Store(false)
	}
	m.log.Error("coordination: the etcd session cannot be proven alive within session_ttl - safety_margin; every device is fence_unconfirmed and nothing is sent to a device until the gateway checks in again",
		"session_ttl", m.o.Etcd.SessionTTL.D(), "safety_margin", m.o.SafetyMargin, "err", cause)
	m.setState("unreachable", "the etcd session could not be proven alive; checking in again")
	m.dropSession()
	if m.checkInAgain(false) {
		id := m.identity()
		m.log.Info("coordination: checked in again; fence memory confirmed", "store_id", id.StoreID, "epoch", id.Epoch)
	}
}

// dropSession ends this agent's activity under its session: not active
// (Proven is false), the session forgotten, and its lease revoked where
// etcd can still be reached (its keys go at once, so a check-in need not
// wait for them).
func (m *Memory) dropSession() {
	m.mu.Lock()
	m.active = false
	sess := m.sess
	m.sess = nil
	m.mu.Unlock()
	if sess != nil {
		sess.Orphan()
		ctx, cancel := context.WithTimeout(m.ctx, m.o.Etcd.DialTimeout.D())
		m.cli.Revoke(ctx, sess.Lease())
		cancel()
	}
}

// checkInAgain repeats the check-in every Retry (the first try at once, or
// after one pause when wait) until it succeeds (true), another live agent
// holds the gateway or a device (the memory fails: the process exits 1),
// or the Memory closes.
func (m *Memory) checkInAgain(wait bool) bool {
	for {
		if wait {
			select {
			case <-m.ctx.Done():
				return false
			case <-time.After(m.o.Retry):
			}
		}
		wait = true
		err := m.checkIn(m.ctx)
		switch {
		case err == nil:
			return true
		case errors.Is(err, ErrClone), errors.Is(err, ErrClaimed):
			m.fail(err)
			return false
		case m.ctx.Err() != nil:
			return false
		}
		m.unreachable(err)
	}
}

// standbyOf records the registration cur (another agent's) as the active.
func (m *Memory) standbyOf(cur string) {
	var r registration
	json.Unmarshal([]byte(cur), &r)
	m.mu.Lock()
	changed := m.activeHost != r.Host
	m.activeHost = r.Host
	m.mu.Unlock()
	switch host, _ := os.Hostname(); {
	case !changed:
	case r.PID == os.Getpid() && r.Host == host:
		m.log.Info("ha: standby until this agent's own registration of an ended session expires", "gateway", m.o.Gateway)
	default:
		m.log.Info("ha: standby; the active agent runs elsewhere", "gateway", m.o.Gateway, "active_host", r.Host, "active_pid", r.PID)
	}
}

// startHA is Start with ha: the check-in is tried until it succeeds, as
// standby meanwhile (an agent that cannot reach etcd must not connect to
// the broker with the gateway's client ID).
func (m *Memory) startHA(ctx context.Context) error {
	for {
		err := m.checkIn(ctx)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, ErrClaimed):
			m.Close()
			return err
		case ctx.Err() != nil:
			m.Close()
			return ctx.Err()
		}
		m.unreachable(err)
		m.log.Warn("ha: standby until etcd can be reached", "endpoints", m.o.Etcd.Endpoints, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(m.o.Retry):
		}
	}
}

// standbyKey is a waiting standby's {cp}/standbys/{gw}/{lease} (extension,
// docs/protocol.md §8): under its session, so it goes with the standby.
func (m *Memory) standbyKey(sess *concurrency.Session) string {
	return m.key("standbys", m.o.Gateway, fmt.Sprintf("%x", int64(sess.Lease())))
}

// announceStandby puts the standby's key (reg as a standby's) under sess,
// once per session, so `edgectl fleet` can show the pair. Best effort: a
// standby that cannot write it still waits and takes over.
func (m *Memory) announceStandby(ctx context.Context, sess *concurrency.Session, reg registration) {
	m.mu.Lock()
	done := m.announced == sess.Lease()
	m.announced = sess.Lease()
	m.mu.Unlock()
	if done {
		return
	}
	reg.Role, reg.StoreID = RoleStandby, ""
	b, _ := json.Marshal(reg)
	cctx, cancel := context.WithTimeout(ctx, m.o.Etcd.DialTimeout.D())
	defer cancel()
	if _, err := m.cli.Put(cctx, m.standbyKey(sess), string(b), clientv3.WithLease(sess.Lease())); err != nil {
		m.log.Warn("ha: cannot announce this standby in etcd", "key", m.standbyKey(sess), "err", err)
	}
}

// unannounceStandby deletes the standby's key once the wait is over (it
// holds the registration now, or gives up), in the same session.
func (m *Memory) unannounceStandby(ctx context.Context, sess *concurrency.Session) {
	m.mu.Lock()
	was := m.announced == sess.Lease()
	m.announced = 0
	m.mu.Unlock()
	if !was {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.o.Etcd.DialTimeout.D())
	defer cancel()
	if _, err := m.cli.Delete(cctx, m.standbyKey(sess)); err != nil {
		m.log.Warn("ha: cannot remove this agent's standby key from etcd (it goes with the session)", "key", m.standbyKey(sess), "err", err)
	}
}
