package store

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// pages reads dev's whole history with History, limit records a page, and
// returns the op IDs newest first.
func pages(t *testing.T, s *Store, dev string, limit int) []string {
	t.Helper()
	var ids []string
	var before uint64
	for n := 0; ; n++ {
		if n > 10000 {
			t.Fatal("History does not end")
		}
		var ops []Op
		var more bool
		if err := s.View(func(tx *Tx) error {
			var err error
			ops, more, err = tx.History(dev, before, limit)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if len(ops) > limit {
			t.Fatalf("page of %d records, limit %d", len(ops), limit)
		}
		for _, o := range ops {
			if o.Device != dev {
				t.Fatalf("History(%s) returned a record of %s", dev, o.Device)
			}
			ids = append(ids, o.OpID)
		}
		if !more {
			return ids
		}
		if len(ops) == 0 {
			t.Fatal("more with an empty page")
		}
		before = ops[len(ops)-1].InboxSeq
	}
}

// History pages a device's records newest first over a real bbolt file,
// whether their index entries are on disk (flushed), only in memory, or
// both; deleted records are left out; the index survives a restart and is
// built for a file that has none.
func TestHistoryPagesNewestFirst(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.db")
	ctx := context.Background()
	open := func() *Store {
		s, err := Open(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		return s
	}
	want := map[string][]string{} // newest first
	put := func(s *Store, from, to int) {
		if err := s.Update(ctx, func(tx *Tx) error {
			for i := from; i < to; i++ {
				dev, op := fmt.Sprintf("d%d", i%3), fmt.Sprintf("op-%d", i)
				if err := tx.PutOp(finalOp(dev, op, time.Now())); err != nil {
					return err
				}
				want[dev] = append([]string{op}, want[dev]...)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(s *Store, when string) {
		t.Helper()
		for _, dev := range []string{"d0", "d1", "d2"} {
			for _, limit := range []int{1, 7, 1000} {
				if got := pages(t, s, dev, limit); !slices.Equal(got, want[dev]) {
					t.Fatalf("%s: %s limit %d: %d records %v..., want %d %v...", when, dev, limit, len(got), head(got), len(want[dev]), head(want[dev]))
				}
			}
		}
		if got := pages(t, s, "nobody", 10); len(got) != 0 {
			t.Fatalf("%s: a device without records has history %v", when, got)
		}
	}
	s := open()
	put(s, 0, 40) // in memory only
	check(s, "in memory")
	put(s, 40, flushEntries+10)
	put(s, flushEntries+10, flushEntries+20) // this commit flushes
	var onDisk int
	s.db.View(func(tx *bolt.Tx) error { onDisk = tx.Bucket(bucketOpDev).Stats().KeyN; return nil })
	if onDisk != flushEntries+20 {
		t.Fatalf("%d history entries on disk after a flush, want %d", onDisk, flushEntries+20)
	}
	put(s, flushEntries+20, flushEntries+50) // on disk and in memory
	check(s, "on disk and in memory")

	// Deleted records (flushed and not) leave the history.
	del := []int{3, 300, flushEntries + 30}
	if err := s.Update(ctx, func(tx *Tx) error {
		for _, i := range del {
			if err := tx.DeleteOp(fmt.Sprintf("d%d", i%3), fmt.Sprintf("op-%d", i)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, i := range del {
		dev := fmt.Sprintf("d%d", i%3)
		want[dev] = slices.DeleteFunc(want[dev], func(op string) bool { return op == fmt.Sprintf("op-%d", i) })
	}
	check(s, "after deletes")
	s.Close()

	s = open()
	check(s, "after a restart")
	s.Close()

	// A file from before the history index: Open builds it from opidx.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketOpDev) }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s = open()
	defer func() {
		s.Close()
		checkIntegrity(t, path)
	}()
	check(s, "with the index rebuilt")
}

func head(s []string) []string { return s[:min(len(s), 5)] }
