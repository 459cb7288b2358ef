package app

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/edge-agent/edge-agent/internal/fencemem"
)

// DefaultMQTTGrace is how long Live tolerates a lost MQTT connection while
// paho reconnects (every 10 s at most) when Options.MQTTGrace is zero.
const DefaultMQTTGrace = time.Minute

// liveness is Live's memory between calls.
type liveness struct {
	mu           sync.Mutex
	commits      uint64    // the store's commit count at the last sign of progress
	probeLost    bool      // a probe timed out and nothing was committed since
	disconnected time.Time // when the MQTT connection was first seen down; zero while up
}

// Live reports whether the agent still does its work, for systemd's
// watchdog (cmd/edge-agent pings WATCHDOG=1 only while it is nil):
//
//   - the agent has not failed (a failed commit stops it for good);
//   - the store's group-commit loop commits: it has committed since the
//     previous call, or a no-op update (store.Alive) commits before ctx
//     ends. While a timed-out probe is outstanding and nothing has been
//     committed since, no new probe is sent: the loop is stuck;
//   - the MQTT client is connected, or has been disconnected for less than
//     Options.MQTTGrace (paho reconnects on its own meanwhile).
//
// It is called by one goroutine at a time, after Start.
func (a *App) Live(ctx context.Context) error {
	select {
	case <-a.ag.Failed():
		return fmt.Errorf("agent failed: %w", a.ag.Err())
	default:
	}
	if err := a.storeLive(ctx); err != nil {
		return err
	}
	l := &a.live
	l.mu.Lock()
	defer l.mu.Unlock()
	if r, _ := a.fm.Role(); r == fencemem.RoleStandby || a.pub.c.Load().Connected() {
		// A standby has no broker session by design.
		l.disconnected = time.Time{}
		return nil
	}
	now := time.Now()
	if l.disconnected.IsZero() {
		l.disconnected = now
	}
	if d := now.Sub(l.disconnected); d >= a.o.MQTTGrace {
		return fmt.Errorf("mqtt: disconnected for %s (grace %s)", d.Round(time.Millisecond), a.o.MQTTGrace)
	}
	return nil
}

func (a *App) storeLive(ctx context.Context) error {
	l := &a.live
	l.mu.Lock()
	if c := a.st.Commits(); c != l.commits {
		l.commits, l.probeLost = c, false
		l.mu.Unlock()
		return nil
	}
	lost := l.probeLost
	l.mu.Unlock()
	if lost {
		return errors.New("store: the commit loop is stuck: an earlier probe is still not committed")
	}
	err := a.st.Alive(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.probeLost = errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
		return err
	}
	l.commits = a.st.Commits()
	return nil
}
