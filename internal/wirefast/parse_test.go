package wirefast

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"strings"
	"testing"

	"github.com/edge-agent/edge-agent/controller/wire"
)

func TestContentHashComparesJSONValues(t *testing.T) {
	h := func(action, params string) string {
		b, err := ContentHash(action, []byte(params))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	same := [][2]string{
		{`{"a":1,"b":2}`, `{"b":2,"a":1}`},
		{`{"a":1}`, `{"a":1.0}`},
		{`{"a":100}`, `{"a":1e2}`},
		{`{"a":[1,{"y":2,"x":1}]}`, ` { "a" : [ 1 , {"x":1,"y":2} ] } `},
		{``, `{}`},
		{`null`, `{}`},
	}
	for _, p := range same {
		if h("set", p[0]) != h("set", p[1]) {
			t.Errorf("%s and %s should hash the same", p[0], p[1])
		}
	}
	diff := [][2]string{
		{`{"a":1}`, `{"a":2}`},
		{`{"a":1}`, `{"a":"1"}`},
		{`{"a":1}`, `{"a":1,"b":null}`},
		{`{"a":0.1}`, `{"a":0.10000000000000001}`},
	}
	for _, p := range diff {
		if h("set", p[0]) == h("set", p[1]) {
			t.Errorf("%s and %s should differ", p[0], p[1])
		}
	}
	if h("set", `{}`) == h("stop", `{}`) {
		t.Error("actions must differ")
	}
}

// FuzzParseCommand: the parser never panics, and whatever it accepts
// satisfies the contract's field rules.
func FuzzParseCommand(f *testing.F) {
	for _, s := range []string{
		`{"op_id":"op-1","fence":42,"action":"set","params":{"rpm":1200}}`,
		`{"op_id":"a","fence":1,"action":"fence"}`,
		`{"op_id":"a","fence":1,"fence":2,"action":"set"}`,
		`{"op_id":"a","fence":1e3,"action":"set"}`,
		`{"op_id":"a","fence":1,"action":"set","params":{"x":[1,2,{"y":null}]},"expires_at":"2030-01-01T00:00:00Z"}`,
		`[]`, `null`, `{"op_id":"a","fence":18446744073709551616,"action":"set"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseCommand(b)
		if err != nil {
			var pe *wire.ParseError
			if !errors.As(err, &pe) || pe.Reason == "" {
				t.Fatalf("error is not a ParseError with a reason: %v", err)
			}
			return
		}
		if !wire.ValidOpID(c.OpID) || c.Fence < 1 || !wire.ValidAction(c.Action) {
			t.Fatalf("accepted an invalid command: %+v", c)
		}
		if c.ReplyTo != "" && !wire.ValidPublishTopic(c.ReplyTo) {
			t.Fatalf("accepted reply_to %q", c.ReplyTo)
		}
		if _, err := ContentHash(c.Action, c.Params); err != nil {
			t.Fatalf("accepted params that cannot be hashed: %v", err)
		}
	})
}

// The fast path (fastjson.go) and the reference path agree on every input:
// the same command or the same error, and the same canonical form.
func FuzzFastPathAgrees(f *testing.F) {
	for _, s := range []string{
		`{"op_id":"op-1","fence":42,"action":"set","params":{"rpm":1200,"mode":"auto"}}`,
		`{"op_id":"a","fence":1,"action":"set","params":{"b":1,"a":[1.0,-0,1e2,{"z":"<x>"}],"a!":true,"a ":null}}`,
		`{"op_id":"a","fence":1,"action":"set","params":{"k":"\u00e9","\u0061":1}}`,
		`{"op_id":"a","fence":1,"action":"set","params":{"x":1,"x":2}}`,
		`{"op_id":"a","fence":1,"action":"set","params":{"x":"` + "\u2028" + `"}}`,
		`{"op_id":"a","fence":1,"action":"set"} `, ` {"op_id":"a","fence":1,"action":"set"}x`,
		`{"op_id":"a","fence":1,"action":"set","reply_to":"r/\u0074","holder":null,"lock":"l"}`,
		`{"op_id":"a","fence":01,"action":"set"}`, `{"op_id":"a","fence":-0,"action":"set"}`,
		`{"op_id":"a","fence":1,"action":"set","params":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}`,
		`{"op_id":"a","fence":1,"action":"set","params":{"s":"tab	in"}}`,
		`{"v":1,"op_id":"a","fence":1,"action":"set","expires_at":"2030-01-01T00:00:00.5+02:00"}`,
		`{"op_id":"a","fence":1,"action":"set","params":{"a":{}x}}`, `{"op_id":"a","fence":1,"action":"set","params":{"a":[[]x]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c1, err1 := ParseCommand(b)
		c2, err2 := wire.ParseCommand(b)
		if fmt.Sprint(err1) != fmt.Sprint(err2) {
			t.Fatalf("errors differ:\nfast %v\nref  %v", err1, err2)
		}
		if err1 != nil {
			var p1, p2 *wire.ParseError
			errors.As(err1, &p1)
			errors.As(err2, &p2)
			if *p1 != *p2 {
				t.Fatalf("parse errors differ:\nfast %+v\nref  %+v", p1, p2)
			}
		} else if !reflect.DeepEqual(c1, c2) {
			t.Fatalf("commands differ:\nfast %+v\nref  %+v", c1, c2)
		}
		for _, v := range [][]byte{b, c1.Params} {
			f1, e1 := Canonical(v)
			f2, e2 := canonicalRef(v)
			if string(f1) != string(f2) || fmt.Sprint(e1) != fmt.Sprint(e2) {
				t.Fatalf("canonical forms of %q differ:\nfast %q %v\nref  %q %v", v, f1, e1, f2, e2)
			}
		}
	})
}

// docs/protocol.md §1: op_conflict compares params as JSON values; number
// formatting must not matter, whatever the exponent (issue 9, defect 6:
// beyond |exponent| 400 the literal was kept, so 1e401 and 10e400 hashed
// differently and a resend was answered op_conflict).
func TestContentHashIgnoresNumberFormatting(t *testing.T) {
	same := [][]string{
		{`1e401`, `10e400`, `1.0e401`, `0.1e402`, `1E+401`, `100000e396`},
		{`-1e401`, `-10e400`, `-1.00e401`},
		{`1e-401`, `0.1e-400`, `10e-402`, `0.00001e-396`},
		{`1`, `1.0`, `1e0`, `10e-1`, `0.001e3`, `1.000000`},
		{`0`, `-0`, `0.0`, `0e999999999999999999999`, `-0.0e-5`},
		{`1.5`, `15e-1`, `0.15e1`, `150e-2`},
		{`123456789e400`, `1.23456789e408`, `12345678900e398`},
		{`7e-400`, `70e-401`},
		{`7e400`, `0.7e401`},
	}
	for _, group := range same {
		var first []byte
		for _, lit := range group {
			h, err := ContentHash("set", []byte(`{"x":`+lit+`}`))
			if err != nil {
				t.Fatalf("%s: %v", lit, err)
			}
			if first == nil {
				first = h
			} else if !bytes.Equal(h, first) {
				t.Errorf("%s hashes differently from %s (%s vs %s)", lit, group[0],
					canonicalNumber(lit), canonicalNumber(group[0]))
			}
		}
	}
	differ := [][2]string{{`1e401`, `1e400`}, {`1e401`, `-1e401`}, {`1e-401`, `1e401`}, {`1.5`, `1.25`}, {`2e400`, `2e401`}}
	for _, p := range differ {
		if canonicalNumber(p[0]) == canonicalNumber(p[1]) {
			t.Errorf("%s and %s are different values but canonicalise alike (%s)", p[0], p[1], canonicalNumber(p[0]))
		}
	}
}

// Two literals whose exact values are equal canonicalise alike, and
// different values differently (checked against big.Float at a precision
// that holds these short literals exactly).
func FuzzCanonicalNumber(f *testing.F) {
	for _, s := range [][2]string{{"1e401", "10e400"}, {"1.5", "15e-1"}, {"0", "-0.0"}, {"7e-400", "70e-401"}, {"12", "13"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if !jsonNumber(a) || !jsonNumber(b) || len(a) > 40 || len(b) > 40 {
			return
		}
		va, _, err1 := big.ParseFloat(a, 10, 4096, big.ToNearestEven)
		vb, _, err2 := big.ParseFloat(b, 10, 4096, big.ToNearestEven)
		if err1 != nil || err2 != nil {
			return // exponent out of big.Float's range
		}
		eq := va.Cmp(vb) == 0
		if got := canonicalNumber(a) == canonicalNumber(b); got != eq {
			t.Fatalf("%s and %s: canonical forms %q, %q; values equal: %v", a, b, canonicalNumber(a), canonicalNumber(b), eq)
		}
	})
}

func jsonNumber(s string) bool {
	var n json.Number
	return json.Unmarshal([]byte(s), &n) == nil && s != "" && s[0] != ' ' && strings.TrimSpace(s) == s && json.Valid([]byte(s))
}

// TestParseBindingMembers: gateway and device (signed commands, §6) are
// read when they are strings and ignored otherwise, as unknown members
// were before §6.
func TestParseBindingMembers(t *testing.T) {
	for _, tt := range []struct{ in, gw, dev string }{
		{`{"op_id":"a","fence":1,"action":"set","gateway":"gw-1","device":"pump-7"}`, "gw-1", "pump-7"},
		{`{"op_id":"a","fence":1,"action":"set","gateway":"g\u0077","device":null}`, "gw", ""},
		{`{"op_id":"a","fence":1,"action":"set","gateway":5,"device":{"x":1}}`, "", ""},
		{`{"op_id":"a","fence":1,"action":"set"}`, "", ""},
	} {
		for fast, parse := range map[bool]func([]byte) (wire.Command, error){true: ParseCommand, false: wire.ParseCommand} {
			c, err := parse([]byte(tt.in))
			if err != nil || c.Gateway != tt.gw || c.Device != tt.dev {
				t.Fatalf("%s (fast %v): %+v %v, want gateway %q device %q", tt.in, fast, c, err, tt.gw, tt.dev)
			}
		}
	}
}
