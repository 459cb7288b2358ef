package app

import (
	"context"
	"log/slog"

	"github.com/edge-agent/edge-agent/internal/config"
)

// CheckPlugins loads every policy plugin cfg binds, as Start would (compile,
// instantiate, policy_init with the binding's config), and closes them
// again: `edge-agent config check`. It writes nothing (no compile cache).
// The error joins every plugin's problem, each wrapping ErrConfig.
func CheckPlugins(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	h, err := buildPolicy(ctx, cfg, log, nil, "", nil)
	if h != nil {
		h.Close(context.Background())
	}
	return err
}
