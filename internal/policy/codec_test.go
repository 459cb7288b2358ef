package policy

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestAppendInputMatchesEncodingJSON: the hand-written encoder produces
// the same document as encoding/json would.
func TestAppendInputMatchesEncodingJSON(t *testing.T) {
	in := Input{
		Device:    DeviceRef{ID: "pump-\"7\"\n", Type: "pümp\x01\xff"},
		Command:   CommandView{OpID: "op<1>&", Fence: 742, Action: "set", Params: json.RawMessage(` {"rpm": 1200} `), Holder: "ctl-a"},
		State:     json.RawMessage(`{"rpm":1100,"s":"\u00e9"}`),
		Group:     map[string]json.RawMessage{"b": json.RawMessage(`{"x":1}`), "a": json.RawMessage(`{}`)},
		LastFence: 741,
		Now:       time.Date(2026, 11, 30, 10, 0, 0, 123456789, time.FixedZone("x", 3600)),
	}
	got, err := appendInput(nil, &in)
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(got) {
		t.Fatalf("invalid JSON: %s", got)
	}
	want, _ := json.Marshal(in)
	var g, w any
	json.Unmarshal(got, &g)
	json.Unmarshal(want, &w)
	// encoding/json keeps the Now's zone; the host sends UTC.
	w.(map[string]any)["now"] = in.Now.UTC().Format(time.RFC3339Nano)
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("\ngot  %s\nwant %s", got, want)
	}
	// Empty raw fields become {}.
	in2 := Input{Device: DeviceRef{ID: "d"}}
	got, _ = appendInput(nil, &in2)
	if !strings.Contains(string(got), `"params":{}`) || !strings.Contains(string(got), `"state":{}`) {
		t.Fatalf("empty fields: %s", got)
	}
}

func TestValidJSON(t *testing.T) {
	for _, s := range []string{`{}`, `[]`, `0`, `-1.5e+10`, `"a\u00e9\n"`, `{"a":[1,{"b":null}],"c":true}`, ` 1 `} {
		if !validJSON([]byte(s)) || !json.Valid([]byte(s)) {
			t.Errorf("%s: should be valid", s)
		}
	}
	for _, s := range []string{``, `{`, `{"a"}`, `01`, `1.`, `.5`, `"\x"`, `"a`, `{"a":1,}`, `[1,]`, `nul`, `1 2`, "\"\x01\"", `{"a":1}}`, strings.Repeat("[", 2000) + strings.Repeat("]", 2000)} {
		if validJSON([]byte(s)) {
			t.Errorf("%q: should be invalid", s)
		}
	}
}

func TestDecodeOutputTrailingData(t *testing.T) {
	for _, s := range []string{`{"allow":true}{"allow":false}`, `{"allow":true} x`, `{"allow":true`, `{"allow":true,}`} {
		if _, err := decodeOutput([]byte(s)); err == nil {
			t.Errorf("%s: accepted", s)
		}
	}
	d, err := decodeOutput([]byte(`{"allow":false,"reason":"caf\u00e9 \"x\""}`))
	if err != nil || d.Reason != `café "x"` {
		t.Fatalf("%+v %v", d, err)
	}
}
