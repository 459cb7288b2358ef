package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/edge-agent/edge-agent/internal/store"
)

func compactCmd() *cobra.Command {
	var dataDir, to string
	c := &cobra.Command{
		Use:   "compact",
		Short: "Offline: rewrite the store without its free pages (bbolt never shrinks a file on its own)",
		Long: `Copies DATA_DIR/agent.db into a new file holding only live records
(bbolt's Compact), checks the copy, and replaces the store with it
atomically (rename). With --to FILE the copy is written there and the store
is left as it is. The agent must be stopped: while one holds the store this
exits 1 within 2 s. The new file keeps the old one's owner and mode.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dataDir == "" {
				return &exitError{2, errors.New("--data-dir is required")}
			}
			src := filepath.Join(dataDir, "agent.db")
			r, err := compactStore(src, to)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "compacted %s: %d -> %d bytes (%d keys) into %s in %s\n",
				src, r.before, r.after, r.keys, r.dst, r.took.Round(time.Millisecond))
			return nil
		},
	}
	c.Flags().StringVar(&dataDir, "data-dir", "", "the agent's data_dir (the store is DATA_DIR/agent.db)")
	c.Flags().StringVar(&to, "to", "", "write the compacted copy to this new file and leave the store as it is")
	return c
}

type compactResult struct {
	dst           string
	before, after int64
	keys          int
	took          time.Duration
}

// compactStore copies the store at src into a compacted file: to, or a
// temporary file beside src that then replaces src. It holds the store's
// exclusive lock throughout, so no agent can open the store meanwhile, and
// verifies the copy (bbolt's consistency check, the same keys and bucket
// sequences in every bucket) before it is renamed into place.
func compactStore(src, to string) (r compactResult, err error) {
	start := time.Now()
	fi, err := os.Stat(src)
	if err != nil {
		return r, fmt.Errorf("compact: %w", err)
	}
	final := src
	if to != "" {
		if _, err := os.Stat(to); err == nil {
			return r, fmt.Errorf("compact: --to %s exists; give a new file", to)
		}
		final = to
	}
	// The store's own Open: the exclusive file lock (ErrLocked while an
	// agent runs) and the format check. Start is never called, so nothing
	// but Open's own bucket check is written.
	st, err := store.Open(src, &store.Options{OpenTimeout: 1500 * time.Millisecond})
	if err != nil {
		if errors.Is(err, store.ErrLocked) {
			return r, fmt.Errorf("compact %s: %w; stop the agent first", src, err)
		}
		return r, fmt.Errorf("compact %s: %w", src, err)
	}
	defer func() { err = errors.Join(err, st.Close()) }()

	tmp := final + ".compacting"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return r, fmt.Errorf("compact: removing a leftover %s: %w", tmp, err)
	}
	keys, err := st.CompactTo(tmp, fi.Mode().Perm())
	if err != nil {
		os.Remove(tmp)
		return r, fmt.Errorf("compact %s: %w", src, err)
	}
	// A root-run compact must leave a file the service user can open.
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		if err := os.Lchown(tmp, int(sys.Uid), int(sys.Gid)); err != nil && os.Geteuid() == 0 {
			os.Remove(tmp)
			return r, fmt.Errorf("compact: keeping %s's owner: %w", src, err)
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		os.Remove(tmp)
		return r, fmt.Errorf("compact: %w", err)
	}
	if err := syncDir(filepath.Dir(final)); err != nil {
		return r, fmt.Errorf("compact: %w", err)
	}
	nfi, err := os.Stat(final)
	if err != nil {
		return r, fmt.Errorf("compact: %w", err)
	}
	return compactResult{dst: final, before: fi.Size(), after: nfi.Size(), keys: keys, took: time.Since(start)}, nil
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
