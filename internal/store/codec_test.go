package store

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
)

func TestOpRecordRoundTrip(t *testing.T) {
	exp := time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC)
	at := time.Date(2026, 11, 30, 8, 0, 0, 123456789, time.UTC)
	for _, o := range []Op{
		{},
		{Device: "pump-7", OpID: "op-1", Status: OpQueued, Fence: 42, Action: "set",
			Params: json.RawMessage(`{"rpm":1200}`), ContentHash: []byte{1, 2, 3}, Worker: "pump-7", ReceivedAt: at},
		{Device: "pump-7", OpID: "op-2", Status: OpFinal, Result: wire.StatusApplied, Code: wire.CodeOK,
			Reason: "pump-7 applied set", Output: json.RawMessage(`{"rpm":1000}`), Fence: -3, Action: "set",
			Params: json.RawMessage(`{"rpm":1200}`), Lock: "l", Holder: "h", ExpiresAt: &exp, ReplyTo: "r/t",
			ContentHash: []byte(strings.Repeat("h", 32)), ParamsSent: json.RawMessage(`{"rpm":1000}`), Rewritten: true,
			Key: "op-2.1.abcd", Keys: 3, WasUnknown: true, UnknownSent: true, Worker: "g", ReceivedAt: at, DecidedAt: at.Add(time.Second), FinalSeq: 77},
		{Device: "d", OpID: "o", Status: OpPending, Params: json.RawMessage(`{"a":1}`), ParamsSent: json.RawMessage(`{"a":1}`)},
		{Device: "m", OpID: "o", Status: OpPending, Key: "o.1.ab", Before: json.RawMessage(`{"register 0":0}`)},
	} {
		var got Op
		if err := decodeOp(encodeOp(&o), &got); err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
		if !reflect.DeepEqual(got, o) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, o)
		}
		dev, op, err := decodeOpID(encodeOp(&o))
		if err != nil || dev != o.Device || op != o.OpID {
			t.Errorf("decodeOpID = %q %q %v", dev, op, err)
		}
	}
	d := Device{LastFence: 9, LastOpID: "op-2", State: json.RawMessage(`{"rpm":1000}`), Finals: 12, UpdatedAt: at}
	var gd Device
	if err := decodeDevice(encodeDevice(&d), &gd); err != nil || !reflect.DeepEqual(gd, d) {
		t.Errorf("device: %+v %v", gd, err)
	}
	in := InboxEntry{Worker: "g", Device: "d", OpID: "o"}
	var gi InboxEntry
	if err := decodeInbox(encodeInbox(&in), &gi); err != nil || gi != in {
		t.Errorf("inbox: %+v %v", gi, err)
	}
	ob := Outbox{Topic: "t", Payload: json.RawMessage(`{"v":1}`), Device: "d", OpID: "o"}
	var gob Outbox
	if err := decodeOutbox(encodeOutbox(&ob), &gob); err != nil || !reflect.DeepEqual(gob, ob) {
		t.Errorf("outbox: %+v %v", gob, err)
	}
}

// A damaged record is an error naming what is wrong, never a panic or a
// silently different record.
func TestDamagedRecords(t *testing.T) {
	o := Op{Device: "pump-7", OpID: "op-1", Status: OpFinal, Params: json.RawMessage(`{"rpm":1}`), DecidedAt: time.Now()}
	b := encodeOp(&o)
	for i := 0; i < len(b); i++ {
		var got Op
		if err := decodeOp(b[:i], &got); err == nil {
			t.Fatalf("truncated to %d bytes: no error", i)
		}
	}
	var got Op
	if err := decodeOp(append(b, 0), &got); err == nil || !strings.Contains(err.Error(), "left over") {
		t.Errorf("trailing byte: %v", err)
	}
	b[0] = 9
	if err := decodeOp(b, &got); err == nil || !strings.Contains(err.Error(), "version 9") {
		t.Errorf("unknown version: %v", err)
	}
}

func FuzzDecodeOp(f *testing.F) {
	f.Add(encodeOp(&Op{Device: "d", OpID: "o", Params: json.RawMessage(`{}`), ReceivedAt: time.Now()}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var o Op
		if decodeOp(b, &o) != nil {
			return
		}
		var again Op
		if err := decodeOp(encodeOp(&o), &again); err != nil || !reflect.DeepEqual(again, o) {
			t.Fatalf("decoded %+v does not survive a round trip: %+v %v", o, again, err)
		}
	})
}

// Before was added after records were written without it. A
// record from before (no opBefore flag, nothing after FinalSeq) still
// decodes, with no Before; one with Before keeps it.
func TestOpRecordBeforeIsOptional(t *testing.T) {
	old := Op{Device: "m", OpID: "o", Status: OpPending, Key: "o.1.ab", FinalSeq: 5}
	b := encodeOp(&old)
	var got Op
	if err := decodeOp(b, &got); err != nil || got.Before != nil || !reflect.DeepEqual(got, old) {
		t.Fatalf("a record without Before: %+v %v", got, err)
	}
	withBefore := old
	withBefore.Before = json.RawMessage(`{"coil 0":false,"register 0":1200}`)
	nb := encodeOp(&withBefore)
	if len(nb) <= len(b) || !strings.HasPrefix(string(nb[2:]), string(b[2:])) {
		t.Fatal("Before must be appended after the fields of older records, behind its flag")
	}
	if err := decodeOp(nb, &got); err != nil || string(got.Before) != string(withBefore.Before) {
		t.Fatalf("a record with Before: %+v %v", got, err)
	}
}
