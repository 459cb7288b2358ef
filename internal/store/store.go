// Package store keeps edge-agent's durable state in one bbolt file: the
// inbox, device records (last_fence), op records, the outbox (docs/design.md,
// storage sketch). Every write goes through a group commit: one goroutine
// runs all the updates that are waiting in one bbolt transaction and one
// fsync, so many devices share a commit while a lone device never waits for
// a timer.
//
// Layout (format 2). What a commit costs on disk is the number of B+tree
// pages it dirties, so the buckets a command touches on every step are keyed
// by arrival sequence, and the records of the commands under way sit
// together in the rightmost leaves whatever their devices:
//
//	ops     seq (8 bytes, big endian) -> op record (JSON)
//	opidx   device "/" op_id          -> seq (written once, on admission)
//	inbox   seq                       -> {worker, device, op_id}
//	outbox  seq (its own)             -> Result to publish
//	opdev   device "/" seq            -> nil (each device's records in arrival order: history.go)
//	devices device                    -> device record (last_fence, state)
//	meta    "format"                  -> "2"
//
// An op record's seq is the seq of its inbox entry (Op.InboxSeq).
package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edge-agent/edge-agent/internal/failpoint"
	bolterrors "go.etcd.io/bbolt/errors"
)

var (
	bucketDevices = []byte("devices")
	bucketOps     = []byte("ops")
	bucketOpIndex = []byte("opidx")
	bucketInbox   = []byte("inbox")
	bucketOutbox  = []byte("outbox")
	bucketMeta    = []byte("meta")

	keyFormat = []byte("format")
)

// Format is the version of the file layout this package reads and writes.
const Format = "2"

// Options configure a Store. A nil *Options means all defaults.
type Options struct {
	// OpenTimeout bounds the wait for the file lock held by another
	// process. Zero means 1s.
	OpenTimeout time.Duration
	// ReadOnly opens the file for inspection (shared lock, no writes).
	ReadOnly bool
	// MaxBatch is the most updates committed in one transaction. Zero
	// means 4096.
	MaxBatch int
	// Logger receives the store's log lines. Nil means slog.Default().
	Logger *slog.Logger
	// ObserveCommit, when set, is called after each durable commit with
	// the number of updates it held (0 for one that only carried Later's)
	// and the time it took, fsync included: for metrics. It runs on the
	// commit goroutine and must not block. Nil means none.
	ObserveCommit func(updates int, took time.Duration)
}

// Store is the open bbolt file plus its group-commit loop.
type Store struct {
	db   *bolt.DB
	opts Options
	log  *slog.Logger

	reqs chan *request
	quit chan struct{}
	done chan struct{}

	sendMu    sync.RWMutex // held (read) while enqueueing; Close takes it to fence out senders
	mu        sync.Mutex
	closed    bool
	started   bool
	failed    error
	failedCh  chan struct{}
	closeOnce sync.Once

	commits    uint64        // batches committed, for metrics and benchmarks
	updates    uint64        // updates committed
	commitTime time.Duration // time spent in committed transactions

	sweepFrom uint64 // where the next Sweep resumes (commit goroutine only)
	idx       *opIndex

	later      []func(*Tx) error // Later's updates, for the next commit (under mu)
	committing bool              // a commit is between its start and its counting (under mu)
	laterDone  bool              // Close's final commit has taken them: Later drops (under mu)
	laterWake  chan struct{}     // Later queued the first of them
}

// LaterWithin is how long an update queued with Later waits at most for a
// commit to ride along with before it gets one of its own.
const LaterWithin = time.Second

// Stats are the group commit's counters.
type Stats struct {
	Commits    uint64        // batches committed (one fsync each)
	Updates    uint64        // updates in them
	CommitTime time.Duration // total time in bbolt's Update, fsync included
	Pages      int64         // pages bbolt wrote (its TxStats.Write)
}

// Stats returns the group commit's counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Commits: s.commits, Updates: s.updates, CommitTime: s.commitTime, Pages: s.pages()}
}

type request struct {
	fn   func(*Tx) error
	done chan error
}

// Open opens (creating if needed) the store at path. It takes the file lock,
// so a second process gets ErrLocked within opts.OpenTimeout. Call Start
// before Update.
func Open(path string, opts *Options) (*Store, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.OpenTimeout == 0 {
		o.OpenTimeout = time.Second
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = 4096
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:        o.OpenTimeout,
		ReadOnly:       o.ReadOnly,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("open %s: %w", path, ErrLocked)
		}
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	s := &Store{db: db, opts: o, log: o.Logger,
		reqs: make(chan *request, 4*o.MaxBatch), quit: make(chan struct{}),
		done: make(chan struct{}), failedCh: make(chan struct{}), idx: newOpIndex(),
		laterWake: make(chan struct{}, 1)}
	check := func(tx *bolt.Tx) error {
		if m := tx.Bucket(bucketMeta); m != nil {
			switch f := m.Get(keyFormat); {
			case f == nil && tx.Bucket(bucketOpIndex) == nil && tx.Bucket(bucketOps) != nil:
				return fmt.Errorf("%w: %s was written by an earlier development build (format 1); move it aside to start with an empty store", ErrFormat, path)
			case f != nil && string(f) != Format:
				return fmt.Errorf("%w: %s has format %q, this edge-agent reads format %q", ErrFormat, path, f, Format)
			}
		}
		return nil
	}
	if o.ReadOnly {
		err = db.View(check)
	} else {
		err = db.Update(func(tx *bolt.Tx) error {
			if err := check(tx); err != nil {
				return err
			}
			for _, b := range [][]byte{bucketDevices, bucketOps, bucketOpIndex, bucketInbox, bucketOutbox, bucketMeta} {
				if _, err := tx.CreateBucketIfNotExists(b); err != nil {
					return err
				}
			}
			if err := fillOpDev(tx); err != nil {
				return err
			}
			return tx.Bucket(bucketMeta).Put(keyFormat, []byte(Format))
		})
	}
	if err == nil {
		err = db.View(s.idx.load)
	}
	if err != nil {
		db.Close()
		if errors.Is(err, ErrFormat) {
			return nil, err
		}
		return nil, fmt.Errorf("store: init %s: %w", path, err)
	}
	return s, nil
}

// Start runs the group-commit loop until Close.
func (s *Store) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.closed {
		return
	}
	s.started = true
	go s.loop()
}

// Failed is closed when a commit has failed; Err then says why.
func (s *Store) Failed() <-chan struct{} { return s.failedCh }

// Err returns the commit failure that stopped the store, or nil.
func (s *Store) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// Commits returns how many batches have been committed.
func (s *Store) Commits() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.commits
}

// Waiting returns how many updates are enqueued and not yet taken into a
// commit (for tests that must see an update wait behind a slow commit).
func (s *Store) Waiting() int { return len(s.reqs) }

// Quiet reports whether nothing waits for a commit and none is under way:
// no update enqueued, none queued by Later, no commit between its start
// and its counting (for tests that must see that something caused no
// commit at all).
func (s *Store) Quiet() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs) == 0 && len(s.later) == 0 && !s.committing
}

// Update runs fn in the next group commit and returns once that commit is
// durable (fsynced), or failed. fn must not block, and should return an
// error only for a real failure: any error aborts the whole batch, fails
// the store, and is returned to every update in the batch. ctx only bounds
// the wait to enqueue; once enqueued, the update's fate is the batch's.
func (s *Store) Update(ctx context.Context, fn func(*Tx) error) error {
	return <-s.Submit(ctx, fn)
}

// Submit enqueues fn for the next group commit without waiting; the channel
// receives the commit's result.
func (s *Store) Submit(ctx context.Context, fn func(*Tx) error) <-chan error {
	r := &request{fn: fn, done: make(chan error, 1)}
	s.mu.Lock()
	switch {
	case s.failed != nil:
		r.done <- ErrFailed
	case s.closed:
		r.done <- ErrClosed
	case !s.started:
		r.done <- errors.New("store: Update before Start")
	}
	s.mu.Unlock()
	if len(r.done) > 0 {
		return r.done
	}
	s.sendMu.RLock()
	defer s.sendMu.RUnlock()
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		r.done <- ErrClosed
		return r.done
	}
	select {
	case s.reqs <- r:
	case <-s.failedCh:
		r.done <- ErrFailed
	case <-s.quit:
		r.done <- ErrClosed
	case <-ctx.Done():
		r.done <- ctx.Err()
	}
	return r.done
}

// Later queues fn for the next commit without causing one: it rides along
// with the next batch of updates, or is committed on its own after
// LaterWithin, or in Close's final commit. Nothing waits for it, so it is
// for writes a crash may lose: a lost one must only make the agent repeat
// work that is safe to repeat (the deletion of a published Result: the
// Result is published again). An error from fn fails the commit and the
// store, as from an Update. After a failure, or once Close's final commit
// has begun, fn is dropped.
func (s *Store) Later(fn func(*Tx) error) {
	s.mu.Lock()
	if s.failed != nil || s.closed || s.laterDone {
		s.mu.Unlock()
		return
	}
	s.later = append(s.later, fn)
	first := len(s.later) == 1
	s.mu.Unlock()
	if first {
		select {
		case s.laterWake <- struct{}{}:
		default:
		}
	}
}

// takeLater returns the updates queued by Later, and forgets them; final
// (Close's last commit) makes Later drop any that come after.
func (s *Store) takeLater(final bool) []func(*Tx) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.later
	s.later = nil
	s.laterDone = s.laterDone || final
	s.committing = s.committing || len(l) > 0 // no moment looks quiet before the commit
	return l
}

// View runs fn in a read-only transaction.
func (s *Store) View(fn func(*Tx) error) error {
	r := s.idx.enter()
	defer s.idx.leave(r)
	return s.db.View(func(btx *bolt.Tx) error { return fn(&Tx{tx: btx, s: s}) })
}

func (s *Store) loop() {
	defer close(s.done)
	batch := make([]*request, 0, s.opts.MaxBatch)
	var laterC <-chan time.Time // armed while Later's updates wait for a commit
	for {
		var r *request
		select {
		case r = <-s.reqs:
		case <-s.laterWake:
			if laterC == nil {
				laterC = time.After(LaterWithin)
			}
			continue
		case <-laterC:
			laterC = nil
			if err := s.commit(nil); err != nil {
				s.fail(err, nil)
				return
			}
			continue
		case <-s.quit:
			s.drain(ErrClosed)
			// Later's updates are committed, not dropped: a clean stop
			// leaves nothing to repeat. A failure here is Close's error.
			if err := s.commitFinal(); err != nil {
				s.markFailed(err)
			}
			return
		}
		s.mu.Lock()
		s.committing = true // taken off the queue: no moment looks quiet before the commit
		s.mu.Unlock()
		batch = append(batch[:0], r)
	fill:
		for len(batch) < s.opts.MaxBatch {
			select {
			case r = <-s.reqs:
				batch = append(batch, r)
			default:
				break fill
			}
		}
		if err := s.commit(batch); err != nil {
			s.fail(err, batch)
			return
		}
		laterC = nil // the commit took Later's updates along
		for _, r := range batch {
			r.done <- nil
		}
	}
}

// fail records a failed commit, answers the updates of its batch, and
// keeps answering ErrFailed until Close, so no Submit can hang.
func (s *Store) fail(err error, batch []*request) {
	s.markFailed(err)
	for _, r := range batch {
		r.done <- fmt.Errorf("%w: %v", ErrFailed, err)
	}
	for {
		select {
		case r := <-s.reqs:
			r.done <- ErrFailed
		case <-s.quit:
			s.drain(ErrFailed)
			return
		}
	}
}

// markFailed records the commit failure that stops the store; Later's
// queued updates are dropped with it.
func (s *Store) markFailed(err error) {
	s.mu.Lock()
	s.failed = err
	s.later = nil
	s.mu.Unlock()
	// Logged before Failed is closed: whoever acts on it (the process
	// exits 1 at once) must not lose the line that says why.
	s.log.Error("store: commit failed; stopping (invariant 5: nothing more is sent, published or acknowledged)", "err", err)
	close(s.failedCh)
}

func (s *Store) drain(err error) {
	for {
		select {
		case r := <-s.reqs:
			r.done <- err
		default:
			return
		}
	}
}

func (s *Store) commit(batch []*request) error {
	return s.commitWith(batch, s.takeLater(false))
}

// commitFinal commits what Later queued, at Close.
func (s *Store) commitFinal() error {
	return s.commitWith(nil, s.takeLater(true))
}

func (s *Store) commitWith(batch []*request, later []func(*Tx) error) error {
	var hooks []func()
	var txid uint64
	defer func() {
		s.mu.Lock()
		s.committing = false
		s.mu.Unlock()
	}()
	if len(batch) == 0 && len(later) == 0 {
		return nil
	}
	flush := s.idx.due()
	start := time.Now()
	err := s.db.Update(func(btx *bolt.Tx) error {
		txid = uint64(btx.ID())
		tx := &Tx{tx: btx, s: s, write: true}
		for _, r := range batch {
			if err := r.fn(tx); err != nil {
				return err
			}
		}
		for _, fn := range later {
			if err := fn(tx); err != nil {
				return err
			}
		}
		if flush {
			if err := s.idx.flush(btx); err != nil {
				return err
			}
		}
		// Fault injection (failpoints builds only): a failed or slow
		// commit, as a disk would have.
		if err := failpoint.Err(failpoint.Commit); err != nil {
			return err
		}
		hooks = tx.hooks
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: commit of %d updates: %w", len(batch), err)
	}
	s.idx.committed(txid, flush)
	took := time.Since(start)
	s.mu.Lock()
	s.commits++
	s.updates += uint64(len(batch))
	s.commitTime += took
	s.mu.Unlock()
	if s.opts.ObserveCommit != nil {
		s.opts.ObserveCommit(len(batch), took)
	}
	for _, h := range hooks {
		h()
	}
	return nil
}

// finalErr is the failure of Close's final commit, if that is what failed
// the store (a failure while running was reported then, and the loop
// never reaches the final commit after one).
func (s *Store) finalErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.laterDone && s.failed != nil {
		return fmt.Errorf("%w: %v", ErrFailed, s.failed)
	}
	return nil
}

// Close stops the commit loop (waiting updates get ErrClosed), commits
// what Later queued, and closes the file. It returns the failure of that
// final commit, else the file's close error. It is idempotent.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.mu.Lock()
		started := s.started
		s.mu.Unlock()
		close(s.quit)
		if started {
			<-s.done
		}
		// Senders see quit and return; once they are out, nothing new enters.
		s.sendMu.Lock()
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		s.sendMu.Unlock()
		s.drain(ErrClosed)
		final := s.finalErr()
		err = errors.Join(final, s.db.Close())
	})
	return err
}

// pages is how many pages bbolt has written.
func (s *Store) pages() int64 {
	st := s.db.Stats()
	return st.TxStats.GetWrite()
}
