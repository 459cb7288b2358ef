package sdk

import (
	"errors"
	"math"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

	"github.com/edge-agent/edge-agent/plugins/sdk/jsonscan"
)

// zeroCopy is set during Decide: Str returns views into the buffer.
var zeroCopy bool

// view returns b as a string without copying when zeroCopy is set.
func view(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if zeroCopy {
		return unsafe.String(&b[0], len(b))
	}
	return string(b)
}

// The SDK parses JSON itself instead of using encoding/json: reflection is
// slow in a wasm guest and encoding/json adds about a megabyte to every
// plugin. More important, it does not allocate on the hot path: an
// allocation costs about half a microsecond in a Go wasm guest (measured:
// BENCHMARKS.md ("Policy plugins")), more than the whole rule of a typical policy.
//
// Objects and Values are views into the input buffer, scanned when asked
// for: they are valid only during the call that received them. During Decide, the strings of the Input and
// those Str returns are views too (no copy): use strings.Clone for one you
// keep past the call. During Init, Str returns copies, so a plugin can keep
// its configuration.

// Kind is the JSON type of a Value.
type Kind uint8

// The JSON types.
const (
	Invalid Kind = iota
	Null
	Bool
	Number
	String
	Array
	ObjectKind
)

// Value is one JSON value (a view into the buffer it was parsed from).
type Value struct {
	raw []byte
}

// Raw returns the value's JSON text.
func (v Value) Raw() []byte { return v.raw }

// Kind returns the value's JSON type.
func (v Value) Kind() Kind {
	if len(v.raw) == 0 {
		return Invalid
	}
	switch c := v.raw[0]; {
	case c == 'n':
		return Null
	case c == 't' || c == 'f':
		return Bool
	case c == '"':
		return String
	case c == '[':
		return Array
	case c == '{':
		return ObjectKind
	default:
		return Number
	}
}

// Float returns a number's value.
func (v Value) Float() (float64, bool) {
	if v.Kind() != Number {
		return 0, false
	}
	// Fast path: small integers, the common case for device parameters.
	if n, ok := smallInt(v.raw); ok {
		return float64(n), true
	}
	f, err := strconv.ParseFloat(string(v.raw), 64)
	return f, err == nil
}

// Int returns a number's value when it is an integer that fits an int64.
func (v Value) Int() (int64, bool) {
	if v.Kind() != Number {
		return 0, false
	}
	if n, ok := smallInt(v.raw); ok {
		return n, true
	}
	n, err := strconv.ParseInt(string(v.raw), 10, 64)
	if err == nil {
		return n, true
	}
	f, err := strconv.ParseFloat(string(v.raw), 64)
	if err != nil || f != math.Trunc(f) || f < -(1<<63) || f >= 1<<63 {
		return 0, false
	}
	return int64(f), true
}

// smallInt parses an integer of at most 18 digits.
func smallInt(b []byte) (int64, bool) {
	neg := false
	if len(b) > 0 && b[0] == '-' {
		neg, b = true, b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// Str returns a string's value.
func (v Value) Str() (string, bool) {
	if v.Kind() != String {
		return "", false
	}
	s, ok := unquote(v.raw)
	return s, ok
}

// str is Str for the SDK's own use on the hot path.
func (v Value) str() string {
	s, _ := v.Str()
	return s
}

// Bool returns a boolean's value.
func (v Value) Bool() (bool, bool) {
	switch string(v.raw) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

// Object parses an object value (one level: its members stay unparsed).
func (v Value) Object() (Object, bool) {
	if v.Kind() != ObjectKind {
		return Object{}, false
	}
	return Object(v), true
}

// Array returns the elements of an array value.
func (v Value) Array() ([]Value, bool) {
	if v.Kind() != Array {
		return nil, false
	}
	b := v.raw
	out := []Value{}
	i := skipWS(b, 1)
	if i < len(b) && b[i] == ']' {
		return out, true
	}
	for i < len(b) {
		i = skipWS(b, i)
		s := i
		i = skipValue(b, i)
		out = append(out, Value{raw: b[s:i]})
		i = skipWS(b, i)
		if i >= len(b) || b[i] != ',' {
			break
		}
		i++
	}
	return out, true
}

// Strings returns an array of strings.
func (v Value) Strings() ([]string, bool) {
	vals, ok := v.Array()
	if !ok {
		return nil, false
	}
	out := make([]string, len(vals))
	for i, x := range vals {
		if out[i], ok = x.Str(); !ok {
			return nil, false
		}
	}
	return out, true
}

// Object is a JSON object, kept as its text: lookups scan it (objects in a
// policy's input are small, and scanning allocates nothing, where building
// a map would). The zero Object is the empty object.
type Object struct {
	raw []byte
}

// members iterates over an object's members without a closure (a call
// through a func value costs more than the scan itself in a Go guest). The
// object's text is trusted to be valid JSON: the host validates every
// input, and ParseObject validates what it wraps.
type members struct {
	b []byte
	i int
}

func (o Object) members() members {
	i := skipWS(o.raw, 0)
	if i >= len(o.raw) || o.raw[i] != '{' {
		return members{}
	}
	return members{b: o.raw, i: i + 1}
}

// next returns the next member's key text (between the quotes), whether
// the key holds escapes, and its value.
func (m *members) next() (key []byte, esc bool, v Value, ok bool) {
	b := m.b
	i := skipWS(b, m.i)
	if i < len(b) && b[i] == ',' {
		i = skipWS(b, i+1)
	}
	if i >= len(b) || b[i] != '"' {
		m.b = nil
		return nil, false, Value{}, false
	}
	ks := i + 1
	i, esc = skipString(b, i)
	key = b[ks : i-1]
	i = skipWS(b, i)
	if i >= len(b) || b[i] != ':' {
		m.b = nil
		return nil, false, Value{}, false
	}
	i = skipWS(b, i+1)
	vs := i
	i = skipValue(b, i)
	m.i = i
	return key, esc, Value{raw: b[vs:i]}, true
}

// each calls f for every member until f returns false.
func (o Object) each(f func(key []byte, esc bool, v Value) bool) {
	m := o.members()
	for {
		k, esc, v, ok := m.next()
		if !ok || !f(k, esc, v) {
			return
		}
	}
}

// keyIs compares a member's key text with k.
func keyIs(key []byte, esc bool, k string) bool {
	if !esc {
		return string(key) == k
	}
	s, ok := unquoteRaw(key)
	return ok && s == k
}

// Len returns the number of members.
func (o Object) Len() int {
	n := 0
	o.each(func([]byte, bool, Value) bool { n++; return true })
	return n
}

// Get returns the member named key (the first, if the text repeats it).
func (o Object) Get(key string) (Value, bool) {
	m := o.members()
	for {
		k, esc, v, ok := m.next()
		if !ok {
			return Value{}, false
		}
		if keyIs(k, esc, key) {
			return v, true
		}
	}
}

// Has reports whether the object has the member key.
func (o Object) Has(key string) bool {
	_, ok := o.Get(key)
	return ok
}

// Float returns the number member key.
func (o Object) Float(key string) (float64, bool) {
	v, ok := o.Get(key)
	if !ok {
		return 0, false
	}
	return v.Float()
}

// Int returns the integer member key.
func (o Object) Int(key string) (int64, bool) {
	v, ok := o.Get(key)
	if !ok {
		return 0, false
	}
	return v.Int()
}

// Str returns the string member key.
func (o Object) Str(key string) (string, bool) {
	v, ok := o.Get(key)
	if !ok {
		return "", false
	}
	return v.Str()
}

// Bool returns the boolean member key.
func (o Object) Bool(key string) (bool, bool) {
	v, ok := o.Get(key)
	if !ok {
		return false, false
	}
	return v.Bool()
}

// Obj returns the object member key.
func (o Object) Obj(key string) (Object, bool) {
	v, ok := o.Get(key)
	if !ok {
		return Object{}, false
	}
	return v.Object()
}

// Keys returns the member names, in order.
func (o Object) Keys() []string {
	var out []string
	o.each(func(k []byte, esc bool, _ Value) bool {
		out = append(out, keyString(k, esc))
		return true
	})
	return out
}

func keyString(k []byte, esc bool) string {
	if esc {
		s, _ := unquoteRaw(k)
		return s
	}
	return view(k)
}

// Each calls f for every member, in order.
func (o Object) Each(f func(key string, v Value)) {
	o.each(func(k []byte, esc bool, v Value) bool {
		f(keyString(k, esc), v)
		return true
	})
}

// Only returns an error naming the first member that is not in keys: a
// plugin's Init uses it to reject unknown configuration keys.
func (o Object) Only(keys ...string) error {
	var err error
	o.each(func(k []byte, esc bool, _ Value) bool {
		for _, want := range keys {
			if keyIs(k, esc, want) {
				return true
			}
		}
		err = errors.New("unknown key " + strconv.Quote(keyString(k, esc)))
		return false
	})
	return err
}

// With returns a copy of o with member key set to v (replaced where it
// is, or appended). o is unchanged.
func (o Object) With(key string, v Value) Object {
	b := make([]byte, 0, len(o.raw)+len(key)+len(v.raw)+4)
	b = append(b, '{')
	n := 0
	replaced := false
	o.each(func(k []byte, esc bool, val Value) bool {
		if n > 0 {
			b = append(b, ',')
		}
		n++
		b = append(b, '"')
		b = append(b, k...)
		b = append(b, '"', ':')
		if !replaced && keyIs(k, esc, key) {
			b = append(b, v.raw...)
			replaced = true
		} else {
			b = append(b, val.raw...)
		}
		return true
	})
	if !replaced {
		if n > 0 {
			b = append(b, ',')
		}
		b = jsonscan.AppendString(b, key)
		b = append(b, ':')
		b = append(b, v.raw...)
	}
	return Object{raw: append(b, '}')}
}

// Raw returns the object's JSON text.
func (o Object) Raw() []byte {
	if len(o.raw) == 0 {
		return []byte("{}")
	}
	return o.raw
}

// AppendJSON appends o as JSON.
func (o Object) AppendJSON(b []byte) []byte {
	return append(b, o.Raw()...)
}

// Num returns a number Value.
func Num(f float64) Value {
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		return Value{raw: strconv.AppendInt(nil, int64(f), 10)}
	}
	return Value{raw: strconv.AppendFloat(nil, f, 'g', -1, 64)}
}

// Int returns an integer Value.
func Int(n int64) Value { return Value{raw: strconv.AppendInt(nil, n, 10)} }

// Str returns a string Value.
func Str(s string) Value { return Value{raw: jsonscan.AppendString(nil, s)} }

// RawValue wraps JSON text as a Value; it must be one valid JSON value.
func RawValue(raw []byte) Value { return Value{raw: raw} }

// ParseObject checks that b is one JSON object and wraps it.
func ParseObject(b []byte) (Object, error) { return parseObject(b) }

var errSyntax = errors.New("sdk: invalid JSON")

func parseObject(b []byte) (Object, error) {
	p := jsonscan.Scanner{B: b}
	p.WS()
	if p.I >= len(b) || b[p.I] != '{' {
		return Object{}, errSyntax
	}
	start := p.I
	if !p.Value(0, maxDepth) {
		return Object{}, errSyntax
	}
	end := p.I
	p.WS()
	if p.I != len(b) {
		return Object{}, errSyntax
	}
	return Object{raw: b[start:end]}, nil
}

// Fast scanners over text already known to be valid JSON.

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString: b[i] is the opening quote; returns the index past the
// closing one, and whether the string holds escapes.
func skipString(b []byte, i int) (int, bool) {
	esc := false
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			esc = true
			i++
		case '"':
			return i + 1, esc
		}
	}
	return len(b), esc
}

// skipValue returns the index past the value starting at b[i].
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		i, _ = skipString(b, i)
		return i
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			case '"':
				i, _ = skipString(b, i)
				i--
			}
		}
		return i
	}
	for ; i < len(b); i++ {
		switch b[i] {
		case ',', '}', ']', ' ', '\n', '\t', '\r':
			return i
		}
	}
	return i
}

const maxDepth = 512

// unquoteRaw decodes the text between a string's quotes.
func unquoteRaw(b []byte) (string, bool) {
	q := make([]byte, 0, len(b)+2)
	q = append(q, '"')
	q = append(q, b...)
	q = append(q, '"')
	return unquote(q)
}

// unquote decodes a JSON string literal (with its quotes).
func unquote(q []byte) (string, bool) {
	if len(q) < 2 || q[0] != '"' || q[len(q)-1] != '"' {
		return "", false
	}
	q = q[1 : len(q)-1]
	esc := false
	for _, c := range q {
		if c == '\\' {
			esc = true
			break
		}
	}
	if !esc {
		return view(q), true
	}
	out := make([]byte, 0, len(q))
	for i := 0; i < len(q); i++ {
		c := q[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		if i >= len(q) {
			return "", false
		}
		switch q[i] {
		case '"', '\\', '/':
			out = append(out, q[i])
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			if i+4 >= len(q) {
				return "", false
			}
			r, ok := hex4(q[i+1 : i+5])
			if !ok {
				return "", false
			}
			i += 4
			if utf16.IsSurrogate(r) && i+6 < len(q) && q[i+1] == '\\' && q[i+2] == 'u' {
				if r2, ok := hex4(q[i+3 : i+7]); ok {
					if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
						r = d
						i += 6
					}
				}
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", false
		}
	}
	return string(out), true
}

func hex4(b []byte) (rune, bool) {
	var r rune
	for _, c := range b {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}
