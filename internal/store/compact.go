package store

import (
	"fmt"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
)

// compactTxMax bounds one transaction of the copy (bolt.Compact commits
// every so many bytes), so a large store is copied in bounded memory.
const compactTxMax = 64 << 20

// CompactTo writes the store's live records into a new file at path
// (bbolt's compaction: no free pages), fsyncs it, checks it with bbolt's
// consistency check and against the store (the same buckets, keys and
// sequences), and returns how many keys it holds. For `edge-agent
// compact`, on a store opened read-only (offline); the caller renames the
// copy over the store.
func (s *Store) CompactTo(path string, mode os.FileMode) (int, error) {
	src := s.db
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

// Check runs bbolt's consistency check over the whole file and returns
// the first problem it finds, or nil.
func (s *Store) Check() error {
	return s.db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	})
}
