package app

import (
	"fmt"

	"github.com/edge-agent/edge-agent/internal/auth"
	"github.com/edge-agent/edge-agent/internal/config"
)

// buildAuth is the signature checker of docs/protocol.md §6, with the keys
// the configuration read at load.
func buildAuth(cfg *config.Config) (*auth.Verifier, error) {
	v, err := auth.New(auth.Options{Gateway: cfg.GatewayID, Keys: authKeys(cfg, nil),
		Require: cfg.Security.Signed(), MaxTTL: cfg.Security.MaxTTL.D()})
	if err != nil {
		return nil, fmt.Errorf("%w: security.keys: %v", ErrConfig, err)
	}
	return v, nil
}

// authKeys converts the configured keys (with pub[i] for key i, when
// given, in place of what was read at load).
func authKeys(cfg *config.Config, pub map[int]auth.Key) []auth.Key {
	keys := make([]auth.Key, 0, len(cfg.Security.Keys))
	for i, k := range cfg.Security.Keys {
		if p, ok := pub[i]; ok {
			keys = append(keys, p)
			continue
		}
		keys = append(keys, auth.Key{ID: k.ID, Public: k.Public, Devices: k.Devices})
	}
	return keys
}

// reloadKeys reads every key file again and replaces the keys in use at
// once (SIGHUP). Commands already admitted are not affected: they were
// checked on arrival. Any file that cannot be read keeps all the keys in
// use (an error naming the key).
func (a *App) reloadKeys() error {
	if a.ag == nil || len(a.cfg.Security.Keys) == 0 {
		return nil
	}
	fresh := map[int]auth.Key{}
	for i, k := range a.cfg.Security.Keys {
		pub, err := config.ReadKey(k)
		if err != nil {
			return fmt.Errorf("security.keys[%d] (%s).public_key_file: %w; the keys in use are kept", i, k.ID, err)
		}
		fresh[i] = auth.Key{ID: k.ID, Public: pub, Devices: k.Devices}
	}
	if err := a.ag.Verifier().SetKeys(authKeys(a.cfg, fresh)); err != nil {
		return fmt.Errorf("security.keys: %w; the keys in use are kept", err)
	}
	a.log.Info("security: keys reloaded", "keys", len(fresh))
	return nil
}
