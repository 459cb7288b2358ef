package store

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ResetFence lowers last_fence (the one sanctioned way), records the act
// as an audit entry in the device's history that retention never sweeps,
// and refuses while commands are not final.
func TestResetFence(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "agent.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Close()
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	if err := s.Update(ctx, func(tx *Tx) error {
		if err := tx.PutDevice("pump-7", Device{LastFence: 9223372036854775807}); err != nil {
			return err
		}
		return tx.PutOp(Op{Device: "pump-7", OpID: "q", Status: OpQueued, Fence: 5, Action: "set", ReceivedAt: now})
	}); err != nil {
		t.Fatal(err)
	}
	check := func(dev string, to int64) error {
		return s.View(func(tx *Tx) error { _, err := tx.CheckReset(dev, to); return err })
	}
	reset := func(to int64) (Op, error) {
		if err := check("pump-7", to); err != nil {
			return Op{}, err
		}
		var o Op
		err := s.Update(ctx, func(tx *Tx) error {
			var err error
			o, err = tx.ResetFence("pump-7", to, "root@gw", "poisoned by a rogue publisher", now)
			return err
		})
		return o, err
	}
	if _, err := reset(41); !errors.Is(err, ErrResetBusy) {
		t.Fatalf("with a queued command: %v, want ErrResetBusy", err)
	}
	s.Update(ctx, func(tx *Tx) error { return tx.DeleteOp("pump-7", "q") })
	if _, err := reset(9223372036854775807); !errors.Is(err, ErrResetNotLower) {
		t.Fatalf("not lower: %v", err)
	}
	if err := check("nope", 1); !errors.Is(err, ErrNoDevice) {
		t.Fatalf("unknown device: %v", err)
	}
	o, err := reset(41)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Audit || o.Action != ActionFenceReset || o.Status != OpFinal || o.Fence != 41 || o.Holder != "root@gw" ||
		o.Reason != "last_fence reset from 9223372036854775807 to 41 by root@gw: poisoned by a rogue publisher" {
		t.Fatalf("audit record %+v", o)
	}
	var d Device
	var history []Op
	s.View(func(tx *Tx) error {
		d, _, _ = tx.Device("pump-7")
		return tx.Ops("pump-7", func(o Op) error { history = append(history, o); return nil })
	})
	if d.LastFence != 41 || len(history) != 1 || !history[0].Audit {
		t.Fatalf("device %+v, history %+v", d, history)
	}
	// Retention keeps it, however old and however many records follow.
	var n int
	s.Update(ctx, func(tx *Tx) error {
		var err error
		n, err = tx.Sweep(now.Add(10*365*24*time.Hour), time.Hour, 0, 1000)
		return err
	})
	if n != 0 {
		t.Fatalf("Sweep deleted the audit record")
	}
	// Outside ResetFence, last_fence still never moves back.
	if err := s.View(func(tx *Tx) error { return tx.PutDevice("pump-7", Device{LastFence: 40}) }); err == nil || !strings.Contains(err.Error(), "would move back") {
		t.Fatal("last_fence moved back outside ResetFence")
	}
}
