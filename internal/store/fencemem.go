package store

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// What the store knows of its own memory (docs/design.md, invariant 7):
//
//	fencemem "store_id"     -> random id, written when the store is first used
//	fencemem "gateway"      -> the gateway_id that last ran on it
//	fencemem "epoch"        -> uint64, raised at each start that checks in with etcd
//	fencemem "backup"       -> set only in a copy made by Backup: when, from what
//	fencemem "doubt/{dev}"  -> why dev's memory may be incomplete, until its floor is taken
//	fencemem "floor/{dev}"  -> the last fence floor taken for dev
var (
	bucketFenceMem = []byte("fencemem")

	keyStoreID = []byte("store_id")
	keyGateway = []byte("gateway")
	keyEpoch   = []byte("epoch")
	keyBackup  = []byte("backup")
)

// ActionFenceFloor is the action of the audit record TakeFloor writes.
const ActionFenceFloor = "fence_floor"

// Identity is what the store says about itself.
type Identity struct {
	StoreID string `json:"store_id"`
	Gateway string `json:"gateway,omitempty"`
	Epoch   uint64 `json:"epoch"`
	// Backup is set in a copy made by Store.Backup (and so in a store
	// restored from one) until the agent has taken note of it.
	Backup string `json:"backup,omitempty"`
}

// NewStoreID returns a random store id.
func NewStoreID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (t *Tx) fenceMem() *bolt.Bucket { return t.tx.Bucket(bucketFenceMem) }

// Identity returns the store's identity; ok is false when it has none (a
// new store, or one written before identities existed).
func (t *Tx) Identity() (id Identity, ok bool) {
	b := t.fenceMem()
	if b == nil || b.Get(keyStoreID) == nil {
		return id, false
	}
	id.StoreID = string(b.Get(keyStoreID))
	id.Gateway = string(b.Get(keyGateway))
	if v := b.Get(keyEpoch); len(v) == 8 {
		id.Epoch = binary.BigEndian.Uint64(v)
	}
	id.Backup = string(b.Get(keyBackup))
	return id, true
}

// PutIdentity writes the store's identity (an empty Backup removes the
// backup mark).
func (t *Tx) PutIdentity(id Identity) error {
	b := t.fenceMem()
	if err := b.Put(keyStoreID, []byte(id.StoreID)); err != nil {
		return err
	}
	if err := b.Put(keyGateway, []byte(id.Gateway)); err != nil {
		return err
	}
	if err := b.Put(keyEpoch, u64(id.Epoch)); err != nil {
		return err
	}
	if id.Backup == "" {
		return b.Delete(keyBackup)
	}
	return b.Put(keyBackup, []byte(id.Backup))
}

// Doubts returns every device whose memory may be incomplete and why:
// recorded by PutDoubt, cleared by TakeFloor.
func (t *Tx) Doubts() map[string]string {
	out := map[string]string{}
	b := t.fenceMem()
	if b == nil {
		return out
	}
	c := b.Cursor()
	for k, v := c.Seek([]byte("doubt/")); k != nil && strings.HasPrefix(string(k), "doubt/"); k, v = c.Next() {
		out[strings.TrimPrefix(string(k), "doubt/")] = string(v)
	}
	return out
}

// PutDoubt records that dev's memory may be incomplete, and why, so that a
// restart before its floor is taken still knows (the cause, such as a new
// store, is gone by then).
func (t *Tx) PutDoubt(dev, reason string) error {
	return t.fenceMem().Put([]byte("doubt/"+dev), []byte(reason))
}

// floorSeqOf is Device.FloorSeq.
func (t *Tx) floorSeqOf(dev string) uint64 {
	b := t.fenceMem()
	if b == nil {
		return 0
	}
	if v := b.Get([]byte("floorseq/" + dev)); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// FloorOf returns the last fence floor taken for dev, 0 if none.
func (t *Tx) FloorOf(dev string) int64 {
	b := t.fenceMem()
	if b == nil {
		return 0
	}
	if v := b.Get([]byte("floor/" + dev)); len(v) == 8 {
		return int64(binary.BigEndian.Uint64(v))
	}
	return 0
}

// HighestFence returns the highest last_fence of any device record and
// its device ("" when the store has none).
func (t *Tx) HighestFence() (dev string, fence int64, err error) {
	err = t.Devices(func(id string, d Device) error {
		if d.LastFence > fence {
			dev, fence = id, d.LastFence
		}
		return nil
	})
	return dev, fence, err
}

// StoredDevices returns the IDs of every device the store has a record of.
func (t *Tx) StoredDevices() ([]string, error) {
	var out []string
	err := t.tx.Bucket(bucketDevices).ForEach(func(k, _ []byte) error {
		out = append(out, string(k))
		return nil
	})
	sort.Strings(out)
	return out, err
}

// TakeFloor raises dev's last_fence to max(last_fence, floor) and records
// the act in the device's history, in the caller's transaction: an audit
// record with op_id "fence-floor:{floor}:{time}", action ActionFenceFloor,
// status final (applied/ok), fence floor, holder by, params {"from", "to",
// "floor", "reason"}. It clears dev's doubt and remembers the floor
// (FloorOf). A device without a record gets one. Invariant 7: every
// command with a fence below the floor is stale from this commit on.
func (t *Tx) TakeFloor(dev string, floor int64, by, reason string, now time.Time) (Device, Op, error) {
	d, _, err := t.Device(dev)
	if err != nil {
		return d, Op{}, err
	}
	now = now.UTC()
	// Every op queued so far was queued before this floor (Device.FloorSeq):
	// the audit record below takes the next sequence.
	queued := t.tx.Bucket(bucketOps).Sequence()
	from := d.LastFence
	d.LastFence = max(d.LastFence, floor)
	d.UpdatedAt = now
	params, _ := json.Marshal(map[string]any{"from": from, "to": d.LastFence, "floor": floor, "reason": reason})
	o := Op{Device: dev, OpID: fmt.Sprintf("fence-floor:%d:%s", floor, now.Format("2006-01-02T15:04:05.000000000Z")),
		Status: OpFinal, Result: wire.StatusApplied, Code: wire.CodeOK,
		Reason: fmt.Sprintf("fence floor %d taken (%s): last_fence %d -> %d; every older generation is stale", floor, reason, from, d.LastFence),
		Fence:  floor, Action: ActionFenceFloor, Params: params, Holder: by, Audit: true,
		ReceivedAt: now, DecidedAt: now}
	if err := t.PutOpDevice(o, d); err != nil {
		return d, Op{}, err
	}
	b := t.fenceMem()
	if err := b.Put([]byte("floor/"+dev), u64(uint64(floor))); err != nil {
		return d, Op{}, err
	}
	if err := b.Put([]byte("floorseq/"+dev), u64(queued)); err != nil {
		return d, Op{}, err
	}
	if err := b.Delete([]byte("doubt/" + dev)); err != nil {
		return d, Op{}, err
	}
	d, _, err = t.Device(dev)
	return d, o, err
}

var backupMu sync.Mutex

// Backup writes a consistent copy of the store to w (bbolt's WriteTo of
// one read transaction) and returns its size. The copy carries a backup
// mark (Identity.Backup = note) that the live store does not: the mark is
// committed, the copy's transaction begins, and once the copy is written
// the mark is removed again, so a start on a restored copy knows it may
// have forgotten fences (invariant 7). A crash before that leaves the mark in the live store too: the next start then
// takes the floor once more, which costs a new lock generation, never a
// stale write. Backups run one at a time.
func (s *Store) Backup(ctx context.Context, w io.Writer, note string) (int64, error) {
	backupMu.Lock()
	defer backupMu.Unlock()
	mark := func(ctx context.Context, set bool) error {
		return s.Update(ctx, func(tx *Tx) error {
			if set {
				return tx.fenceMem().Put(keyBackup, []byte(note))
			}
			return tx.fenceMem().Delete(keyBackup)
		})
	}
	if err := mark(ctx, true); err != nil {
		return 0, err
	}
	btx, err := s.db.Begin(false)
	if err != nil {
		return 0, fmt.Errorf("store: backup: %w", err)
	}
	n, err := btx.WriteTo(w)
	// The copy's transaction ends before the unmark is committed: a
	// commit that grows the file waits for every open read transaction,
	// so the unmark, queued behind such a commit, would wait for ever.
	btx.Rollback()
	// Not cancelled with ctx (a client gone mid-copy): a mark left in the
	// live store costs a needless floor at the next start.
	unmark := mark(context.WithoutCancel(ctx), false)
	if err != nil {
		return n, fmt.Errorf("store: backup: %w", err)
	}
	return n, unmark
}
