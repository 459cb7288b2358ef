package main

import (
	"context"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/edge-agent/edge-agent/internal/app"
)

// systemd's notify protocol (sd_notify(3)) for configs/edge-agent.service
// (Type=notify, WatchdogSec=): READY=1 once the agent is ready (the
// condition of GET /readyz), WATCHDOG=1 at a third of WATCHDOG_USEC while
// App.Live says the commit loop and the MQTT session are alive, STOPPING=1
// when the drain begins. Without NOTIFY_SOCKET (not under systemd) nothing
// is sent and no probe runs.

// readyPoll is how often readiness is checked until READY=1 is sent.
const readyPoll = 50 * time.Millisecond

// notifier sends the agent's notifications to systemd.
type notifier struct {
	log      *slog.Logger
	on       bool          // NOTIFY_SOCKET is set
	watchdog time.Duration // WATCHDOG_USEC; 0: no watchdog
	ha       bool          // ha.enabled: STATUS= says the role
}

func newNotifier(log *slog.Logger, ha bool) *notifier {
	n := &notifier{log: log, on: os.Getenv("NOTIFY_SOCKET") != "", ha: ha}
	if !n.on {
		return n
	}
	wd, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		log.Warn("systemd: WATCHDOG_USEC ignored", "err", err)
	}
	n.watchdog = wd
	return n
}

// mqttGrace is how long a lost MQTT connection may last before the
// watchdog pings stop: one watchdog period, so systemd restarts an agent
// whose session stays down for about two (app.DefaultMQTTGrace without a
// watchdog).
func (n *notifier) mqttGrace() time.Duration {
	return n.watchdog
}

func (n *notifier) send(state string) {
	if !n.on {
		return
	}
	if _, err := daemon.SdNotify(false, state); err != nil {
		n.log.Warn("systemd: notify failed", "state", state, "err", err)
	}
}

// run sends READY=1 once the agent is ready (a.Ready() is nil after
// Start returned: started is set), or as soon as it waits as standby (ha;
// a standby is the service running as configured: `systemctl start` must
// not hang on it, and /readyz still says 503), then WATCHDOG=1 every third
// of the watchdog period for as long as the agent is alive (a.Live after
// Start, the store's commit loop while Start waits as standby), until ctx
// ends. With ha, STATUS= follows the role: "active", or "standby (active:
// HOST)". Each liveness probe may take up to a third of the period. It is
// started before Start.
func (n *notifier) run(ctx context.Context, a *app.App, started *atomic.Bool) {
	if !n.on {
		return
	}
	t := time.NewTicker(readyPoll)
	status := ""
	for {
		s, ready := phase(a, n.ha, started.Load())
		if ready {
			status = s
			break
		}
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	t.Stop()
	n.send(daemon.SdNotifyReady)
	n.log.Info("systemd: READY=1 sent", "watchdog", n.watchdog, "status", status)
	if status != "" {
		n.send("STATUS=" + status)
	}
	every := n.watchdog / 3
	if n.watchdog <= 0 {
		every = time.Second // STATUS= only
	}
	t = time.NewTicker(every)
	defer t.Stop()
	alive := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s, _ := phase(a, n.ha, started.Load()); s != status {
			status = s
			n.send("STATUS=" + s)
		}
		if n.watchdog <= 0 {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, every)
		var err error
		if started.Load() {
			err = a.Live(pctx)
		} else {
			err = a.StandbyLive(pctx)
		}
		cancel()
		if err != nil {
			if alive {
				n.log.Error("watchdog: not alive, WATCHDOG=1 withheld (systemd restarts the agent if this lasts WatchdogSec)", "err", err)
			}
			alive = false
			continue
		}
		if !alive {
			n.log.Info("watchdog: alive again, WATCHDOG=1 resumed")
		}
		alive = true
		n.send(daemon.SdNotifyWatchdog)
	}
}

// phase is the agent's STATUS= (empty without ha) and whether READY=1 may
// be sent: once Start has returned and the agent is ready, or while it
// waits as standby.
func phase(a *app.App, ha, started bool) (status string, ready bool) {
	if host, ok := a.Standby(); ok {
		if host == "" {
			host = "not known yet"
		}
		return "standby (active: " + host + ")", true
	}
	if !started {
		return "", false
	}
	if ha {
		status = "active"
	}
	return status, a.Ready() == nil
}
