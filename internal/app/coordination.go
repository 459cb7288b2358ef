package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/edge-agent/edge-agent/internal/fencemem"
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
		Store: a.st, Version: a.o.Version, Logger: a.log})
	a.boot.set("checking the fence memory")
	err := a.fm.Start(ctx)
	if errors.Is(err, fencemem.ErrClaimed) {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	return err
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
