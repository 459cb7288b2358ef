package wirefast

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
)

func sameAsJSON(t *testing.T, r wire.Result) {
	t.Helper()
	want, werr := json.Marshal(r)
	got, gerr := MarshalResult(r)
	if string(got) != string(want) || (werr == nil) != (gerr == nil) {
		t.Fatalf("MarshalResult(%+v)\n got %s %v\nwant %s %v", r, got, gerr, want, werr)
	}
	s := wire.DeviceState{Device: r.Device, LastFence: r.LastFence, LastOpID: r.OpID, State: r.Output, At: r.At}
	if r.Duplicate {
		s.HeldWrites = int(r.Fence % 3) // 0, 1, 2, and negative from the fuzzer
	}
	want, werr = json.Marshal(s)
	got, gerr = MarshalDeviceState(s)
	if string(got) != string(want) || (werr == nil) != (gerr == nil) {
		t.Fatalf("MarshalDeviceState(%+v)\n got %s %v\nwant %s %v", s, got, gerr, want, werr)
	}
}

func TestEncodersMatchJSON(t *testing.T) {
	at := time.Date(2026, 11, 30, 8, 0, 0, 120000000, time.UTC)
	base := wire.Result{V: 1, OpID: "op-1", Device: "pump-7", Fence: 42, Status: wire.StatusApplied, Code: wire.CodeOK,
		Reason: "pump-7 applied set", LastFence: 42, Output: json.RawMessage(`{"rpm":1200}`), At: at}
	sameAsJSON(t, base)
	for _, mod := range []func(*wire.Result){
		func(r *wire.Result) { r.OpID, r.Fence, r.Output = "", 0, nil },
		func(r *wire.Result) { r.Reason = `fence 3 is below "p"'s last_fence <5> & more` },
		func(r *wire.Result) { r.Reason = "naïve \u2028 line\nbreak\t\x01" },
		func(r *wire.Result) { r.Output = json.RawMessage(`{ "rpm": 1200 }`) },
		func(r *wire.Result) { r.Output = json.RawMessage(`{"s":"a<b"}`) },
		func(r *wire.Result) { r.Output = json.RawMessage(`{"s":"\u2028"}`) },
		func(r *wire.Result) { r.Output = json.RawMessage(`{bad`) },
		func(r *wire.Result) { r.Output = json.RawMessage(`[]`) },
		func(r *wire.Result) { r.At = time.Time{} },
		func(r *wire.Result) { r.At = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) },
		func(r *wire.Result) { r.At = at.In(time.FixedZone("X", 5*3600+30*60)) },
		func(r *wire.Result) { r.At = at.In(time.FixedZone("LMT", 5*3600+7)) },
		func(r *wire.Result) { r.Duplicate, r.LastFence, r.Fence, r.V = true, -1, -9, 0 },
		func(r *wire.Result) { r.Device = "" },
		func(r *wire.Result) { r.Duplicate, r.Fence = true, 7 }, // a DeviceState with held_writes 1
		func(r *wire.Result) { r.Duplicate, r.Fence = true, 5 }, // 2
		func(r *wire.Result) {
			r.Code, r.Output, r.PayloadSHA256 = wire.CodeUnauthorized, nil, wire.PayloadDigest([]byte("x"))
		},
		func(r *wire.Result) { r.PayloadSHA256 = "<not hex>" },
		func(r *wire.Result) { r.RewrittenParams = json.RawMessage(`{"rpm":3000}`) },
		func(r *wire.Result) { r.RewrittenParams = json.RawMessage(`{ "s": "a<b" }`) },
		func(r *wire.Result) { r.RewrittenParams = json.RawMessage(`{bad`) },
	} {
		r := base
		mod(&r)
		sameAsJSON(t, r)
	}
}

func FuzzEncodersMatchJSON(f *testing.F) {
	f.Add("op-1", "pump-7", "applied", "ok", "reason <&>", []byte(`{"rpm":1}`), int64(5), int64(1764489600), false)
	f.Add("", "d", "rejected", "invalid", "é\u2028", []byte(` {"a" : [1, 2]} `), int64(0), int64(-62135596800), true)
	f.Fuzz(func(t *testing.T, op, dev, status, code, reason string, out []byte, fence, sec int64, dup bool) {
		r := wire.Result{V: 1, OpID: op, Device: dev, Fence: fence, Status: wire.Status(status), Code: wire.Code(code),
			Reason: reason, LastFence: fence / 2, Duplicate: dup, Output: out, At: time.Unix(sec, fence%1e9).UTC()}
		if dup {
			r.RewrittenParams = out
		}
		sameAsJSON(t, r)
	})
}

func BenchmarkMarshalResult(b *testing.B) {
	r := wire.Result{V: 1, OpID: "1764489600-12-345", Device: "d12", Fence: 1, Status: wire.StatusApplied, Code: wire.CodeOK,
		Reason: "d12 applied set", LastFence: 1, Output: json.RawMessage(`{"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx","seq":345}`), At: time.Now().UTC()}
	b.Run("wire", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			MarshalResult(r)
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			json.Marshal(r)
		}
	})
}
