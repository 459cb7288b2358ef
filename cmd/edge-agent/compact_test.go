package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/store"
)

// compactFixture writes a store of 20,000 final op records over 4 devices
// and deletes 19,000 of them (as retention would), leaving a file full of
// free pages. It returns the store's path and what the store holds.
func compactFixture(t *testing.T) (string, storeContent) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.db")
	st, err := store.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	st.Start()
	ctx := context.Background()
	now := time.Now().UTC()
	pad := strings.Repeat("x", 400)
	const n, keep = 20000, 1000
	for b := 0; b < n; b += 1000 {
		err := st.Update(ctx, func(tx *store.Tx) error {
			for i := b; i < b+1000; i++ {
				dev := fmt.Sprintf("pump-%d", i%4)
				d, _, err := tx.Device(dev)
				if err != nil {
					return err
				}
				d.LastFence, d.LastOpID, d.UpdatedAt = int64(i), fmt.Sprintf("op-%d", i), now
				o := store.Op{Device: dev, OpID: fmt.Sprintf("op-%d", i), Status: store.OpFinal,
					Result: wire.StatusApplied, Code: wire.CodeOK, Fence: int64(i), Action: "set",
					Params:     json.RawMessage(fmt.Sprintf(`{"rpm":%d,"pad":%q}`, i, pad)),
					ReceivedAt: now, DecidedAt: now, ContentHash: []byte{1, 2, 3}}
				if err := tx.PutOpDevice(o, d); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for b := 0; b < n-keep; b += 1000 {
		err := st.Update(ctx, func(tx *store.Tx) error {
			for i := b; i < b+1000; i++ {
				if err := tx.DeleteOp(fmt.Sprintf("pump-%d", i%4), fmt.Sprintf("op-%d", i)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	c := readStore(t, path)
	if len(c.ops) != keep || len(c.devices) != 4 {
		t.Fatalf("fixture holds %d ops and %d devices, want %d and 4", len(c.ops), len(c.devices), keep)
	}
	return path, c
}

// storeContent is every op record and device record of a store.
type storeContent struct {
	ops     []store.Op
	devices map[string]store.Device
}

// readStore reads a store through the store package (its own decoding,
// index and format check), and runs bbolt's consistency check on it.
func readStore(t *testing.T, path string) storeContent {
	t.Helper()
	st, err := store.Open(path, &store.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("opening %s: %v", path, err)
	}
	defer st.Close()
	c := storeContent{devices: map[string]store.Device{}}
	err = st.View(func(tx *store.Tx) error {
		if err := tx.Devices(func(id string, d store.Device) error {
			c.devices[id] = d
			return nil
		}); err != nil {
			return err
		}
		return tx.Ops("", func(o store.Op) error {
			c.ops = append(c.ops, o)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	// Every kept op is found through the (device, op_id) index too.
	err = st.View(func(tx *store.Tx) error {
		for _, o := range c.ops {
			got, ok, err := tx.Op(o.Device, o.OpID)
			if err != nil || !ok || got.Fence != o.Fence {
				return fmt.Errorf("op %s/%s by index: %v %v %+v", o.Device, o.OpID, ok, err, got)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Check(); err != nil {
		t.Fatalf("%s fails bbolt's check: %v", path, err)
	}
	return c
}

func size(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// compact replaces the store with a smaller file holding the same records.
func TestCompactShrinksAndKeepsTheRecords(t *testing.T) {
	path, want := compactFixture(t)
	before := size(t, path)
	code, out := runBin(t, "compact", "--data-dir", filepath.Dir(path))
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	after := size(t, path)
	t.Logf("%s: %d -> %d bytes; %s", path, before, after, strings.TrimSpace(out))
	if after*4 > before {
		t.Fatalf("the store shrank from %d to %d bytes only, want under a quarter", before, after)
	}
	if !strings.Contains(out, fmt.Sprintf("%d -> %d bytes", before, after)) {
		t.Fatalf("output does not give the sizes:\n%s", out)
	}
	got := readStore(t, path)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the compacted store differs: %d ops, %d devices (want %d, %d)", len(got.ops), len(got.devices), len(want.ops), len(want.devices))
	}
	// Still a store the agent writes to: the next op takes the next sequence.
	st, err := store.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	st.Start()
	err = st.Update(context.Background(), func(tx *store.Tx) error {
		return tx.PutOp(store.Op{Device: "pump-0", OpID: "after", Status: store.OpQueued, Fence: 1, Action: "set"})
	})
	if err == nil {
		err = st.View(func(tx *store.Tx) error {
			o, ok, err := tx.Op("pump-0", "after")
			if err == nil && (!ok || o.InboxSeq <= want.ops[len(want.ops)-1].InboxSeq) {
				err = fmt.Errorf("new op: found %v, seq %d after %d", ok, o.InboxSeq, want.ops[len(want.ops)-1].InboxSeq)
			}
			return err
		})
	}
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("writing to the compacted store: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*.compacting")); len(left) > 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}

// --to writes the copy elsewhere and leaves the store as it was; an
// existing target is refused.
func TestCompactTo(t *testing.T) {
	path, want := compactFixture(t)
	before := size(t, path)
	to := filepath.Join(t.TempDir(), "copy.db")
	if code, out := runBin(t, "compact", "--data-dir", filepath.Dir(path), "--to", to); code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if got := size(t, path); got != before {
		t.Fatalf("the store changed size: %d -> %d", before, got)
	}
	if got := readStore(t, to); !reflect.DeepEqual(got, want) {
		t.Fatalf("the copy differs: %d ops, %d devices", len(got.ops), len(got.devices))
	}
	if size(t, to)*4 > before {
		t.Fatalf("the copy is %d bytes, the store %d", size(t, to), before)
	}
	code, out := runBin(t, "compact", "--data-dir", filepath.Dir(path), "--to", to)
	if code != 1 || !strings.Contains(out, "exists") {
		t.Fatalf("compact onto an existing file: exit %d\n%s", code, out)
	}
}

// While an agent holds the store, compact exits 1 saying so and touches
// nothing.
func TestCompactRefusesAHeldStore(t *testing.T) {
	path, _ := compactFixture(t)
	before := size(t, path)
	st, err := store.Open(path, nil) // the running agent's lock
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	code, out := runBin(t, "compact", "--data-dir", filepath.Dir(path))
	if code != 1 || !strings.Contains(out, "held by another process") || !strings.Contains(out, "stop the agent first") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if got := size(t, path); got != before {
		t.Fatalf("the held store changed size: %d -> %d", before, got)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*.compacting")); len(left) > 0 {
		t.Fatalf("files left: %v", left)
	}
	if code, out := runBin(t, "compact"); code != 2 || !strings.Contains(out, "--data-dir") {
		t.Fatalf("without --data-dir: exit %d\n%s", code, out)
	}
	if code, out := runBin(t, "compact", "--data-dir", t.TempDir()); code != 1 || !strings.Contains(out, "agent.db") {
		t.Fatalf("no store: exit %d\n%s", code, out)
	}
}
