package jsonscan

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestValidAgreesWithEncodingJSON(t *testing.T) {
	for _, s := range []string{`{}`, `[]`, `0`, `-1.5e+10`, `"a\u00e9\n"`, `{"a":[1,{"b":null}],"c":true}`, ` 1 `,
		``, `{`, `{"a"}`, `01`, `1.`, `.5`, `-`, `"\x"`, `"\u12g4"`, `"a`, `{"a":1,}`, `[1,]`, `nul`, `1 2`, "\"\x01\"", `{"a":1}}`, `+1`, `1e`, `-0`, `0.0e-0`} {
		if got, want := Valid([]byte(s), 1000), json.Valid([]byte(s)); got != want {
			t.Errorf("Valid(%q) = %v, encoding/json says %v", s, got, want)
		}
	}
	deep := strings.Repeat("[", 65) + strings.Repeat("]", 65)
	if Valid([]byte(deep), 63) || !Valid([]byte(deep), 64) {
		t.Error("maxDepth: 65 nested arrays are depth 0..64")
	}
}

func FuzzValid(f *testing.F) {
	for _, s := range []string{`{"a":[1,{"b":null}],"c":true}`, `"\u00e9"`, `-0.5E+3`, `[1,]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := Valid(b, 10000), json.Valid(b); got != want {
			t.Fatalf("Valid(%q) = %v, encoding/json says %v", b, got, want)
		}
	})
}

func TestNumberPlain(t *testing.T) {
	for s, plain := range map[string]bool{"0": true, "-12": true, "-0": false, "1.0": false, "1e2": false} {
		sc := Scanner{B: []byte(s)}
		p, ok := sc.Number()
		if !ok || p != plain || sc.I != len(s) {
			t.Errorf("Number(%s) = %v %v at %d", s, p, ok, sc.I)
		}
	}
}

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "a\"b\\c\n\t\r\x01", "é<&>", "\xff\xfe", "\u2028"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := AppendString(nil, s)
		if !Valid(b, 1) || !utf8.Valid(b) {
			t.Fatalf("AppendString(%q) = %q: not a valid UTF-8 JSON string", s, b)
		}
		var back string
		if err := json.Unmarshal(b, &back); err != nil || back != string([]rune(s)) {
			t.Fatalf("AppendString(%q) = %q decodes to %q (%v)", s, b, back, err)
		}
	})
}

// Member reads what encoding/json reads into a json.RawMessage field, or
// says it is not sure.
func FuzzMember(f *testing.F) {
	for _, s := range []string{`{"applied":true,"state":{"rpm":1}}`, `{"state":null}`, `{}`, `{"state":1,"state":2}`, `{"st\u0061te":1}`, `[1]`, `{"state":{"a":[1,2]}} x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		val, ok := Member(b, "state", 1000)
		if !ok {
			return
		}
		var a struct {
			State json.RawMessage `json:"state"`
		}
		if err := json.Unmarshal(b, &a); err != nil {
			t.Fatalf("Member(%q) ok, encoding/json: %v", b, err)
		}
		if string(val) != string(a.State) {
			t.Fatalf("Member(%q) = %q, encoding/json %q", b, val, a.State)
		}
	})
}
