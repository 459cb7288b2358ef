package wirefast

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// Results and DeviceStates are encoded once per command, the Result inside
// the group commit (it goes into the outbox in the same transaction). These
// encoders write exactly what json.Marshal writes, without reflection; a
// value they are not sure about (a string that needs escaping, an output
// with space or characters json.Marshal escapes, a time outside years
// 0-9999) is handed to json.Marshal. TestEncodersMatchJSON and
// FuzzEncodersMatchJSON compare the two.

// MarshalResult is json.Marshal(r).
func MarshalResult(r wire.Result) ([]byte, error) {
	b := make([]byte, 0, 272+len(r.Reason)+len(r.Output)+len(r.RewrittenParams))
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(r.V), 10)
	ok := true
	if r.OpID != "" {
		b = append(b, `,"op_id":`...)
		b, ok = appendPlain(b, r.OpID, ok)
	}
	b = append(b, `,"device":`...)
	b, ok = appendPlain(b, r.Device, ok)
	if r.Fence != 0 {
		b = append(b, `,"fence":`...)
		b = strconv.AppendInt(b, r.Fence, 10)
	}
	b = append(b, `,"status":`...)
	b, ok = appendPlain(b, string(r.Status), ok)
	b = append(b, `,"code":`...)
	b, ok = appendPlain(b, string(r.Code), ok)
	b = append(b, `,"reason":`...)
	b, ok = appendPlain(b, r.Reason, ok)
	b = append(b, `,"last_fence":`...)
	b = strconv.AppendInt(b, r.LastFence, 10)
	b = append(b, `,"duplicate":`...)
	b = strconv.AppendBool(b, r.Duplicate)
	if len(r.Output) > 0 {
		b = append(b, `,"output":`...)
		b, ok = appendRaw(b, r.Output, ok)
	}
	if len(r.RewrittenParams) > 0 {
		b = append(b, `,"rewritten_params":`...)
		b, ok = appendRaw(b, r.RewrittenParams, ok)
	}
	b = append(b, `,"at":`...)
	b, ok = appendTime(b, r.At, ok)
	if r.PayloadSHA256 != "" {
		b = append(b, `,"payload_sha256":`...)
		b, ok = appendPlain(b, r.PayloadSHA256, ok)
	}
	if !ok {
		return json.Marshal(r)
	}
	return append(b, '}'), nil
}

// MarshalDeviceState is json.Marshal(s).
func MarshalDeviceState(s wire.DeviceState) ([]byte, error) {
	b := make([]byte, 0, 128+len(s.State))
	b = append(b, `{"device":`...)
	b, ok := appendPlain(b, s.Device, true)
	b = append(b, `,"last_fence":`...)
	b = strconv.AppendInt(b, s.LastFence, 10)
	b = append(b, `,"last_op_id":`...)
	b, ok = appendPlain(b, s.LastOpID, ok)
	b = append(b, `,"state":`...)
	if s.State == nil {
		b = append(b, "null"...)
	} else {
		b, ok = appendRaw(b, s.State, ok)
	}
	b = append(b, `,"at":`...)
	b, ok = appendTime(b, s.At, ok)
	if s.HeldWrites != 0 {
		b = append(b, `,"held_writes":`...)
		b = strconv.AppendInt(b, int64(s.HeldWrites), 10)
	}
	if !ok {
		return json.Marshal(s)
	}
	return append(b, '}'), nil
}

// appendPlain appends v quoted when json.Marshal would write it unescaped
// (printable ASCII other than '"', '\\', '<', '>', '&'); otherwise ok
// becomes false.
func appendPlain(b []byte, v string, ok bool) ([]byte, bool) {
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return b, false
		}
	}
	b = append(b, '"')
	b = append(b, v...)
	return append(b, '"'), ok
}

// appendRaw appends a JSON document json.Marshal would copy as it is: no
// insignificant space to remove, nothing it escapes, valid.
func appendRaw(b, v []byte, ok bool) ([]byte, bool) {
	for _, c := range v {
		switch c {
		case ' ', '\t', '\n', '\r', '<', '>', '&', 0xE2:
			return b, false
		}
	}
	if !json.Valid(v) {
		return b, false
	}
	return append(b, v...), ok
}

func appendTime(b []byte, t time.Time, ok bool) ([]byte, bool) {
	if y := t.Year(); y < 0 || y > 9999 {
		return b, false
	}
	if _, off := t.Zone(); off%60 != 0 {
		return b, false // RFC 3339 has no seconds in offsets: json.Marshal fails
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"'), ok
}
