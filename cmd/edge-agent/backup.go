package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/edge-agent/edge-agent/internal/store"
)

// backupCmd is `edge-agent backup` (docs/protocol.md §7): a consistent copy
// of the store, online through the admin API or offline. The copy carries
// a backup mark: a start on it takes the fence floor.
func backupCmd() *cobra.Command {
	var out, adminURL, token, dataDir string
	c := &cobra.Command{
		Use:   "backup",
		Short: "Write a consistent copy of the store (online: --admin URL; offline: --data-dir DIR)",
		Long: `Write a consistent copy of the store to --out: online through the admin
API (GET /v1/backup) while the agent runs, or offline from --data-dir.

The copy is marked as a backup. An agent started on a restored copy knows
that it may have forgotten fences accepted after the copy was made and,
with coordination configured, takes the fence floor before any command
(docs/operations.md, "Backup and restore").`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case out == "":
				return &exitError{2, errors.New("--out FILE is required")}
			case (adminURL == "") == (dataDir == ""):
				return &exitError{2, errors.New("give one of --admin URL (online) or --data-dir DIR (offline)")}
			}
			if token == "" {
				token = os.Getenv("EDGE_AGENT_TOKEN")
			}
			tmp := out + ".partial"
			var err error
			if adminURL != "" {
				err = backupOnline(cmd.Context(), adminURL, token, tmp)
			} else {
				err = backupOffline(cmd.Context(), filepath.Join(dataDir, "agent.db"), tmp)
			}
			if err == nil {
				err = checkBackup(tmp)
			}
			if err != nil {
				os.Remove(tmp)
				return fmt.Errorf("backup: %w", err)
			}
			if err := os.Rename(tmp, out); err != nil {
				return fmt.Errorf("backup: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "backup written to %s\n", out)
			return nil
		},
	}
	c.Flags().StringVar(&out, "out", "", "the file to write")
	c.Flags().StringVar(&adminURL, "admin", "", "the running agent's admin API, e.g. http://127.0.0.1:9464")
	c.Flags().StringVar(&token, "token", "", "admin.token (or EDGE_AGENT_TOKEN)")
	c.Flags().StringVar(&dataDir, "data-dir", "", "the stopped agent's data_dir")
	return c
}

func backupOnline(ctx context.Context, adminURL, token, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(adminURL, "/")+"/v1/backup", nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s: %s: %s", req.URL, resp.Status, strings.TrimSpace(string(b)))
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func backupOffline(ctx context.Context, db, path string) error {
	if _, err := os.Stat(db); err != nil {
		return err
	}
	st, err := store.Open(db, &store.Options{OpenTimeout: 1500 * time.Millisecond})
	if err != nil {
		if errors.Is(err, store.ErrLocked) {
			return fmt.Errorf("%w; use --admin for an online backup", err)
		}
		return err
	}
	st.Start()
	defer st.Close()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	if _, err := st.Backup(ctx, f, fmt.Sprintf("offline backup of %s on %s at %s", db, host, time.Now().UTC().Format(time.RFC3339))); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return st.Close()
}

// checkBackup opens the copy read-only: a truncated or damaged copy is an
// error now, not at the restore.
func checkBackup(path string) error {
	st, err := store.Open(path, &store.Options{ReadOnly: true})
	if err != nil {
		return err
	}
	defer st.Close()
	return st.View(func(tx *store.Tx) error {
		if id, ok := tx.Identity(); !ok || id.Backup == "" {
			return errors.New("the copy carries no backup mark")
		}
		return nil
	})
}
