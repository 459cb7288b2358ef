package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sort"

	bolt "go.etcd.io/bbolt"
)

// The history index: opdev "{device}/{seq}" (seq 8 bytes, big endian) -> nil.
// It lists each device's op records in arrival order, so a device's history
// is read newest first with a cursor, in time proportional to the page and
// not to the device's record count (History). It is derived from the op
// records like opidx and written with it, lazily (index.go's flush), so it
// adds no page to a command's commits; the entries not yet flushed are
// found in memory. A file written before this bucket existed gets it filled
// from opidx at Open.
var bucketOpDev = []byte("opdev")

// MaxHistory is the most records one History call returns.
const MaxHistory = 1000

func devSeqKey(dev string, seq uint64) []byte {
	k := make([]byte, 0, len(dev)+9)
	k = append(k, dev...)
	k = append(k, '/')
	return binary.BigEndian.AppendUint64(k, seq)
}

// fillOpDev creates opdev from opidx when the file has none (a file from a
// build before it).
func fillOpDev(btx *bolt.Tx) error {
	if btx.Bucket(bucketOpDev) != nil {
		return nil
	}
	b, err := btx.CreateBucket(bucketOpDev)
	if err != nil {
		return err
	}
	return btx.Bucket(bucketOpIndex).ForEach(func(k, v []byte) error {
		dev, _, ok := bytes.Cut(k, []byte("/"))
		if !ok || len(v) != 8 {
			return nil
		}
		return b.Put(devSeqKey(string(dev), binary.BigEndian.Uint64(v)), nil)
	})
}

// History returns up to limit of dev's op records that arrived before the
// record with sequence before (0: from the newest), newest first, and
// whether older ones remain (then the last record's InboxSeq is the next
// page's before). limit is capped at MaxHistory; below 1 it means 50.
//
// It reads only the page: a backwards cursor over the device's entries in
// opdev, merged with the entries still in memory. Inside View it reads a
// snapshot and never waits for the commit loop; keep the page small all the
// same, since bbolt cannot grow its memory map while a reader is open.
func (t *Tx) History(dev string, before uint64, limit int) (ops []Op, more bool, err error) {
	if limit < 1 {
		limit = 50
	}
	limit = min(limit, MaxHistory)
	if before == 0 {
		before = ^uint64(0)
	}
	// In memory: the entries not yet on disk (or flushed after this
	// reader's snapshot). Few: at most one flush's worth.
	var mem []uint64
	if t.s != nil {
		m := map[string]uint64{}
		t.s.idx.withPrefix(dev+"/", m)
		for _, seq := range m {
			if seq < before {
				mem = append(mem, seq)
			}
		}
		sort.Slice(mem, func(i, j int) bool { return mem[i] > mem[j] })
	}
	prefix := []byte(dev + "/")
	var c *bolt.Cursor
	if b := t.tx.Bucket(bucketOpDev); b != nil {
		c = b.Cursor()
	}
	// disk walks opdev backwards from before.
	var dk []byte
	if c != nil {
		k, _ := c.Seek(devSeqKey(dev, before))
		if k == nil {
			k, _ = c.Last()
		} else {
			k, _ = c.Prev()
		}
		dk = k
	}
	diskSeq := func() (uint64, bool) {
		if dk == nil || !bytes.HasPrefix(dk, prefix) || len(dk) != len(prefix)+8 {
			return 0, false
		}
		return binary.BigEndian.Uint64(dk[len(prefix):]), true
	}
	ops_ := t.tx.Bucket(bucketOps)
	var last uint64 = ^uint64(0)
	for {
		ds, dok := diskSeq()
		var seq uint64
		switch {
		case dok && (len(mem) == 0 || ds >= mem[0]):
			seq = ds
			if len(mem) > 0 && mem[0] == ds {
				mem = mem[1:]
			}
			dk, _ = c.Prev()
		case len(mem) > 0:
			seq, mem = mem[0], mem[1:]
		default:
			return ops, false, nil
		}
		if seq >= last {
			continue // seen (an entry both on disk and in memory)
		}
		last = seq
		raw := ops_.Get(u64(seq))
		if raw == nil {
			continue // deleted after the entry was read
		}
		var o Op
		if err := decodeOp(raw, &o); err != nil {
			return ops, false, fmt.Errorf("store: decode ops/%d: %w", seq, err)
		}
		if o.Device != dev {
			continue
		}
		o.InboxSeq = seq
		if len(ops) == limit {
			return ops, true, nil
		}
		ops = append(ops, o)
	}
}
