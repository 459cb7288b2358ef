package wire

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// maxDepth bounds JSON nesting, so a hostile payload cannot exhaust the stack.
const maxDepth = 64

// ParseError is returned by ParseCommand for an invalid command. It carries
// whatever could be read of the command, so that the `invalid` Result can
// echo op_id and fence and go to reply_to when those were readable.
type ParseError struct {
	Reason  string // one sentence naming the field and the problem
	OpID    string // "" when unreadable
	Fence   int64  // 0 when unreadable
	ReplyTo string // "" when unreadable or itself invalid
}

func (e *ParseError) Error() string { return "wire: invalid command: " + e.Reason }

// ParseCommand decodes and validates one Command payload (docs/protocol.md §1).
// Every failure is a *ParseError.
func ParseCommand(payload []byte) (Command, error) {
	return parseCommand(payload, true)
}

// parseCommand is ParseCommand; fast false takes the reference path only
// (for the tests that compare the two).
func parseCommand(payload []byte, fast bool) (Command, error) {
	var c Command
	if len(payload) > MaxCommandSize {
		return c, &ParseError{Reason: fmt.Sprintf("payload of %d bytes exceeds the %d-byte limit", len(payload), MaxCommandSize)}
	}
	if !utf8.Valid(payload) {
		return c, &ParseError{Reason: "payload is not valid UTF-8"}
	}
	var raw map[string]json.RawMessage
	var rawErr error
	checked := false
	if ms, ok := fastObject(payload); fast && ok {
		// Valid, no duplicate keys, not too deep: checkJSON would pass.
		raw, checked = make(map[string]json.RawMessage, len(ms)), true
		for _, m := range ms {
			raw[m.key] = m.val
		}
	} else {
		rawErr = json.Unmarshal(payload, &raw)
	}
	pe := &ParseError{}
	// Read what can be echoed first, so every later error carries it.
	if v, ok := raw["op_id"]; ok {
		var s string
		if unquote(v, &s) == nil && ValidOpID(s) {
			pe.OpID = s
		}
	}
	if v, ok := raw["fence"]; ok {
		if f, err := parseFence(v); err == nil {
			pe.Fence = f
		}
	}
	if v, ok := raw["reply_to"]; ok {
		var s string
		if unquote(v, &s) == nil && ValidPublishTopic(s) {
			pe.ReplyTo = s
		}
	}
	fail := func(format string, a ...any) (Command, error) {
		pe.Reason = fmt.Sprintf(format, a...)
		return Command{}, pe
	}
	if !checked {
		if err := checkJSON(payload); err != nil {
			return fail("%v", err)
		}
		if rawErr != nil {
			return fail("payload is not a JSON object")
		}
	}

	c.V = Version
	if v, ok := raw["v"]; ok {
		if string(v) != "1" {
			return fail("v must be 1, got %s", clip(v))
		}
	}
	v, ok := raw["op_id"]
	if !ok {
		return fail("op_id is required")
	}
	if err := unquote(v, &c.OpID); err != nil {
		return fail("op_id must be a string")
	}
	if !ValidOpID(c.OpID) {
		return fail("op_id %q must match [A-Za-z0-9._:-]{1,128}", clip([]byte(c.OpID)))
	}
	v, ok = raw["fence"]
	if !ok {
		return fail("fence is required")
	}
	f, err := parseFence(v)
	if err != nil {
		return fail("%v", err)
	}
	c.Fence = f
	v, ok = raw["action"]
	if !ok {
		return fail("action is required")
	}
	if err := unquote(v, &c.Action); err != nil {
		return fail("action must be a string")
	}
	if !ValidAction(c.Action) {
		return fail("action %q must match [a-z][a-z0-9_]{0,63}", clip([]byte(c.Action)))
	}
	if v, ok := raw["params"]; ok && string(v) != "null" {
		t := bytes.TrimLeft(v, " \t\r\n")
		if len(t) == 0 || t[0] != '{' {
			return fail("params must be a JSON object")
		}
		if err := CheckParamKeys(v); err != nil {
			return fail("%v", err)
		}
		c.Params = append(json.RawMessage(nil), v...)
	}
	for _, k := range []struct {
		name string
		dst  *string
	}{{"lock", &c.Lock}, {"holder", &c.Holder}, {"reply_to", &c.ReplyTo}} {
		if v, ok := raw[k.name]; ok && string(v) != "null" {
			if err := unquote(v, k.dst); err != nil {
				return fail("%s must be a string", k.name)
			}
		}
	}
	if c.ReplyTo != "" && !ValidPublishTopic(c.ReplyTo) {
		return fail("reply_to %q is not a topic that can be published to (no + or #)", clip([]byte(c.ReplyTo)))
	}
	if v, ok := raw["expires_at"]; ok && string(v) != "null" {
		var s string
		if err := unquote(v, &s); err != nil {
			return fail("expires_at must be an RFC 3339 string")
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return fail("expires_at %q is not an RFC 3339 time", clip([]byte(s)))
		}
		c.ExpiresAt = &t
	}
	// The binding members of a signed command (§6), read only when they
	// are strings: in a plain command they were unknown members before
	// §6, and unknown members are ignored.
	for _, k := range []struct {
		name string
		dst  *string
	}{{"gateway", &c.Gateway}, {"device", &c.Device}} {
		if v, ok := raw[k.name]; ok && len(v) > 0 && v[0] == '"' {
			if unquote(v, k.dst) != nil {
				*k.dst = ""
			}
		}
	}
	return c, nil
}

// unquote decodes the JSON string v into dst (json.Unmarshal, without its
// cost for a string with no escapes).
func unquote(v []byte, dst *string) error {
	if s, ok := fastString(v); ok {
		*dst = s
		return nil
	}
	return json.Unmarshal(v, dst)
}

func parseFence(v json.RawMessage) (int64, error) {
	s := string(v)
	if s == "" || strings.ContainsAny(s, ".eE\"") || (s[0] != '-' && (s[0] < '0' || s[0] > '9')) {
		return 0, fmt.Errorf("fence must be an integer from 1 to 2^63-1, got %s", clip(v))
	}
	f, err := strconv.ParseInt(s, 10, 64)
	if err != nil || f < 1 {
		return 0, fmt.Errorf("fence must be an integer from 1 to 2^63-1, got %s", clip(v))
	}
	return f, nil
}

func clip(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "..."
	}
	return string(b)
}

// checkJSON verifies that b is exactly one JSON value with no duplicate
// object keys at any depth and nesting of at most maxDepth.
func checkJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := walk(dec, 0); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("payload has data after the JSON value")
	}
	return nil
}

func walk(dec *json.Decoder, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("JSON nesting deeper than %d", maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("payload is not valid JSON: %v", err)
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	switch d {
	case '{':
		seen := map[string]bool{}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return fmt.Errorf("payload is not valid JSON: %v", err)
			}
			k := kt.(string)
			if seen[k] {
				return fmt.Errorf("duplicate key %q", clip([]byte(k)))
			}
			seen[k] = true
			if err := walk(dec, depth+1); err != nil {
				return err
			}
		}
	case '[':
		for dec.More() {
			if err := walk(dec, depth+1); err != nil {
				return err
			}
		}
	}
	if _, err := dec.Token(); err != nil {
		return fmt.Errorf("payload is not valid JSON: %v", err)
	}
	return nil
}

// Canonical returns a canonical encoding of the JSON value b: object keys
// sorted, insignificant space removed and numbers written in one exact form,
// so two values compare equal as JSON values exactly when their canonical
// forms are equal. An empty b is the empty object.
func Canonical(b []byte) ([]byte, error) {
	if len(bytes.TrimSpace(b)) == 0 || string(bytes.TrimSpace(b)) == "null" {
		return []byte("{}"), nil
	}
	if out, ok := fastCanonical(nil, b); ok {
		return out, nil
	}
	return canonicalRef(b)
}

// canonicalRef is Canonical without the fast path.
func canonicalRef(b []byte) ([]byte, error) {
	if len(bytes.TrimSpace(b)) == 0 || string(bytes.TrimSpace(b)) == "null" {
		return []byte("{}"), nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("wire: canonical: %w", err)
	}
	var buf bytes.Buffer
	writeCanonical(&buf, v)
	return buf.Bytes(), nil
}

func writeCanonical(buf *bytes.Buffer, v any) {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			kb, _ := json.Marshal(k)
			buf.Write(kb)
			buf.WriteByte(':')
			writeCanonical(buf, x[k])
		}
		buf.WriteByte('}')
	case []any:
		buf.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				buf.WriteByte(',')
			}
			writeCanonical(buf, e)
		}
		buf.WriteByte(']')
	case json.Number:
		buf.WriteString(canonicalNumber(string(x)))
	default:
		b, _ := json.Marshal(x)
		buf.Write(b)
	}
}

// canonicalNumber writes a JSON number so that every literal of one value
// gives one string (1, 1.0, 1e0 and 10e-1 alike): the literal is first
// reduced to digits D without trailing zeros and an exponent E (value =
// D x 10^E, a form that depends on the value only), then written as an
// exact fraction when |E| <= 400, and as "DeE" beyond, where expanding it
// would cost unbounded work on hostile input. s is a valid JSON number.
func canonicalNumber(s string) string {
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	mant, exp, _ := strings.Cut(strings.ToLower(s), "e")
	whole, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(whole+frac, "0")
	trimmed := strings.TrimRight(digits, "0")
	if trimmed == "" {
		return "0"
	}
	e := new(big.Int)
	if exp != "" {
		if _, ok := e.SetString(strings.TrimPrefix(exp, "+"), 10); !ok {
			return sign + s // not a JSON number; cannot happen after the parser
		}
	}
	e.Add(e, big.NewInt(int64(len(digits)-len(trimmed)-len(frac))))
	if !e.IsInt64() || e.Int64() > 400 || e.Int64() < -400 {
		return sign + trimmed + "e" + e.String()
	}
	r, _ := new(big.Rat).SetString(trimmed)
	p := new(big.Int).Exp(big.NewInt(10), big.NewInt(abs(e.Int64())), nil)
	if e.Sign() >= 0 {
		r.Mul(r, new(big.Rat).SetInt(p))
	} else {
		r.Quo(r, new(big.Rat).SetInt(p))
	}
	if r.IsInt() {
		return sign + r.Num().String()
	}
	return sign + r.String()
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// ContentHash identifies a command's content for op_conflict: action and
// params compared as JSON values.
func ContentHash(action string, params []byte) ([]byte, error) {
	cp, err := Canonical(params)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	h.Write([]byte(action))
	h.Write([]byte{0})
	h.Write(cp)
	return h.Sum(nil), nil
}
