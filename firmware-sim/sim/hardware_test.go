package sim

import (
	"encoding/json"
	"testing"
)

func TestApplyWrite(t *testing.T) {
	tests := []struct {
		name, typ, cur, action, params string
		want                           string // the state after, or "" when refused
		refusal                        string
	}{
		{name: "pump set", typ: TypePump, cur: `{"rpm":0}`, action: "set", params: `{"rpm":1200}`, want: `{"rpm":1200}`},
		{name: "pump set as integral float", typ: TypePump, cur: `{"rpm":0}`, action: "set", params: `{"rpm":1.2e3}`, want: `{"rpm":1200}`},
		{name: "pump set max", typ: TypePump, cur: `{"rpm":0}`, action: "set", params: `{"rpm":6000}`, want: `{"rpm":6000}`},
		{name: "pump stop", typ: TypePump, cur: `{"rpm":900}`, action: "stop", params: `{}`, want: `{"rpm":0}`},
		{name: "pump over limit", typ: TypePump, cur: `{"rpm":0}`, action: "set", params: `{"rpm":6001}`, refusal: "rpm: must be an integer 0..6000, got 6001"},
		{name: "pump negative", typ: TypePump, cur: `{"rpm":0}`, action: "set", params: `{"rpm":-1}`, refusal: "rpm: must be an integer 0..6000, got -1"},
		{name: "pump fraction", typ: TypePump, cur: `{"rpm":0}`, action: "set", params: `{"rpm":1.5}`, refusal: "rpm: must be an integer 0..6000, got 1.5"},
		{name: "pump string", typ: TypePump, cur: `{"rpm":0}`, action: "set", params: `{"rpm":"1200"}`, refusal: `rpm: must be an integer 0..6000, got "1200"`},
		{name: "pump missing", typ: TypePump, cur: `{"rpm":0}`, action: "set", params: `{}`, refusal: "rpm: required (an integer 0..6000)"},
		{name: "pump unknown param", typ: TypePump, cur: `{"rpm":0}`, action: "set", params: `{"rpm":1,"speed":2}`, refusal: "speed: unknown parameter"},
		{name: "pump stop with param", typ: TypePump, cur: `{"rpm":0}`, action: "stop", params: `{"rpm":1}`, refusal: "rpm: unknown parameter"},
		{name: "pump unknown action", typ: TypePump, cur: `{"rpm":0}`, action: "open", params: `{}`, refusal: `action: this device accepts set and stop, not "open"`},
		{name: "valve set", typ: TypeValve, cur: `{"open":0}`, action: "set", params: `{"open":40}`, want: `{"open":40}`},
		{name: "valve close", typ: TypeValve, cur: `{"open":40}`, action: "close", params: `{}`, want: `{"open":0}`},
		{name: "valve over 100", typ: TypeValve, cur: `{"open":0}`, action: "set", params: `{"open":101}`, refusal: "open: must be an integer 0..100, got 101"},
		{name: "relay set", typ: TypeRelay, cur: `{"on":false}`, action: "set", params: `{"on":true}`, want: `{"on":true}`},
		{name: "relay toggle", typ: TypeRelay, cur: `{"on":true}`, action: "toggle", params: `{}`, want: `{"on":false}`},
		{name: "relay not bool", typ: TypeRelay, cur: `{"on":false}`, action: "set", params: `{"on":1}`, refusal: "on: must be a boolean, got 1"},
		{name: "relay missing", typ: TypeRelay, cur: `{"on":false}`, action: "set", params: `{}`, refusal: "on: required (a boolean)"},
		{name: "relay unknown action", typ: TypeRelay, cur: `{"on":false}`, action: "stop", params: `{}`, refusal: `action: a relay accepts set and toggle, not "stop"`},
		{name: "generic merges", typ: TypeGeneric, cur: `{"a":1,"b":{"x":true}}`, action: "anything", params: `{"b":[1,2],"c":"s"}`, want: `{"a":1,"b":[1,2],"c":"s"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cur state
			if err := json.Unmarshal([]byte(tt.cur), &cur); err != nil {
				t.Fatal(err)
			}
			// JSON numbers decode as float64; the hardware keeps int64.
			for k, v := range cur {
				if f, ok := v.(float64); ok {
					cur[k] = int64(f)
				}
			}
			_, members, err := decodeParams(json.RawMessage(tt.params))
			if err != nil {
				t.Fatal(err)
			}
			next, err := applyWrite(tt.typ, cur, tt.action, members)
			if tt.refusal != "" {
				if err == nil || err.Error() != tt.refusal {
					t.Fatalf("refusal = %v, want %q", err, tt.refusal)
				}
				if _, ok := err.(*refusal); !ok {
					t.Fatalf("error is %T, want *refusal", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if got := string(next.JSON()); got != tt.want {
				t.Fatalf("state = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestDecodeParams(t *testing.T) {
	for _, tt := range []struct{ in, want, err string }{
		{in: ``, want: `{}`},
		{in: `null`, want: `{}`},
		{in: ` { "a" : 1 } `, want: `{"a":1}`},
		{in: `[1]`, err: "params: must be a JSON object"},
		{in: `"x"`, err: "params: must be a JSON object"},
	} {
		got, _, err := decodeParams(json.RawMessage(tt.in))
		if tt.err != "" {
			if err == nil || err.Error() != tt.err {
				t.Errorf("decodeParams(%q) error = %v, want %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || string(got) != tt.want {
			t.Errorf("decodeParams(%q) = %s, %v; want %s", tt.in, got, err, tt.want)
		}
	}
}
