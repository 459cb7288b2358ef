package store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TakeFloor raises last_fence to the floor (never lowers it), clears the
// device's doubt, remembers the floor and leaves an audit entry in the
// device's history.
func TestTakeFloor(t *testing.T) {
	s := openTest(t, nil)
	ctx := context.Background()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	if err := s.Update(ctx, func(tx *Tx) error {
		if err := tx.PutDevice("pump-7", Device{LastFence: 42}); err != nil {
			return err
		}
		if err := tx.PutDoubt("pump-7", "new store"); err != nil {
			return err
		}
		return tx.PutDoubt("valve-1", "new store")
	}); err != nil {
		t.Fatal(err)
	}
	var got map[string]Device
	if err := s.Update(ctx, func(tx *Tx) error {
		got = map[string]Device{}
		for dev, floor := range map[string]int64{"pump-7": 100, "valve-1": 7} {
			d, o, err := tx.TakeFloor(dev, floor, "edge-agent", tx.Doubts()[dev], now)
			if err != nil {
				return err
			}
			if !o.Audit || o.Action != ActionFenceFloor || !strings.HasPrefix(o.OpID, "fence-floor:") {
				t.Errorf("audit record %+v", o)
			}
			got[dev] = d
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got["pump-7"].LastFence != 100 || got["valve-1"].LastFence != 7 {
		t.Fatalf("after the floor: %+v", got)
	}
	// A floor below last_fence leaves it: last_fence never moves back.
	if err := s.Update(ctx, func(tx *Tx) error {
		_, _, err := tx.TakeFloor("pump-7", 50, "edge-agent", "restored store", now)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	s.View(func(tx *Tx) error {
		d, _, _ := tx.Device("pump-7")
		if d.LastFence != 100 || tx.FloorOf("pump-7") != 50 || tx.FloorOf("valve-1") != 7 || len(tx.Doubts()) != 0 {
			t.Errorf("last_fence %d floor %d/%d doubts %v", d.LastFence, tx.FloorOf("pump-7"), tx.FloorOf("valve-1"), tx.Doubts())
		}
		h, _, err := tx.History("pump-7", 0, 10)
		if err != nil || len(h) != 2 || !strings.Contains(h[0].Reason, "restored store") || !strings.Contains(h[1].Reason, "new store") {
			t.Errorf("history %v %+v", err, h)
		}
		return nil
	})
}

// A backup carries the backup mark; the live store does not.
func TestBackupMarksTheCopyOnly(t *testing.T) {
	s := openTest(t, nil)
	ctx := context.Background()
	if err := s.Update(ctx, func(tx *Tx) error {
		if err := tx.PutIdentity(Identity{StoreID: "abc", Gateway: "gw-1", Epoch: 3}); err != nil {
			return err
		}
		return tx.PutDevice("pump-7", Device{LastFence: 42})
	}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := s.Backup(ctx, &buf, "backup at now"); err != nil {
		t.Fatal(err)
	}
	s.View(func(tx *Tx) error {
		if id, _ := tx.Identity(); id.Backup != "" || id.Epoch != 3 {
			t.Errorf("live store after a backup: %+v", id)
		}
		return nil
	})
	path := filepath.Join(t.TempDir(), "agent.db")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.View(func(tx *Tx) error {
		id, ok := tx.Identity()
		d, _, _ := tx.Device("pump-7")
		if !ok || id.StoreID != "abc" || id.Backup != "backup at now" || d.LastFence != 42 {
			t.Errorf("copy: %v %+v %+v", ok, id, d)
		}
		return nil
	})
}

// A file whose first pages are overwritten is refused with ErrCorrupt,
// naming the file and what to do, never a panic.
func TestCorruptStoreIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.db")
	s, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(bytes.Repeat([]byte{0xa5}, 16<<10), 0)
	f.Close()
	for _, ro := range []bool{false, true} {
		_, err = Open(path, &Options{ReadOnly: ro})
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "Move it aside") {
			t.Fatalf("read-only %v: %v", ro, err)
		}
	}
}

// A backup never waits on itself. A commit that needs the file mapped
// larger (bbolt remaps it) waits for every open read transaction to end;
// the backup's copy is one such transaction, so a commit queued between
// the backup's mark and its unmark that grows the file must not be what
// the backup waits for before the copy's transaction ends. (It was: the
// unmark commit waited behind the growing one, which waited for the
// copy's transaction, which waited for the unmark: the commit loop hung
// for good, and with it every command.)
func TestBackupWhileACommitGrowsTheFile(t *testing.T) {
	s := openTest(t, &Options{MaxBatch: 1})
	ctx := context.Background()
	gate := make(chan struct{})
	holding := make(chan struct{})
	blocked := s.Submit(ctx, func(*Tx) error { close(holding); <-gate; return nil }) // holds the commit loop
	<-holding
	// Closed when the growing commit has seen the copy's transaction open.
	sawCopy := make(chan struct{})
	backup := make(chan error, 1)
	go func() {
		_, err := s.Backup(ctx, gatedWriter{sawCopy}, "backup")
		backup <- err
	}()
	waitQueued := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for len(s.reqs) < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d updates queued, want %d", len(s.reqs), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitQueued(1) // the backup's mark
	// Queued behind the mark: a write too big for the file as mapped. It
	// commits once the copy's transaction is open (the copy is not
	// written before), so its growth waits for that transaction.
	grew := s.Submit(ctx, func(tx *Tx) error {
		deadline := time.Now().Add(10 * time.Second)
		for s.db.Stats().OpenTxN == 0 {
			if time.Now().After(deadline) {
				return errors.New("the copy's transaction never began")
			}
			time.Sleep(time.Millisecond)
		}
		close(sawCopy)
		return tx.PutDevice("big", Device{State: []byte(`{"pad":"` + strings.Repeat("x", 1<<20) + `"}`)})
	})
	waitQueued(2)
	close(gate)
	if err := <-blocked; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-backup:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the backup never finished: its unmark waits behind a commit that waits for the copy's transaction to end")
	}
	if err := <-grew; err != nil {
		t.Fatal(err)
	}
	s.View(func(tx *Tx) error {
		if id, _ := tx.Identity(); id.Backup != "" {
			t.Errorf("the live store keeps the backup mark: %+v", id)
		}
		return nil
	})
}

// gatedWriter discards what it is given once open is closed.
type gatedWriter struct{ open <-chan struct{} }

func (w gatedWriter) Write(p []byte) (int, error) {
	<-w.open
	return len(p), nil
}

// cancelWriter cancels its context at its first Write, as a client that
// goes away during a backup.
type cancelWriter struct{ cancel context.CancelFunc }

func (w cancelWriter) Write(p []byte) (int, error) {
	w.cancel()
	return len(p), nil
}

// A backup whose context ends while the copy is written (the client went
// away) still removes the mark from the live store: a mark left there
// would make the next start take a needless floor.
func TestBackupCancelledLeavesNoMark(t *testing.T) {
	s := openTest(t, nil)
	for i := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		s.Backup(ctx, cancelWriter{cancel}, "backup")
		s.View(func(tx *Tx) error {
			if b := tx.fenceMem().Get(keyBackup); b != nil {
				t.Fatalf("backup %d: the live store keeps the mark %q", i, b)
			}
			return nil
		})
	}
}

// Device.FloorSeq: the ops sequence when the last floor was taken, so an
// op queued before it has an InboxSeq at or below it and one queued after
// a higher one; it survives a reopen (it is in the fence memory's bucket).
func TestFloorSeqMarksWhatWasQueuedBefore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.db")
	s, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	ctx := context.Background()
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	var before, after uint64
	put := func(op string) (seq uint64) {
		if err := s.Update(ctx, func(tx *Tx) error {
			seq, err = tx.InboxAppend("w", "pump-7", op)
			if err != nil {
				return err
			}
			return tx.PutOp(Op{Device: "pump-7", OpID: op, Status: OpQueued, Fence: 5, Action: "set", InboxSeq: seq, ReceivedAt: now})
		}); err != nil {
			t.Fatal(err)
		}
		return seq
	}
	before = put("before")
	if err := s.Update(ctx, func(tx *Tx) error {
		if d, _, _ := tx.Device("pump-7"); d.FloorSeq != 0 {
			t.Errorf("FloorSeq %d before any floor", d.FloorSeq)
		}
		_, _, err := tx.TakeFloor("pump-7", 100, "edge-agent", "takeover", now)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	after = put("after")
	s.Close()
	s, err = Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.View(func(tx *Tx) error {
		d, _, _ := tx.Device("pump-7")
		if !(before <= d.FloorSeq && d.FloorSeq < after) {
			t.Errorf("FloorSeq %d: the op queued before the floor has seq %d, the one after %d", d.FloorSeq, before, after)
		}
		return nil
	})
}
