package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The (device, op_id) -> seq index is written lazily. Every admission would
// otherwise dirty one opidx leaf per device (the index is sorted by device,
// so the devices of one commit sit in different leaves), which made the
// index the largest part of a commit at 64 devices. New entries are kept in
// memory and written to opidx together, at most every flushEvery or every
// flushEntries entries, in the same transaction as a batch of updates; meta
// "idx_upto" then says that every op record up to that seq is indexed on
// disk. Open reads the records after it back into memory, so a crash loses
// no entry: the op records are the truth, the index is derived from them.
const (
	flushEntries = 4096
	flushEvery   = time.Second
)

var keyIndexUpTo = []byte("idx_upto")

// opIndex holds the index entries not yet on disk, and the ones written by a
// recent flush that a reader with an older snapshot may still need.
type opIndex struct {
	mu        sync.Mutex
	pending   map[string]uint64 // not yet on disk (commit goroutine writes)
	gens      []indexGen        // flushed, kept while an older reader may look
	readers   map[uint64]int    // open View transactions by (lower bound of) their snapshot
	lastTx    uint64            // the last committed write transaction
	lastFlush time.Time
}

type indexGen struct {
	tx uint64 // the write transaction that put these entries on disk
	m  map[string]uint64
}

func newOpIndex() *opIndex {
	return &opIndex{pending: map[string]uint64{}, readers: map[uint64]int{}, lastFlush: time.Now()}
}

// lookup returns key's seq from memory; ok is false when memory does not
// know it and the opidx bucket must be asked.
func (x *opIndex) lookup(key string) (uint64, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if seq, ok := x.pending[key]; ok {
		return seq, true
	}
	for i := len(x.gens) - 1; i >= 0; i-- {
		if seq, ok := x.gens[i].m[key]; ok {
			return seq, true
		}
	}
	return 0, false
}

// withPrefix adds to m the entries in memory whose key starts with prefix.
func (x *opIndex) withPrefix(prefix string, m map[string]uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, g := range x.gens {
		for k, seq := range g.m {
			if strings.HasPrefix(k, prefix) {
				m[k] = seq
			}
		}
	}
	for k, seq := range x.pending {
		if strings.HasPrefix(k, prefix) {
			m[k] = seq
		}
	}
}

func (x *opIndex) put(key string, seq uint64) {
	x.mu.Lock()
	x.pending[key] = seq
	x.mu.Unlock()
}

// forget drops key from memory where it still maps to seq (its record is
// being deleted).
func (x *opIndex) forget(key string, seq uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.pending[key] == seq {
		delete(x.pending, key)
	}
	for _, g := range x.gens {
		if g.m[key] == seq {
			delete(g.m, key)
		}
	}
}

// enter registers a reader about to take a snapshot: its snapshot is at
// least the last committed transaction, so entries flushed after that stay
// in memory until it leaves.
func (x *opIndex) enter() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.readers[x.lastTx]++
	return x.lastTx
}

func (x *opIndex) leave(tx uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.readers[tx]--; x.readers[tx] <= 0 {
		delete(x.readers, tx)
	}
	x.purge()
}

// purge drops flushed generations no open reader can need (mu held).
func (x *opIndex) purge() {
	oldest := x.lastTx
	for tx := range x.readers {
		oldest = min(oldest, tx)
	}
	n := 0
	for n < len(x.gens) && x.gens[n].tx <= oldest {
		n++
	}
	if n > 0 {
		x.gens = append(x.gens[:0], x.gens[n:]...)
	}
}

func (x *opIndex) due() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.pending) >= flushEntries || (len(x.pending) > 0 && time.Since(x.lastFlush) >= flushEvery)
}

// flush writes the pending entries to opidx in btx (the commit goroutine,
// after the batch's updates).
func (x *opIndex) flush(btx *bolt.Tx) error {
	type entry struct {
		key string
		seq uint64
	}
	x.mu.Lock()
	es := make([]entry, 0, len(x.pending))
	for k, seq := range x.pending {
		es = append(es, entry{k, seq})
	}
	x.mu.Unlock()
	// In key order: bbolt then walks each leaf once.
	sort.Slice(es, func(i, j int) bool { return es[i].key < es[j].key })
	b := btx.Bucket(bucketOpIndex)
	for _, e := range es {
		if err := b.Put([]byte(e.key), u64(e.seq)); err != nil {
			return err
		}
	}
	// The history index (history.go), in its own key order: each device's
	// new entries go after its older ones.
	hist := make([][]byte, 0, len(es))
	for _, e := range es {
		dev, _, _ := strings.Cut(e.key, "/")
		hist = append(hist, devSeqKey(dev, e.seq))
	}
	sort.Slice(hist, func(i, j int) bool { return bytes.Compare(hist[i], hist[j]) < 0 })
	hb := btx.Bucket(bucketOpDev)
	hb.FillPercent = 0.95
	for _, k := range hist {
		if err := hb.Put(k, nil); err != nil {
			return err
		}
	}
	return btx.Bucket(bucketMeta).Put(keyIndexUpTo, u64(btx.Bucket(bucketOps).Sequence()))
}

// committed records a durable commit; flushed says whether it wrote the
// pending entries.
func (x *opIndex) committed(tx uint64, flushed bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.lastTx = tx
	if flushed {
		x.gens = append(x.gens, indexGen{tx: tx, m: x.pending})
		x.pending = map[string]uint64{}
		x.lastFlush = time.Now()
	}
	x.purge()
}

// load reads the entries of the op records after meta idx_upto back into
// memory (at Open: what the last run had not flushed yet).
func (x *opIndex) load(btx *bolt.Tx) error {
	x.lastTx = uint64(btx.ID())
	ops := btx.Bucket(bucketOps)
	if ops == nil {
		return nil
	}
	var from uint64
	if v := btx.Bucket(bucketMeta).Get(keyIndexUpTo); len(v) == 8 {
		from = binary.BigEndian.Uint64(v)
	}
	c := ops.Cursor()
	for k, v := c.Seek(u64(from + 1)); k != nil; k, v = c.Next() {
		dev, op, err := decodeOpID(v)
		if err != nil {
			return fmt.Errorf("store: decode ops/%d: %w", binary.BigEndian.Uint64(k), err)
		}
		x.pending[string(opKey(dev, op))] = binary.BigEndian.Uint64(k)
	}
	return nil
}
