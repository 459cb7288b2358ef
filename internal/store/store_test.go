package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/failpoint"
	"github.com/edge-agent/edge-agent/internal/testkit"

	bolt "go.etcd.io/bbolt"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// openTest opens a real bbolt file in a temp dir and checks its integrity
// when the test ends.
func openTest(t testing.TB, o *Options) *Store {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.db")
	s, err := Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() {
		s.Close()
		checkIntegrity(t, path)
	})
	return s
}

func checkIntegrity(t testing.TB, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Errorf("integrity: open: %v", err)
		return
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	})
	if err != nil {
		t.Errorf("integrity check of %s: %v", path, err)
	}
}

func finalOp(dev, op string, at time.Time) Op {
	return Op{Device: dev, OpID: op, Status: OpFinal, Result: wire.StatusApplied, Code: wire.CodeOK,
		Fence: 1, Action: "set", DecidedAt: at, ReceivedAt: at}
}

func TestGroupCommitSharesCommitsAcrossDevices(t *testing.T) {
	s := openTest(t, nil)
	const devices, per = 64, 20
	var wg sync.WaitGroup
	errs := make(chan error, devices*per)
	for d := 0; d < devices; d++ {
		wg.Add(1)
		go func(d int) {
			defer wg.Done()
			dev := fmt.Sprintf("dev-%d", d)
			for i := 1; i <= per; i++ {
				err := s.Update(context.Background(), func(tx *Tx) error {
					dv, _, err := tx.Device(dev)
					if err != nil {
						return err
					}
					dv.LastFence = int64(i)
					if err := tx.PutDevice(dev, dv); err != nil {
						return err
					}
					return tx.PutOp(finalOp(dev, fmt.Sprintf("op-%d", i), time.Now()))
				})
				if err != nil {
					errs <- err
				}
			}
		}(d)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	err := s.View(func(tx *Tx) error {
		for d := 0; d < devices; d++ {
			dv, ok, err := tx.Device(fmt.Sprintf("dev-%d", d))
			if err != nil || !ok || dv.LastFence != per || dv.Finals != per {
				return fmt.Errorf("dev-%d: %+v ok=%v err=%v", d, dv, ok, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if c := s.Commits(); c >= devices*per {
		t.Fatalf("%d commits for %d updates: nothing was batched", c, devices*per)
	}
	t.Logf("%d updates in %d commits", devices*per, s.Commits())
}

func TestLastFenceNeverMovesBack(t *testing.T) {
	s := openTest(t, nil)
	put := func(f int64) error {
		return s.Update(context.Background(), func(tx *Tx) error { return tx.PutDevice("p", Device{LastFence: f}) })
	}
	if err := put(42); err != nil {
		t.Fatal(err)
	}
	// A transaction that would lower it aborts, and that fails the store.
	if err := put(41); err == nil || !errors.Is(err, ErrFailed) {
		t.Fatalf("lowering last_fence: got %v, want ErrFailed", err)
	}
	select {
	case <-s.Failed():
	default:
		t.Fatal("store not marked failed")
	}
	if err := put(43); !errors.Is(err, ErrFailed) {
		t.Fatalf("update after a failure: got %v, want ErrFailed", err)
	}
	s.View(func(tx *Tx) error {
		d, _, _ := tx.Device("p")
		if d.LastFence != 42 {
			t.Fatalf("last_fence = %d, want 42", d.LastFence)
		}
		return nil
	})
}

func TestInjectedCommitFailureStopsTheStore(t *testing.T) {
	var n int
	failCommits(t, func() error {
		n++
		if n == 2 {
			return errors.New("disk on fire")
		}
		return nil
	})
	s := openTest(t, nil)
	ctx := context.Background()
	if err := s.Update(ctx, func(tx *Tx) error { return tx.PutDevice("a", Device{LastFence: 1}) }); err != nil {
		t.Fatal(err)
	}
	err := s.Update(ctx, func(tx *Tx) error { return tx.PutDevice("a", Device{LastFence: 2}) })
	if !errors.Is(err, ErrFailed) {
		t.Fatalf("got %v, want ErrFailed", err)
	}
	if s.Err() == nil {
		t.Fatal("Err() is nil after a failed commit")
	}
	if err := s.Update(ctx, func(tx *Tx) error { return nil }); !errors.Is(err, ErrFailed) {
		t.Fatalf("got %v, want ErrFailed", err)
	}
	s.View(func(tx *Tx) error {
		d, _, _ := tx.Device("a")
		if d.LastFence != 1 {
			t.Fatalf("the failed commit's write is visible: last_fence %d", d.LastFence)
		}
		return nil
	})
}

func TestSecondOpenIsLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.db")
	s, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	start := time.Now()
	_, err = Open(path, &Options{ReadOnly: true, OpenTimeout: 300 * time.Millisecond})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("got %v, want ErrLocked", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestInboxAndOutboxOrder(t *testing.T) {
	s := openTest(t, nil)
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		if err := s.Update(ctx, func(tx *Tx) error {
			if _, err := tx.InboxAppend("d:p", "p", fmt.Sprintf("op-%d", i)); err != nil {
				return err
			}
			_, err := tx.OutboxAppend(Outbox{Topic: "t", Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Update(ctx, func(tx *Tx) error { return tx.InboxDelete("d:p", 1) }); err != nil {
		t.Fatal(err)
	}
	var in []string
	var out []uint64
	s.View(func(tx *Tx) error {
		tx.Inbox(func(e InboxEntry) error { in = append(in, e.OpID); return nil })
		return tx.Outbox(func(e Outbox) error { out = append(out, e.Seq); return nil })
	})
	if fmt.Sprint(in) != "[op-1 op-2 op-3 op-4]" || fmt.Sprint(out) != "[1 2 3 4 5]" {
		t.Fatalf("inbox %v outbox %v", in, out)
	}
}

func TestRetention(t *testing.T) {
	s := openTest(t, nil)
	ctx := context.Background()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// Device p: 10 final records a day apart, one queued, one unknown and
	// one final whose Result is still in the outbox.
	err := s.Update(ctx, func(tx *Tx) error {
		for i := 0; i < 10; i++ {
			if err := tx.PutOp(finalOp("p", fmt.Sprintf("f%d", i), base.Add(time.Duration(i)*24*time.Hour))); err != nil {
				return err
			}
		}
		if err := tx.PutOp(Op{Device: "p", OpID: "q", Status: OpQueued, ReceivedAt: base}); err != nil {
			return err
		}
		if err := tx.PutOp(Op{Device: "p", OpID: "u", Status: OpUnknown, ReceivedAt: base, DecidedAt: base}); err != nil {
			return err
		}
		if err := tx.PutOp(finalOp("p", "unpub", base)); err != nil {
			return err
		}
		_, err := tx.OutboxAppend(Outbox{Topic: "t", Device: "p", OpID: "unpub"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := func() map[string]bool {
		m := map[string]bool{}
		s.View(func(tx *Tx) error { return tx.Ops("p", func(o Op) error { m[o.OpID] = true; return nil }) })
		return m
	}
	sweep := func(now time.Time, keep uint64) int {
		var n int
		if err := s.Update(ctx, func(tx *Tx) error {
			var err error
			n, err = tx.Sweep(now, 7*24*time.Hour, keep, 1000)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// At day 12 with keep_last 3: f0..f4 are older than 7 days; none of
	// them is among the last 3 (f7,f8,f9 and unpub are the newest finals).
	if n := sweep(base.Add(12*24*time.Hour), 3); n != 5 {
		t.Fatalf("deleted %d, want 5 (f0..f4)", n)
	}
	got := ids()
	for _, want := range []string{"f5", "f6", "f7", "f8", "f9", "q", "u", "unpub"} {
		if !got[want] {
			t.Errorf("%s was deleted", want)
		}
	}
	for _, gone := range []string{"f0", "f4"} {
		if got[gone] {
			t.Errorf("%s was kept", gone)
		}
	}
	// A wall-clock jump of ten years: everything is "old", but the last 3
	// finals survive, and so do queued, unknown and unpublished records.
	sweep(base.Add(10*365*24*time.Hour), 3)
	got = ids()
	for _, want := range []string{"f8", "f9", "q", "u", "unpub"} {
		if !got[want] {
			t.Errorf("after a clock jump, %s was deleted", want)
		}
	}
	if got["f5"] || got["f6"] {
		t.Errorf("after a clock jump, old records beyond the last 3 were kept: %v", got)
	}
	// Once published, the old final record may go.
	var seq uint64
	s.View(func(tx *Tx) error { return tx.Outbox(func(e Outbox) error { seq = e.Seq; return nil }) })
	if err := s.Update(ctx, func(tx *Tx) error { return tx.OutboxDelete(seq) }); err != nil {
		t.Fatal(err)
	}
	sweep(base.Add(10*365*24*time.Hour), 0)
	if got := ids(); got["unpub"] || got["f9"] || !got["q"] || !got["u"] {
		t.Errorf("keep_last 0 after publishing: %v, want only q and u", got)
	}
}

// The (device, op_id) index is written to disk lazily: entries not yet
// flushed when the process stops are rebuilt from the op records on Open,
// and a flush leaves a complete index on disk.
func TestOpIndexSurvivesRestart(t *testing.T) {
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
	put := func(s *Store, from, to int) {
		if err := s.Update(ctx, func(tx *Tx) error {
			for i := from; i < to; i++ {
				if err := tx.PutOp(finalOp(fmt.Sprintf("d%d", i%7), fmt.Sprintf("op-%d", i), time.Now())); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	onDisk := func(s *Store) (n int) {
		s.db.View(func(tx *bolt.Tx) error { n = tx.Bucket(bucketOpIndex).Stats().KeyN; return nil })
		return n
	}
	s := open()
	put(s, 0, flushEntries+10) // enough to make the next commit flush
	if n := onDisk(s); n != 0 {
		t.Fatalf("%d index entries on disk before a flush", n)
	}
	put(s, flushEntries+10, flushEntries+20)
	if n := onDisk(s); n != flushEntries+20 {
		t.Fatalf("%d index entries on disk after the flush, want %d", n, flushEntries+20)
	}
	put(s, flushEntries+20, flushEntries+30) // not flushed: only in memory
	s.Close()
	s = open()
	defer s.Close()
	if n := onDisk(s); n != flushEntries+20 {
		t.Fatalf("%d index entries on disk after restart, want %d", n, flushEntries+20)
	}
	for _, i := range []int{0, flushEntries + 19, flushEntries + 25, flushEntries + 29} {
		dev, op := fmt.Sprintf("d%d", i%7), fmt.Sprintf("op-%d", i)
		s.View(func(tx *Tx) error {
			o, ok, err := tx.Op(dev, op)
			if err != nil || !ok || o.OpID != op || o.Device != dev {
				t.Errorf("after restart, %s/%s: %+v %v %v", dev, op, o, ok, err)
			}
			return nil
		})
	}
	// A record deleted after its entry was flushed is gone from the index
	// too, on disk and in memory.
	if err := s.Update(ctx, func(tx *Tx) error { return tx.DeleteOp("d0", "op-0") }); err != nil {
		t.Fatal(err)
	}
	s.View(func(tx *Tx) error {
		if _, ok, _ := tx.Op("d0", "op-0"); ok {
			t.Error("deleted op still found")
		}
		n := 0
		tx.Ops("d0", func(Op) error { n++; return nil })
		if want := (flushEntries+30)/7 + 1 - 1; n != want {
			t.Errorf("d0 has %d ops, want %d", n, want)
		}
		return nil
	})
}

// A reader whose snapshot predates a flush still finds the entries the
// flush moved to disk: they stay in memory until it ends.
func TestOpIndexReaderAcrossFlush(t *testing.T) {
	s := openTest(t, nil)
	ctx := context.Background()
	// bbolt cannot grow its memory map while a reader is open (the writer
	// would wait for the reader, which waits for the writer): grow the file
	// first, as a long-running store has.
	if err := s.db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("scratch"))
		if err != nil {
			return err
		}
		for i := 0; i < 2048; i++ {
			if err := b.Put(u64(uint64(i)), make([]byte, 4000)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket([]byte("scratch")) }); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(ctx, func(tx *Tx) error {
		for i := 0; i < flushEntries; i++ {
			if err := tx.PutOp(finalOp("d", fmt.Sprintf("op-%d", i), time.Now())); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	inView, release := make(chan struct{}), make(chan struct{})
	found := make(chan bool)
	go s.View(func(tx *Tx) error {
		close(inView)
		<-release
		_, ok, _ := tx.Op("d", "op-7")
		found <- ok
		return nil
	})
	<-inView
	// This commit flushes the index (the pending entries reached the limit).
	if err := s.Update(ctx, func(tx *Tx) error { return tx.PutOp(finalOp("d", "later", time.Now())) }); err != nil {
		t.Fatal(err)
	}
	var flushed int
	s.db.View(func(tx *bolt.Tx) error { flushed = tx.Bucket(bucketOpIndex).Stats().KeyN; return nil })
	if flushed < flushEntries {
		t.Fatalf("the flush did not happen: %d entries on disk", flushed)
	}
	close(release)
	if !<-found {
		t.Error("a reader from before the flush lost op-7")
	}
}

// Records that must be kept (a quiet device's last keep_last) do not stop
// the sweep from reaching deletable records behind them: each sweep
// resumes where the previous one stopped (it looks at 16*max records).
func TestSweepResumesPastKeptRecords(t *testing.T) {
	s := openTest(t, nil)
	ctx := context.Background()
	old := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := s.Update(ctx, func(tx *Tx) error {
		for i := 0; i < 40; i++ { // kept: q has only these 40
			if err := tx.PutOp(finalOp("q", fmt.Sprintf("q%d", i), old)); err != nil {
				return err
			}
		}
		for i := 0; i < 50; i++ { // p's first 10 may go
			if err := tx.PutOp(finalOp("p", fmt.Sprintf("p%d", i), old)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	now := old.Add(30 * 24 * time.Hour)
	total := 0
	for sweeps := 0; sweeps < 20 && total < 10; sweeps++ {
		if err := s.Update(ctx, func(tx *Tx) error {
			n, err := tx.Sweep(now, 7*24*time.Hour, 40, 2) // 32 records looked at per sweep
			total += n
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if total != 10 {
		t.Fatalf("deleted %d records in 20 sweeps, want p's 10 oldest", total)
	}
	s.View(func(tx *Tx) error {
		for _, gone := range []string{"p0", "p9"} {
			if _, ok, _ := tx.Op("p", gone); ok {
				t.Errorf("%s kept", gone)
			}
		}
		for _, kept := range []string{"p10", "q0", "q39"} {
			dev := kept[:1]
			if _, ok, _ := tx.Op(dev, kept); !ok {
				t.Errorf("%s deleted", kept)
			}
		}
		return nil
	})
}

// PutOpDevice writes the caller's device record once, with the final
// record's place in the device's history (Finals, FinalSeq), as PutDevice
// followed by PutOp did.
func TestPutOpDeviceCountsFinals(t *testing.T) {
	s := openTest(t, nil)
	for i, op := range []string{"a", "b"} {
		err := s.Update(context.Background(), func(tx *Tx) error {
			d, _, err := tx.Device("p")
			if err != nil {
				return err
			}
			d.LastFence, d.LastOpID = int64(5+i), op
			return tx.PutOpDevice(finalOp("p", op, time.Now()), d)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	s.View(func(tx *Tx) error {
		d, _, _ := tx.Device("p")
		a, _, _ := tx.Op("p", "a")
		b, _, _ := tx.Op("p", "b")
		if d.Finals != 2 || a.FinalSeq != 1 || b.FinalSeq != 2 || d.LastFence != 6 || d.LastOpID != "b" {
			t.Errorf("device %+v, FinalSeq a=%d b=%d", d, a.FinalSeq, b.FinalSeq)
		}
		return nil
	})
}

// TestLaterRidesAlongWithTheNextCommit: an update queued with Later makes
// no commit of its own while others come, is in the next commit, is
// committed on its own after LaterWithin when nothing else comes, and is
// committed at Close.
func TestLaterRidesAlongWithTheNextCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.db")
	s, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	ctx := context.Background()
	put := func(dev string, fence int64) func(*Tx) error {
		return func(tx *Tx) error { return tx.PutDevice(dev, Device{LastFence: fence}) }
	}
	fence := func(s *Store, dev string) int64 {
		var f int64
		s.View(func(tx *Tx) error { d, _, _ := tx.Device(dev); f = d.LastFence; return nil })
		return f
	}

	// Along with the next Update: one commit for both.
	before := s.Commits()
	s.Later(put("later", 1))
	if err := s.Update(ctx, put("now", 1)); err != nil {
		t.Fatal(err)
	}
	if c := s.Commits() - before; c != 1 {
		t.Fatalf("%d commits for an Update and a Later, want 1", c)
	}
	if f := fence(s, "later"); f != 1 {
		t.Fatalf("the Later update is not in the Update's commit: last_fence %d", f)
	}

	// Alone: committed after LaterWithin, not before half of it.
	before = s.Commits()
	queued := time.Now()
	s.Later(put("later", 2))
	deadline := queued.Add(LaterWithin + 5*time.Second)
	for fence(s, "later") != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("a lone Later update was not committed within %v", LaterWithin+5*time.Second)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if waited := time.Since(queued); waited < LaterWithin/2 {
		t.Fatalf("a lone Later update was committed after %v, want about %v", waited, LaterWithin)
	}
	// The commit's data is visible a moment before the loop counts it.
	testkit.Eventually(t, 5*time.Second, "the commit counted", func() bool { return s.Commits()-before >= 1 })
	if c := s.Commits() - before; c != 1 {
		t.Fatalf("%d commits for a lone Later update, want 1", c)
	}

	// At Close: committed, so a clean stop leaves nothing to repeat.
	s.Later(put("later", 3))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkIntegrity(t, path)
	s2, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if f := fence(s2, "later"); f != 3 {
		t.Fatalf("after Close, the Later update is lost: last_fence %d, want 3", f)
	}
}

// TestLaterFailureFailsTheStore: a Later update's error fails its commit
// and the store, like an Update's (invariant 5).
func TestLaterFailureFailsTheStore(t *testing.T) {
	s := openTest(t, nil)
	s.Later(func(*Tx) error { return errors.New("boom") })
	err := s.Update(context.Background(), func(tx *Tx) error { return tx.PutDevice("a", Device{LastFence: 1}) })
	if !errors.Is(err, ErrFailed) || s.Err() == nil {
		t.Fatalf("Update along with a failing Later: %v (store: %v), want ErrFailed", err, s.Err())
	}
}

// TestCloseReportsAFailedFinalCommit: Close's final commit (Later's
// updates) failing is Close's error and the store's, never a clean stop
// (invariant 5); the update is not applied.
func TestCloseReportsAFailedFinalCommit(t *testing.T) {
	var arm atomic.Bool
	var injected atomic.Int64
	path := filepath.Join(t.TempDir(), "agent.db")
	failCommits(t, func() error {
		if arm.Load() {
			injected.Add(1)
			return errors.New("disk on fire at close")
		}
		return nil
	})
	s, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if err := s.Update(context.Background(), func(tx *Tx) error { return tx.PutDevice("a", Device{LastFence: 1}) }); err != nil {
		t.Fatal(err)
	}
	s.Later(func(tx *Tx) error { return tx.PutDevice("a", Device{LastFence: 2}) })
	arm.Store(true)
	err = s.Close()
	if injected.Load() == 0 {
		t.Fatal("the final commit was not attempted: no failure injected")
	}
	if !errors.Is(err, ErrFailed) || s.Err() == nil {
		t.Fatalf("Close() = %v, Err() = %v; want ErrFailed and the failure", err, s.Err())
	}
	checkIntegrity(t, path)
	s2, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	s2.View(func(tx *Tx) error {
		if d, _, _ := tx.Device("a"); d.LastFence != 1 {
			t.Errorf("the failed final commit's update is on disk: last_fence %d", d.LastFence)
		}
		return nil
	})
}

// TestLaterRacingCloseIsCommittedOrDropped: a Later racing Close is either
// in the final commit or dropped, never left queued for a commit that will
// not come.
func TestLaterRacingCloseIsCommittedOrDropped(t *testing.T) {
	for i := 0; i < 100; i++ {
		s, err := Open(filepath.Join(t.TempDir(), "agent.db"), nil)
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		stop := make(chan struct{})
		var calls atomic.Int64
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				calls.Add(1)
				s.Later(func(*Tx) error { return nil })
			}
		}()
		for calls.Load() < 10 {
			runtime.Gosched()
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		close(stop)
		<-done
		s.mu.Lock()
		left := len(s.later)
		s.mu.Unlock()
		if left > 0 {
			t.Fatalf("run %d: %d Later updates left queued after Close", i, left)
		}
	}
}

// failCommits makes every commit call f first, a non-nil error failing it
// as a disk would (the failpoint "commit"); the test is skipped in a build
// without failpoints (make test builds with them).
func failCommits(t *testing.T, f func() error) {
	t.Helper()
	restore, err := failpoint.SetFunc(failpoint.Commit, f)
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(restore)
}
