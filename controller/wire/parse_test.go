package wire

import (
	"errors"
	"strings"
	"testing"
)

func TestParseCommand(t *testing.T) {
	big := `{"op_id":"a","fence":1,"action":"set","params":{"x":"` + strings.Repeat("y", MaxCommandSize) + `"}}`
	tests := []struct {
		name    string
		in      string
		reason  string // substring of the ParseError reason; "" = valid
		opID    string // echoed op_id on error
		fence   int64
		replyTo string
	}{
		{name: "valid minimal", in: `{"op_id":"op-1","fence":42,"action":"set"}`},
		{name: "valid full", in: `{"v":1,"op_id":"a.b:c-d_e","fence":9223372036854775807,"action":"set","params":{"rpm":1200},"lock":"l","holder":"h","reply_to":"ctl/a/reply","expires_at":"2030-01-01T00:00:00Z","extra":true}`},
		{name: "params null is empty", in: `{"op_id":"a","fence":1,"action":"stop","params":null}`},
		{name: "bad json", in: `{"op_id":`, reason: "not valid JSON"},
		{name: "not an object", in: `[1,2]`, reason: "not a JSON object"},
		{name: "trailing data", in: `{"op_id":"a","fence":1,"action":"set"} {}`, reason: "data after"},
		{name: "duplicate keys", in: `{"op_id":"a","fence":1,"fence":2,"action":"set"}`, reason: `duplicate key "fence"`, opID: "a", fence: 2}, // echo: the last duplicate, as encoding/json reads it
		{name: "nested duplicate keys", in: `{"op_id":"a","fence":1,"action":"set","params":{"x":1,"x":2}}`, reason: `duplicate key "x"`, opID: "a", fence: 1},
		{name: "params keys equal under case folding", in: `{"op_id":"a","fence":1,"action":"set","params":{"rpm":100,"RPM":5000}}`, reason: `params keys "rpm" and "RPM" are equal under case folding`, opID: "a", fence: 1},
		{name: "nested params keys equal under case folding", in: `{"op_id":"a","fence":1,"action":"set","params":{"x":[{"mode":1,"MoDe":2}]}}`, reason: `"mode" and "MoDe"`, opID: "a", fence: 1},
		{name: "params keys folding beyond ASCII", in: `{"op_id":"a","fence":1,"action":"set","params":{"k":1,"\u212a":2}}`, reason: "case folding", opID: "a", fence: 1},
		{name: "params keys folding through an escape", in: `{"op_id":"a","fence":1,"action":"set","params":{"rpm":1,"\u0052PM":2}}`, reason: "case folding", opID: "a", fence: 1},
		{name: "equal keys in different objects are fine", in: `{"op_id":"a","fence":1,"action":"set","params":{"rpm":1,"sub":{"RPM":2}}}`},
		{name: "fence 0", in: `{"op_id":"a","fence":0,"action":"set"}`, reason: "fence must be an integer from 1", opID: "a"},
		{name: "fence negative", in: `{"op_id":"a","fence":-5,"action":"set"}`, reason: "fence must be", opID: "a"},
		{name: "fence 2^63", in: `{"op_id":"a","fence":9223372036854775808,"action":"set"}`, reason: "fence must be", opID: "a"},
		{name: "fence 2^64", in: `{"op_id":"a","fence":18446744073709551616,"action":"set"}`, reason: "fence must be", opID: "a"},
		{name: "fence float", in: `{"op_id":"a","fence":1.5,"action":"set"}`, reason: "fence must be", opID: "a"},
		{name: "fence exponent", in: `{"op_id":"a","fence":1e3,"action":"set"}`, reason: "fence must be", opID: "a"},
		{name: "fence string", in: `{"op_id":"a","fence":"7","action":"set"}`, reason: "fence must be", opID: "a"},
		{name: "fence missing", in: `{"op_id":"a","action":"set"}`, reason: "fence is required", opID: "a"},
		{name: "op_id missing", in: `{"fence":3,"action":"set"}`, reason: "op_id is required", fence: 3},
		{name: "op_id bad chars", in: `{"op_id":"a/b","fence":3,"action":"set"}`, reason: "op_id", fence: 3},
		{name: "op_id too long", in: `{"op_id":"` + strings.Repeat("a", 129) + `","fence":3,"action":"set"}`, reason: "op_id", fence: 3},
		{name: "op_id number", in: `{"op_id":5,"fence":3,"action":"set"}`, reason: "op_id must be a string", fence: 3},
		{name: "action missing", in: `{"op_id":"a","fence":3}`, reason: "action is required", opID: "a", fence: 3},
		{name: "action uppercase", in: `{"op_id":"a","fence":3,"action":"Set"}`, reason: "action", opID: "a", fence: 3},
		{name: "params array", in: `{"op_id":"a","fence":3,"action":"set","params":[1]}`, reason: "params must be a JSON object", opID: "a", fence: 3},
		{name: "params string", in: `{"op_id":"a","fence":3,"action":"set","params":"x"}`, reason: "params must be a JSON object", opID: "a", fence: 3},
		{name: "wildcard reply_to", in: `{"op_id":"a","fence":3,"action":"set","reply_to":"ctl/+/r"}`, reason: "reply_to", opID: "a", fence: 3},
		{name: "hash reply_to", in: `{"op_id":"a","fence":3,"action":"set","reply_to":"ctl/#"}`, reason: "reply_to", opID: "a", fence: 3},
		{name: "bad expires_at", in: `{"op_id":"a","fence":3,"action":"set","expires_at":"tomorrow","reply_to":"r/1"}`, reason: "expires_at", opID: "a", fence: 3, replyTo: "r/1"},
		{name: "v 2", in: `{"v":2,"op_id":"a","fence":3,"action":"set"}`, reason: "v must be 1", opID: "a", fence: 3},
		{name: "huge payload", in: big, reason: "exceeds"},
		{name: "deep nesting", in: `{"op_id":"a","fence":1,"action":"set","params":` + strings.Repeat(`{"a":`, 100) + `1` + strings.Repeat(`}`, 100) + `}`, reason: "nesting", opID: "a", fence: 1},
		{name: "invalid utf8", in: "{\"op_id\":\"a\xff\",\"fence\":1,\"action\":\"set\"}", reason: "UTF-8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseCommand([]byte(tc.in))
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				if c.OpID == "" || c.Fence < 1 || c.Action == "" || c.V != 1 {
					t.Fatalf("decoded %+v", c)
				}
				return
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("want *ParseError, got %v", err)
			}
			if !strings.Contains(pe.Reason, tc.reason) {
				t.Fatalf("reason %q does not contain %q", pe.Reason, tc.reason)
			}
			if pe.OpID != tc.opID || pe.Fence != tc.fence || pe.ReplyTo != tc.replyTo {
				t.Fatalf("echo = (%q, %d, %q), want (%q, %d, %q)", pe.OpID, pe.Fence, pe.ReplyTo, tc.opID, tc.fence, tc.replyTo)
			}
		})
	}
}

func TestDeviceFromCmdTopic(t *testing.T) {
	for _, tc := range []struct {
		topic, dev string
		ok         bool
	}{
		{"edge/gw-1/devices/pump-7/cmd", "pump-7", true},
		{"edge/gw-1/devices//cmd", "", false},
		{"edge/gw-2/devices/pump-7/cmd", "", false},
		{"edge/gw-1/devices/pump-7/result", "", false},
	} {
		dev, ok := DeviceFromCmdTopic("edge", "gw-1", tc.topic)
		if dev != tc.dev || ok != tc.ok {
			t.Errorf("%s: got (%q,%v)", tc.topic, dev, ok)
		}
	}
}
