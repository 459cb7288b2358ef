package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Tx is one transaction: read-only inside View, read-write inside Update.
// Device and op IDs never contain '/', so '/' separates key parts.
type Tx struct {
	tx    *bolt.Tx
	s     *Store
	write bool
	hooks []func()
}

// OnCommit registers fn to run after the transaction's batch is durable,
// in registration order, on the commit goroutine: fn must not block.
func (t *Tx) OnCommit(fn func()) { t.hooks = append(t.hooks, fn) }

func u64(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

func opKey(dev, op string) []byte { return []byte(dev + "/" + op) }

// Device returns dev's record; ok is false when it has none yet.
func (t *Tx) Device(dev string) (d Device, ok bool, err error) {
	raw := t.tx.Bucket(bucketDevices).Get([]byte(dev))
	if raw == nil {
		return d, false, nil
	}
	if err := decodeDevice(raw, &d); err != nil {
		return d, true, fmt.Errorf("store: decode devices/%s: %w", dev, err)
	}
	d.FloorSeq = t.floorSeqOf(dev)
	return d, true, nil
}

// PutDevice writes dev's record. last_fence never moves backwards
// (invariant 3): a lower LastFence than the stored one is an error.
func (t *Tx) PutDevice(dev string, d Device) error {
	old, ok, err := t.Device(dev)
	if err != nil {
		return err
	}
	if ok && d.LastFence < old.LastFence {
		return fmt.Errorf("store: device %s: last_fence would move back from %d to %d", dev, old.LastFence, d.LastFence)
	}
	return t.tx.Bucket(bucketDevices).Put([]byte(dev), encodeDevice(&d))
}

// Devices calls fn for every device record in ID order.
func (t *Tx) Devices(fn func(dev string, d Device) error) error {
	return t.tx.Bucket(bucketDevices).ForEach(func(k, v []byte) error {
		var d Device
		if err := decodeDevice(v, &d); err != nil {
			return fmt.Errorf("store: decode devices/%s: %w", k, err)
		}
		return fn(string(k), d)
	})
}

// opSeq returns the sequence of (dev, op)'s record, 0 when there is none.
func (t *Tx) opSeq(dev, op string) uint64 {
	if t.s != nil {
		if seq, ok := t.s.idx.lookup(string(opKey(dev, op))); ok {
			return seq
		}
	}
	v := t.tx.Bucket(bucketOpIndex).Get(opKey(dev, op))
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

// Op returns the record of (dev, op); ok is false when there is none.
//
// The index of recent entries is kept in memory and shared by every
// transaction (index.go), so inside View the lookup is as of now, not as of
// the reader's snapshot: a record that a later commit deleted (or replaced
// by a re-admission of the same op_id) may be missed by an older reader.
// Decisions are made inside Update, in the serial commit stream, where the
// lookup is exact.
func (t *Tx) Op(dev, op string) (o Op, ok bool, err error) {
	seq := t.opSeq(dev, op)
	if seq == 0 {
		return o, false, nil
	}
	raw := t.tx.Bucket(bucketOps).Get(u64(seq))
	if raw == nil {
		return o, false, nil
	}
	if err := decodeOp(raw, &o); err != nil {
		return o, true, fmt.Errorf("store: decode ops/%d (%s/%s): %w", seq, dev, op, err)
	}
	o.InboxSeq = seq
	return o, true, nil
}

// PutOp writes an op record. A new record takes the next sequence of the
// ops bucket unless o.InboxSeq already holds one (from InboxAppend). A
// final record gets its place in its device's history (FinalSeq, bumping
// the device record's Finals) the first time it is written final.
func (t *Tx) PutOp(o Op) error {
	if o.Status == OpFinal && o.FinalSeq == 0 {
		d, _, err := t.Device(o.Device)
		if err != nil {
			return err
		}
		return t.PutOpDevice(o, d)
	}
	return t.putOp(o)
}

// PutOpDevice writes o, as PutOp, and d as o's device record, as
// PutDevice: for a caller that changes both in one step (an outcome), so
// the device record is read and written once.
func (t *Tx) PutOpDevice(o Op, d Device) error {
	if o.Status == OpFinal && o.FinalSeq == 0 {
		if o.DecidedAt.IsZero() {
			return fmt.Errorf("store: op %s/%s: final without decided_at", o.Device, o.OpID)
		}
		d.Finals++
		o.FinalSeq = d.Finals
	}
	if err := t.PutDevice(o.Device, d); err != nil {
		return err
	}
	return t.putOp(o)
}

func (t *Tx) putOp(o Op) error {
	ops := t.tx.Bucket(bucketOps)
	// Records are appended in arrival order and rewritten in place while
	// their command is under way: full leaves, not bbolt's half-full
	// default for random inserts.
	ops.FillPercent = 0.95
	if seq := t.opSeq(o.Device, o.OpID); seq != 0 {
		o.InboxSeq = seq
	} else {
		if o.InboxSeq == 0 {
			seq, err := ops.NextSequence()
			if err != nil {
				return err
			}
			o.InboxSeq = seq
		}
		t.s.idx.put(string(opKey(o.Device, o.OpID)), o.InboxSeq)
	}
	return ops.Put(u64(o.InboxSeq), encodeOp(&o))
}

// DeleteOp removes an op record.
func (t *Tx) DeleteOp(dev, op string) error {
	seq := t.opSeq(dev, op)
	if seq == 0 {
		return nil
	}
	return t.deleteOp(dev, op, seq)
}

// deleteOp removes the record seq of (dev, op) and its index entry.
func (t *Tx) deleteOp(dev, op string, seq uint64) error {
	t.s.idx.forget(string(opKey(dev, op)), seq)
	if err := t.tx.Bucket(bucketOpIndex).Delete(opKey(dev, op)); err != nil {
		return err
	}
	if err := t.tx.Bucket(bucketOpDev).Delete(devSeqKey(dev, seq)); err != nil {
		return err
	}
	return t.tx.Bucket(bucketOps).Delete(u64(seq))
}

// Ops calls fn for dev's op records in arrival order (all devices' records
// when dev is "").
func (t *Tx) Ops(dev string, fn func(o Op) error) error {
	ops := t.tx.Bucket(bucketOps)
	each := func(k, v []byte) error {
		var o Op
		if err := decodeOp(v, &o); err != nil {
			return fmt.Errorf("store: decode ops/%d: %w", binary.BigEndian.Uint64(k), err)
		}
		o.InboxSeq = binary.BigEndian.Uint64(k)
		return fn(o)
	}
	if dev == "" {
		return ops.ForEach(each)
	}
	idx := map[string]uint64{}
	c := t.tx.Bucket(bucketOpIndex).Cursor()
	prefix := []byte(dev + "/")
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		idx[string(k)] = binary.BigEndian.Uint64(v)
	}
	if t.s != nil {
		t.s.idx.withPrefix(string(prefix), idx)
	}
	seqs := make([][]byte, 0, len(idx))
	for _, seq := range idx {
		seqs = append(seqs, u64(seq))
	}
	sort.Slice(seqs, func(i, j int) bool { return bytes.Compare(seqs[i], seqs[j]) < 0 })
	for _, k := range seqs {
		if v := ops.Get(k); v != nil {
			if err := each(k, v); err != nil {
				return err
			}
		}
	}
	return nil
}

// InboxAppend appends (dev, op) to worker's inbox and returns its sequence,
// which is also the sequence the op's record takes (PutOp with InboxSeq).
func (t *Tx) InboxAppend(worker, dev, op string) (uint64, error) {
	seq, err := t.tx.Bucket(bucketOps).NextSequence()
	if err != nil {
		return 0, err
	}
	in := t.tx.Bucket(bucketInbox)
	in.FillPercent = 0.95
	return seq, in.Put(u64(seq), encodeInbox(&InboxEntry{Worker: worker, Device: dev, OpID: op}))
}

// InboxDelete removes one inbox entry.
func (t *Tx) InboxDelete(worker string, seq uint64) error {
	return t.tx.Bucket(bucketInbox).Delete(u64(seq))
}

// Inbox calls fn for every inbox entry in arrival order (so in arrival
// order within each worker).
func (t *Tx) Inbox(fn func(e InboxEntry) error) error {
	return t.tx.Bucket(bucketInbox).ForEach(func(k, v []byte) error {
		var e InboxEntry
		if err := decodeInbox(v, &e); err != nil {
			return fmt.Errorf("store: decode inbox/%d: %w", binary.BigEndian.Uint64(k), err)
		}
		e.Seq = binary.BigEndian.Uint64(k)
		return fn(e)
	})
}

// OutboxAppend adds a Result to the outbox. While it is there, retention
// keeps its op record (Sweep looks the outbox up).
func (t *Tx) OutboxAppend(e Outbox) (Outbox, error) {
	b := t.tx.Bucket(bucketOutbox)
	b.FillPercent = 0.95
	seq, err := b.NextSequence()
	if err != nil {
		return e, err
	}
	e.Seq = seq
	return e, b.Put(u64(seq), encodeOutbox(&e))
}

// OutboxDelete removes a published Result from the outbox.
func (t *Tx) OutboxDelete(seq uint64) error {
	return t.tx.Bucket(bucketOutbox).Delete(u64(seq))
}

// OutboxHolds reports whether a Result of (dev, op) is still in the outbox.
func (t *Tx) OutboxHolds(dev, op string) (bool, error) {
	found := false
	err := t.Outbox(func(e Outbox) error {
		found = found || (e.Device == dev && e.OpID == op)
		return nil
	})
	return found, err
}

// Outbox calls fn for every outbox entry, oldest first.
func (t *Tx) Outbox(fn func(e Outbox) error) error {
	return t.tx.Bucket(bucketOutbox).ForEach(func(k, v []byte) error {
		var e Outbox
		if err := decodeOutbox(v, &e); err != nil {
			return fmt.Errorf("store: decode outbox/%d: %w", binary.BigEndian.Uint64(k), err)
		}
		e.Seq = binary.BigEndian.Uint64(k)
		return fn(e)
	})
}

// Sweep deletes final op records decided before now-retention that are not
// among their device's keepLast most recent final records and have no
// Result left in the outbox, at most max of them, looking at no more than
// 16*max records. Queued, pending and unknown records are never deleted.
// Because the keepLast rule counts records, not time, a wall-clock jump
// cannot erase a device's recent history. The scan walks the records in
// arrival order from where the previous sweep stopped, so records it must
// keep do not stop it from reaching the deletable ones behind them; it
// starts again from the oldest record once it reaches one received after
// the cutoff.
func (t *Tx) Sweep(now time.Time, retention time.Duration, keepLast uint64, max int) (int, error) {
	cutoff := now.Add(-retention)
	ops := t.tx.Bucket(bucketOps)
	c := ops.Cursor()
	var del []Op
	finals := map[string]uint64{}
	// Records whose Result is still in the outbox are kept. The outbox is
	// short (Results leave it as soon as the broker takes them), so one
	// pass over it is cheaper than a counter on every record.
	unpublished := map[string]bool{}
	if err := t.Outbox(func(e Outbox) error {
		if e.OpID != "" {
			unpublished[e.Device+"/"+e.OpID] = true
		}
		return nil
	}); err != nil {
		return 0, err
	}
	var k, v []byte
	if t.s != nil && t.s.sweepFrom > 0 {
		k, v = c.Seek(u64(t.s.sweepFrom))
	} else {
		k, v = c.First()
	}
	var next uint64 // where the next sweep resumes; 0: from the oldest
	for scanned := 0; k != nil; k, v = c.Next() {
		if scanned++; scanned > 16*max || len(del) >= max {
			next = binary.BigEndian.Uint64(k)
			break
		}
		var o Op
		if err := decodeOp(v, &o); err != nil {
			return 0, fmt.Errorf("store: decode ops/%d: %w", binary.BigEndian.Uint64(k), err)
		}
		o.InboxSeq = binary.BigEndian.Uint64(k)
		if !o.ReceivedAt.Before(cutoff) && !o.ReceivedAt.After(now) {
			// Received after the cutoff (and not stamped in the future by
			// a clock that has since gone back): so is everything after
			// it, but for clock steps; start from the oldest next time.
			break
		}
		if o.Status != OpFinal || !o.DecidedAt.Before(cutoff) || o.Audit {
			continue
		}
		n, seen := finals[o.Device]
		if !seen {
			d, _, err := t.Device(o.Device)
			if err != nil {
				return 0, err
			}
			n, finals[o.Device] = d.Finals, d.Finals
		}
		if n-o.FinalSeq < keepLast || unpublished[o.Device+"/"+o.OpID] {
			continue
		}
		del = append(del, o)
	}
	for _, o := range del {
		if err := t.deleteOp(o.Device, o.OpID, o.InboxSeq); err != nil {
			return 0, err
		}
	}
	if t.s != nil {
		t.s.sweepFrom = next
	}
	return len(del), nil
}
