package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// MaxDepth bounds a command's JSON nesting, so a hostile payload cannot
// exhaust the stack.
const MaxDepth = 64

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
	if len(payload) > MaxCommandSize {
		return Command{}, &ParseError{Reason: fmt.Sprintf("payload of %d bytes exceeds the %d-byte limit", len(payload), MaxCommandSize)}
	}
	if !utf8.Valid(payload) {
		return Command{}, &ParseError{Reason: "payload is not valid UTF-8"}
	}
	var raw map[string]json.RawMessage
	rawErr := json.Unmarshal(payload, &raw)
	return fromMembers(raw, func() error {
		if err := checkJSON(payload); err != nil {
			return err
		}
		if rawErr != nil {
			return errors.New("payload is not a JSON object")
		}
		return nil
	})
}

// CommandFromMembers is ParseCommand for a payload that the caller's own
// parser has already checked (at most MaxCommandSize bytes, valid UTF-8,
// exactly one JSON object, no duplicate key at any depth, nesting at most
// MaxDepth) and split into its members: it validates them as ParseCommand
// does, with the same Command or the same *ParseError. The agent's
// allocation-free parser uses it.
func CommandFromMembers(members map[string]json.RawMessage) (Command, error) {
	return fromMembers(members, nil)
}

// fromMembers validates a command's members; check, when not nil, is
// the document check ParseCommand runs once what can be echoed was read.
func fromMembers(raw map[string]json.RawMessage, check func() error) (Command, error) {
	var c Command
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
	if check != nil {
		if err := check(); err != nil {
			return fail("%v", err)
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

// fastString decodes a JSON string token without escapes.
func fastString(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' || bytes.IndexByte(v, '\\') >= 0 {
		return "", false
	}
	return string(v[1 : len(v)-1]), true
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
// object keys at any depth and nesting of at most MaxDepth.
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
	if depth > MaxDepth {
		return fmt.Errorf("JSON nesting deeper than %d", MaxDepth)
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
