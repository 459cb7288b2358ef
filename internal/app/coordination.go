package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/edge-agent/edge-agent/internal/admin"
	"github.com/edge-agent/edge-agent/internal/fencemem"
	"github.com/edge-agent/edge-agent/internal/mqtt"
)

// startFenceMemory checks the store's fence memory (internal/fencemem)
// before anything else starts: with coordination, the gateway is
// registered and its devices claimed before the broker is connected (a
// clone must not take over the real gateway's MQTT session), and the
// floor is taken where the memory may be incomplete. A device claimed by
// another live gateway is a configuration error (exit 2); a clone exits 1.
func (a *App) startFenceMemory(ctx context.Context) error {
	cfg := a.cfg
	ids := make([]string, 0, len(cfg.Devices))
	for _, d := range cfg.Devices {
		ids = append(ids, d.ID)
	}
	a.fm = fencemem.New(fencemem.Options{Etcd: cfg.Coordination.Etcd, Gateway: cfg.GatewayID, Devices: ids,
		Store: a.st, Version: a.o.Version, Logger: a.log, HA: cfg.HA.Enabled, SafetyMargin: cfg.HA.SafetyMargin.D()})
	a.boot.set("checking the fence memory")
	a.fmSeen.Store(a.fm)
	if cfg.HA.Enabled && a.adm != nil {
		// A standby waits inside Start: its admin API says so.
		a.handler.set(admin.Standby(a.adminOptions()))
		defer a.handler.set(a.startingHandler())
	}
	err := a.fm.Start(ctx)
	if errors.Is(err, fencemem.ErrClaimed) {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	return err
}

// Standby reports whether the agent waits as standby (ha): inside Start,
// until it registers, or after Start, having stood down; and the active's
// host when it is known. It may be called from any goroutine at any time,
// also while Start runs (cmd/edge-agent tells systemd: a standby is a
// service running as configured, so READY=1 is not held back for it).
func (a *App) Standby() (activeHost string, ok bool) {
	m := a.fmSeen.Load()
	if m == nil {
		return "", false
	}
	r, host := m.Role()
	return host, r == fencemem.RoleStandby
}

// StandbyLive is Live for the time Start waits as standby: the store's
// group-commit loop commits (Live's store condition). It may be called
// while Start runs, by one goroutine at a time, not together with Live.
func (a *App) StandbyLive(ctx context.Context) error {
	if a.fmSeen.Load() == nil {
		return errors.New("not started")
	}
	return a.storeLive(ctx)
}

// role is GET /v1/status's "role" (docs/protocol.md §8).
func (a *App) role() admin.Role {
	r, host := a.fm.Role()
	return admin.Role{Role: r, ActiveHost: host}
}

// onRole follows the agent's role after Start (ha): standing down, the
// admin API is the standby's and the MQTT session is closed, so no command
// comes in (the worker's gate already sends no write: Proven is false);
// active again (the floor for every device taken), a new MQTT session
// with the gateway's client ID takes the commands queued in the broker.
func (a *App) onRole(active bool) {
	select {
	case <-a.stopFail:
		return // stopping
	default:
	}
	if !active {
		if a.adm != nil {
			a.handler.set(admin.Standby(a.adminOptions()))
		}
		if mc := a.pub.c.Load(); mc != nil {
			mc.Close()
		}
		return
	}
	mc, err := mqtt.New(a.mqttOpts)
	if err != nil {
		a.log.Error("ha: the MQTT client", "err", err)
		return
	}
	a.pub.set(mc)
	if a.adm != nil {
		a.handler.set(admin.Handler(a.ag, a.adminOptions()))
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := mc.Start(a.runCtx); err != nil {
			a.log.Error("ha: connecting to the broker", "err", err)
		}
	}()
}

// coordination is GET /v1/status's "coordination".
func (a *App) coordination() any { return a.fm.Status() }

// watchFailures closes a.failed when the agent or the fence memory fails
// (another live agent took this gateway's registration).
func (a *App) watchFailures() {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		select {
		case <-a.ag.Failed():
			a.failErr = a.ag.Err()
		case <-a.fm.Failed():
			a.failErr = a.fm.Err()
		case <-a.stopFail:
			return
		}
		close(a.failed)
	}()
}
