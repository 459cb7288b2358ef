package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Tx is one transaction: read-only inside View, read-write inside Update.
// Device and op IDs never contain '/', so '/' separates key parts.
type Tx struct {
	tx    *bolt.Tx
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

func getJSON(b *bolt.Bucket, k []byte, v any) (bool, error) {
	raw := b.Get(k)
	if raw == nil {
		return false, nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return true, fmt.Errorf("store: decode record %q: %w", k, err)
	}
	return true, nil
}

func putJSON(b *bolt.Bucket, k []byte, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("store: encode %s: %w", k, err)
	}
	return b.Put(k, raw)
}

// Device returns dev's record; ok is false when it has none yet.
func (t *Tx) Device(dev string) (d Device, ok bool, err error) {
	ok, err = getJSON(t.tx.Bucket(bucketDevices), []byte(dev), &d)
	return d, ok, err
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
	return putJSON(t.tx.Bucket(bucketDevices), []byte(dev), d)
}

// Devices calls fn for every device record in ID order.
func (t *Tx) Devices(fn func(dev string, d Device) error) error {
	return t.tx.Bucket(bucketDevices).ForEach(func(k, v []byte) error {
		var d Device
		if err := json.Unmarshal(v, &d); err != nil {
			return fmt.Errorf("store: decode devices/%s: %w", k, err)
		}
		return fn(string(k), d)
	})
}

// Op returns the record of (dev, op); ok is false when there is none.
func (t *Tx) Op(dev, op string) (o Op, ok bool, err error) {
	ok, err = getJSON(t.tx.Bucket(bucketOps), opKey(dev, op), &o)
	return o, ok, err
}

// PutOp writes an op record. A final record gets its place in its device's
// history (FinalSeq, bumping the device record's Finals) and in the expiry
// index the first time it is written final.
func (t *Tx) PutOp(o Op) error {
	if o.Status == OpFinal && o.FinalSeq == 0 {
		d, _, err := t.Device(o.Device)
		if err != nil {
			return err
		}
		d.Finals++
		o.FinalSeq = d.Finals
		if o.DecidedAt.IsZero() {
			return fmt.Errorf("store: op %s/%s: final without decided_at", o.Device, o.OpID)
		}
		if err := t.PutDevice(o.Device, d); err != nil {
			return err
		}
		if err := t.tx.Bucket(bucketExpiry).Put(expiryKey(o.DecidedAt, o.Device, o.OpID), nil); err != nil {
			return err
		}
	}
	return putJSON(t.tx.Bucket(bucketOps), opKey(o.Device, o.OpID), o)
}

// DeleteOp removes an op record (and its expiry entry, if final).
func (t *Tx) DeleteOp(dev, op string) error {
	o, ok, err := t.Op(dev, op)
	if err != nil || !ok {
		return err
	}
	if o.Status == OpFinal {
		if err := t.tx.Bucket(bucketExpiry).Delete(expiryKey(o.DecidedAt, dev, op)); err != nil {
			return err
		}
	}
	return t.tx.Bucket(bucketOps).Delete(opKey(dev, op))
}

// Ops calls fn for dev's op records (all devices when dev is ""), in key order.
func (t *Tx) Ops(dev string, fn func(o Op) error) error {
	c := t.tx.Bucket(bucketOps).Cursor()
	prefix := []byte(dev + "/")
	if dev == "" {
		prefix = nil
	}
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		var o Op
		if err := json.Unmarshal(v, &o); err != nil {
			return fmt.Errorf("store: decode ops/%s: %w", k, err)
		}
		if err := fn(o); err != nil {
			return err
		}
	}
	return nil
}

func expiryKey(at time.Time, dev, op string) []byte {
	ns := at.UnixNano()
	if ns < 0 {
		ns = 0
	}
	return append(u64(uint64(ns)), []byte(dev+"/"+op)...)
}

// InboxAppend appends (dev, op) to worker's inbox and returns its sequence.
func (t *Tx) InboxAppend(worker, dev, op string) (uint64, error) {
	b, err := t.tx.Bucket(bucketInbox).CreateBucketIfNotExists([]byte(worker))
	if err != nil {
		return 0, fmt.Errorf("store: inbox %s: %w", worker, err)
	}
	seq, err := b.NextSequence()
	if err != nil {
		return 0, err
	}
	return seq, putJSON(b, u64(seq), InboxEntry{Device: dev, OpID: op})
}

// InboxDelete removes one inbox entry.
func (t *Tx) InboxDelete(worker string, seq uint64) error {
	b := t.tx.Bucket(bucketInbox).Bucket([]byte(worker))
	if b == nil {
		return nil
	}
	return b.Delete(u64(seq))
}

// Inbox calls fn for every inbox entry of every worker, in arrival order
// within each worker.
func (t *Tx) Inbox(fn func(e InboxEntry) error) error {
	return t.tx.Bucket(bucketInbox).ForEachBucket(func(w []byte) error {
		return t.tx.Bucket(bucketInbox).Bucket(w).ForEach(func(k, v []byte) error {
			var e InboxEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("store: decode inbox/%s: %w", w, err)
			}
			e.Worker, e.Seq = string(w), binary.BigEndian.Uint64(k)
			return fn(e)
		})
	})
}

// OutboxAppend adds a Result to the outbox. While it is there, retention
// keeps its op record (Sweep looks the outbox up).
func (t *Tx) OutboxAppend(e Outbox) (Outbox, error) {
	b := t.tx.Bucket(bucketOutbox)
	seq, err := b.NextSequence()
	if err != nil {
		return e, err
	}
	e.Seq = seq
	return e, putJSON(b, u64(seq), e)
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
		if err := json.Unmarshal(v, &e); err != nil {
			return fmt.Errorf("store: decode outbox/%x: %w", k, err)
		}
		e.Seq = binary.BigEndian.Uint64(k)
		return fn(e)
	})
}

// Sweep deletes final op records decided before now-retention that are not
// among their device's keepLast most recent final records and have no
// Result left in the outbox, at most max of them. Queued, pending and
// unknown records are never deleted. Because the keepLast rule counts
// records, not time, a wall-clock jump cannot erase a device's recent
// history.
func (t *Tx) Sweep(now time.Time, retention time.Duration, keepLast uint64, max int) (int, error) {
	cutoff := expiryKey(now.Add(-retention), "", "")[:8]
	exp := t.tx.Bucket(bucketExpiry)
	c := exp.Cursor()
	var del [][]byte
	deleted := 0
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
	scanned := 0
	for k, _ := c.First(); k != nil && bytes.Compare(k[:8], cutoff) < 0 && deleted < max && scanned < 16*max; k, _ = c.Next() {
		scanned++
		rest := string(k[8:])
		i := bytes.IndexByte(k[8:], '/')
		if i < 0 {
			del = append(del, append([]byte(nil), k...))
			continue
		}
		dev, op := rest[:i], rest[i+1:]
		o, ok, err := t.Op(dev, op)
		if err != nil {
			return deleted, err
		}
		if !ok || o.Status != OpFinal {
			del = append(del, append([]byte(nil), k...))
			continue
		}
		n, seen := finals[dev]
		if !seen {
			d, _, err := t.Device(dev)
			if err != nil {
				return deleted, err
			}
			n, finals[dev] = d.Finals, d.Finals
		}
		if n-o.FinalSeq < keepLast || unpublished[dev+"/"+op] {
			continue
		}
		if err := t.tx.Bucket(bucketOps).Delete(opKey(dev, op)); err != nil {
			return deleted, err
		}
		del = append(del, append([]byte(nil), k...))
		deleted++
	}
	for _, k := range del {
		if err := exp.Delete(k); err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}
