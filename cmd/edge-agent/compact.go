package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	bolt "go.etcd.io/bbolt"

	"github.com/edge-agent/edge-agent/internal/store"
)

// compactTxMax bounds one transaction of the copy (bolt.Compact commits
// every so many bytes), so a large store is copied in bounded memory.
const compactTxMax = 64 << 20

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
	keys, err := copyCompacted(st.DB(), tmp, fi.Mode().Perm())
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

// copyCompacted writes src's live records into a new bbolt file at path,
// fsyncs it, checks it against src, and returns how many keys it holds.
func copyCompacted(src *bolt.DB, path string, mode os.FileMode) (int, error) {
	// The copy is synced once at the end, not at every intermediate commit:
	// it is not the store until the rename.
	dst, err := bolt.Open(path, mode, &bolt.Options{Timeout: time.Second, NoSync: true,
		NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return 0, err
	}
	closed := false
	defer func() {
		if !closed {
			dst.Close()
		}
	}()
	if err := bolt.Compact(dst, src, compactTxMax); err != nil {
		return 0, fmt.Errorf("copying: %w", err)
	}
	if err := dst.Sync(); err != nil {
		return 0, fmt.Errorf("fsync of the copy: %w", err)
	}
	var keys int
	err = dst.View(func(dtx *bolt.Tx) error {
		for cerr := range dtx.Check() {
			return fmt.Errorf("the copy fails bbolt's consistency check: %w", cerr)
		}
		return src.View(func(stx *bolt.Tx) error {
			return stx.ForEach(func(name []byte, sb *bolt.Bucket) error {
				db := dtx.Bucket(name)
				if db == nil {
					return fmt.Errorf("the copy lacks bucket %q", name)
				}
				sn, dn := sb.Stats().KeyN, db.Stats().KeyN
				if sn != dn || sb.Sequence() != db.Sequence() {
					return fmt.Errorf("bucket %q: %d keys (sequence %d) in the store, %d (sequence %d) in the copy",
						name, sn, sb.Sequence(), dn, db.Sequence())
				}
				keys += dn
				return nil
			})
		})
	})
	if err != nil {
		return 0, err
	}
	closed = true
	return keys, dst.Close()
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
