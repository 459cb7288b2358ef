package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// Records are stored in a compact binary form: a version byte, then the
// fields in a fixed order, integers as varints, strings and JSON documents
// with a uvarint length. JSON records cost most of the group commit's CPU
// (the commit goroutine encodes every record of a batch, and encoding/json
// re-validates every embedded JSON document), which bounded the commits per
// second at 64 devices. The Go structs keep their JSON tags for inspect and
// the admin API.
const recVersion = 1

var errShort = errors.New("truncated record")

type enc struct{ b []byte }

func (e *enc) uvarint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *enc) varint(v int64)   { e.b = binary.AppendVarint(e.b, v) }
func (e *enc) bytes(v []byte)   { e.uvarint(uint64(len(v))); e.b = append(e.b, v...) }
func (e *enc) str(v string)     { e.uvarint(uint64(len(v))); e.b = append(e.b, v...) }
func (e *enc) time(t time.Time) {
	if t.IsZero() {
		e.uvarint(0)
		return
	}
	e.uvarint(1)
	e.varint(t.Unix())
	e.uvarint(uint64(t.Nanosecond()))
}

type dec struct {
	b   []byte
	err error
}

func (d *dec) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errShort
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errShort
		return 0
	}
	d.b = d.b[n:]
	return v
}

// raw returns the next length-prefixed field, aliasing the record (valid
// only inside the transaction).
func (d *dec) raw() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = errShort
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) str() string { return string(d.raw()) }

// bytes copies the next field out of the record; empty is nil.
func (d *dec) bytes() []byte {
	v := d.raw()
	if len(v) == 0 {
		return nil
	}
	return bytes.Clone(v)
}

func (d *dec) json() json.RawMessage { return json.RawMessage(d.bytes()) }

func (d *dec) time() time.Time {
	if d.uvarint() == 0 {
		return time.Time{}
	}
	s, ns := d.varint(), d.uvarint()
	if d.err != nil {
		return time.Time{}
	}
	return time.Unix(s, int64(ns)).UTC()
}

func (d *dec) version(what string) error {
	if len(d.b) == 0 {
		return fmt.Errorf("empty %s record", what)
	}
	if d.b[0] != recVersion {
		return fmt.Errorf("%s record version %d, want %d", what, d.b[0], recVersion)
	}
	d.b = d.b[1:]
	return nil
}

func (d *dec) done(what string) error {
	if d.err != nil {
		return fmt.Errorf("%s record: %w", what, d.err)
	}
	if len(d.b) != 0 {
		return fmt.Errorf("%s record: %d bytes left over", what, len(d.b))
	}
	return nil
}

const (
	opRewritten = 1 << iota
	opWasUnknown
	opSentAsReceived // ParamsSent equals Params and is not stored twice
	opExpires
	opUnknownSent
	opBefore // Before follows FinalSeq (records written before it have none)
	opAudit  // an operator's act (audit.go), never swept
)

func encodeOp(o *Op) []byte {
	e := enc{b: make([]byte, 0, 160+len(o.Params)+len(o.Output)+len(o.Reason)+len(o.ReplyTo)+len(o.Before))}
	e.b = append(e.b, recVersion)
	var flags uint64
	if o.Rewritten {
		flags |= opRewritten
	}
	if o.WasUnknown {
		flags |= opWasUnknown
	}
	sent := o.ParamsSent
	if len(sent) > 0 && bytes.Equal(sent, o.Params) {
		flags |= opSentAsReceived
		sent = nil
	}
	if o.ExpiresAt != nil {
		flags |= opExpires
	}
	if o.UnknownSent {
		flags |= opUnknownSent
	}
	if len(o.Before) > 0 {
		flags |= opBefore
	}
	if o.Audit {
		flags |= opAudit
	}
	e.uvarint(flags)
	e.str(o.Device)
	e.str(o.OpID)
	e.str(string(o.Status))
	e.str(string(o.Result))
	e.str(string(o.Code))
	e.str(o.Reason)
	e.bytes(o.Output)
	e.varint(o.Fence)
	e.str(o.Action)
	e.bytes(o.Params)
	e.str(o.Lock)
	e.str(o.Holder)
	if o.ExpiresAt != nil {
		e.time(*o.ExpiresAt)
	}
	e.str(o.ReplyTo)
	e.bytes(o.ContentHash)
	e.bytes(sent)
	e.str(o.Key)
	e.uvarint(uint64(o.Keys))
	e.str(o.Worker)
	e.time(o.ReceivedAt)
	e.time(o.DecidedAt)
	e.uvarint(o.FinalSeq)
	if len(o.Before) > 0 {
		e.bytes(o.Before)
	}
	return e.b
}

func decodeOp(b []byte, o *Op) error {
	d := dec{b: b}
	if err := d.version("op"); err != nil {
		return err
	}
	flags := d.uvarint()
	*o = Op{
		Device: d.str(), OpID: d.str(), Status: OpStatus(d.str()),
		Result: wire.Status(d.str()), Code: wire.Code(d.str()), Reason: d.str(), Output: d.json(),
		Fence: d.varint(), Action: d.str(), Params: d.json(), Lock: d.str(), Holder: d.str(),
	}
	if flags&opExpires != 0 {
		t := d.time()
		o.ExpiresAt = &t
	}
	o.ReplyTo = d.str()
	o.ContentHash = d.bytes()
	o.ParamsSent = d.json()
	if flags&opSentAsReceived != 0 {
		o.ParamsSent = o.Params
	}
	o.Key = d.str()
	o.Keys = int(d.uvarint())
	o.Rewritten, o.WasUnknown, o.UnknownSent = flags&opRewritten != 0, flags&opWasUnknown != 0, flags&opUnknownSent != 0
	o.Audit = flags&opAudit != 0
	o.Worker = d.str()
	o.ReceivedAt = d.time()
	o.DecidedAt = d.time()
	o.FinalSeq = d.uvarint()
	if flags&opBefore != 0 {
		o.Before = d.json()
	}
	return d.done("op")
}

// decodeOpID reads only the device and op_id of an op record.
func decodeOpID(b []byte) (dev, op string, err error) {
	d := dec{b: b}
	if err := d.version("op"); err != nil {
		return "", "", err
	}
	d.uvarint()
	dev, op = d.str(), d.str()
	return dev, op, d.err
}

func encodeDevice(v *Device) []byte {
	e := enc{b: make([]byte, 0, 48+len(v.LastOpID)+len(v.State))}
	e.b = append(e.b, recVersion)
	e.varint(v.LastFence)
	e.str(v.LastOpID)
	e.bytes(v.State)
	e.uvarint(v.Finals)
	e.time(v.UpdatedAt)
	return e.b
}

func decodeDevice(b []byte, v *Device) error {
	d := dec{b: b}
	if err := d.version("device"); err != nil {
		return err
	}
	*v = Device{LastFence: d.varint(), LastOpID: d.str(), State: d.json(), Finals: d.uvarint(), UpdatedAt: d.time()}
	return d.done("device")
}

func encodeInbox(v *InboxEntry) []byte {
	e := enc{b: make([]byte, 0, 4+len(v.Worker)+len(v.Device)+len(v.OpID))}
	e.b = append(e.b, recVersion)
	e.str(v.Worker)
	e.str(v.Device)
	e.str(v.OpID)
	return e.b
}

func decodeInbox(b []byte, v *InboxEntry) error {
	d := dec{b: b}
	if err := d.version("inbox"); err != nil {
		return err
	}
	*v = InboxEntry{Worker: d.str(), Device: d.str(), OpID: d.str()}
	return d.done("inbox")
}

func encodeOutbox(v *Outbox) []byte {
	e := enc{b: make([]byte, 0, 8+len(v.Topic)+len(v.Payload)+len(v.Device)+len(v.OpID))}
	e.b = append(e.b, recVersion)
	e.str(v.Topic)
	e.bytes(v.Payload)
	e.str(v.Device)
	e.str(v.OpID)
	return e.b
}

func decodeOutbox(b []byte, v *Outbox) error {
	d := dec{b: b}
	if err := d.version("outbox"); err != nil {
		return err
	}
	*v = Outbox{Topic: d.str(), Payload: d.json(), Device: d.str(), OpID: d.str()}
	return d.done("outbox")
}
