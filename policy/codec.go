package policy

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"time"
	"unicode/utf8"
)

// The host encodes the input and decodes the output by hand: on the hot
// path of a small plugin the JSON codec is most of the host's own cost
// (BENCHMARKS.md ("Policy plugins")), and both documents have a fixed shape.

var emptyObject = json.RawMessage("{}")

// appendInput appends the input document of POLICY_ABI.md to b. Raw fields
// must be valid JSON (ErrBadInput otherwise): a raw field that is not could
// change the document's structure around it.
func appendInput(b []byte, in *Input) ([]byte, error) {
	b = append(b, `{"device":{"id":`...)
	b = appendString(b, in.Device.ID)
	b = append(b, `,"type":`...)
	b = appendString(b, in.Device.Type)
	b = append(b, `},"command":{"op_id":`...)
	b = appendString(b, in.Command.OpID)
	b = append(b, `,"fence":`...)
	b = strconv.AppendInt(b, in.Command.Fence, 10)
	b = append(b, `,"action":`...)
	b = appendString(b, in.Command.Action)
	b = append(b, `,"params":`...)
	var err error
	if b, err = appendRaw(b, in.Command.Params, "command.params"); err != nil {
		return b, err
	}
	if in.Command.Holder != "" {
		b = append(b, `,"holder":`...)
		b = appendString(b, in.Command.Holder)
	}
	b = append(b, `},"state":`...)
	if b, err = appendRaw(b, in.State, "state"); err != nil {
		return b, err
	}
	if len(in.Group) > 0 {
		b = append(b, `,"group":{`...)
		ids := make([]string, 0, len(in.Group))
		for id := range in.Group {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for i, id := range ids {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, id)
			b = append(b, ':')
			if b, err = appendRaw(b, in.Group[id], "group."+id); err != nil {
				return b, err
			}
		}
		b = append(b, '}')
	}
	b = append(b, `,"last_fence":`...)
	b = strconv.AppendInt(b, in.LastFence, 10)
	b = append(b, `,"now":"`...)
	now := in.Now
	if now.IsZero() {
		now = time.Now()
	}
	b = now.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `"}`...)
	return b, nil
}

// appendRaw appends a raw JSON value; empty or null becomes {}.
func appendRaw(b []byte, raw json.RawMessage, what string) ([]byte, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return append(b, emptyObject...), nil
	}
	if !validJSON(raw) {
		return b, fmt.Errorf("%w: %s", ErrBadInput, what)
	}
	return append(b, raw...), nil
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// decodeOutput parses {"allow": bool, "reason"?: string, "params"?: object}.
// Anything else (another key, a duplicate key, a wrong type, params on a
// denial, trailing data) is ErrBadOutput. Params is copied out of b.
func decodeOutput(b []byte) (Decision, error) {
	var d Decision
	bad := func(format string, args ...any) (Decision, error) {
		return Decision{}, fmt.Errorf("%w: "+format, append([]any{ErrBadOutput}, args...)...)
	}
	p := &jsonParser{b: b}
	p.ws()
	if !p.eat('{') {
		return bad("not a JSON object")
	}
	var seenAllow, seenReason, seenParams bool
	p.ws()
	if !p.eat('}') {
		for {
			p.ws()
			ks, ke, esc, ok := p.str()
			if !ok {
				return bad("invalid JSON")
			}
			key := string(b[ks:ke])
			if esc {
				key = unquote(b[ks-1 : ke+1])
			}
			p.ws()
			if !p.eat(':') {
				return bad("invalid JSON")
			}
			p.ws()
			switch key {
			case "allow":
				if seenAllow {
					return bad("duplicate key \"allow\"")
				}
				seenAllow = true
				switch {
				case p.lit("true"):
					d.Allow = true
				case p.lit("false"):
				default:
					return bad("\"allow\" is not a boolean")
				}
			case "reason":
				if seenReason {
					return bad("duplicate key \"reason\"")
				}
				seenReason = true
				s, e, esc, ok := p.str()
				if !ok {
					return bad("\"reason\" is not a string")
				}
				if esc {
					d.Reason = unquote(b[s-1 : e+1])
				} else {
					d.Reason = string(b[s:e])
				}
			case "params":
				if seenParams {
					return bad("duplicate key \"params\"")
				}
				seenParams = true
				start := p.i
				if p.i >= len(b) || b[p.i] != '{' {
					return bad("\"params\" is not an object")
				}
				if !p.value(0) {
					return bad("invalid JSON in \"params\"")
				}
				d.Params = append(json.RawMessage(nil), b[start:p.i]...)
			default:
				return bad("unexpected key %q", key)
			}
			p.ws()
			if p.eat('}') {
				break
			}
			if !p.eat(',') {
				return bad("invalid JSON")
			}
		}
	}
	p.ws()
	if p.i != len(b) {
		return bad("data after the object")
	}
	if !seenAllow {
		return bad("no \"allow\"")
	}
	if d.Params != nil && !d.Allow {
		return bad("\"params\" on a denial")
	}
	return d, nil
}

func unquote(q []byte) string {
	var s string
	if err := json.Unmarshal(q, &s); err != nil {
		return string(q)
	}
	return s
}

// validJSON reports whether b is exactly one JSON value (with surrounding
// white space).
func validJSON(b []byte) bool {
	p := &jsonParser{b: b}
	p.ws()
	if !p.value(0) {
		return false
	}
	p.ws()
	return p.i == len(b)
}

// maxDepth bounds nesting, so a hostile document cannot exhaust the stack.
const maxDepth = 1000

// jsonParser is a small strict JSON validator over b (RFC 8259 grammar;
// strings are not checked for valid UTF-8, as encoding/json.Valid).
type jsonParser struct {
	b []byte
	i int
}

func (p *jsonParser) ws() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) eat(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *jsonParser) lit(s string) bool {
	if len(p.b)-p.i >= len(s) && string(p.b[p.i:p.i+len(s)]) == s {
		p.i += len(s)
		return true
	}
	return false
}

// str parses a string; it returns the bounds of its contents (without the
// quotes) and whether it holds escapes.
func (p *jsonParser) str() (start, end int, esc, ok bool) {
	if !p.eat('"') {
		return 0, 0, false, false
	}
	start = p.i
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			end = p.i
			p.i++
			return start, end, esc, true
		case c == '\\':
			esc = true
			p.i++
			if p.i >= len(p.b) {
				return 0, 0, false, false
			}
			switch p.b[p.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				p.i++
			case 'u':
				if len(p.b)-p.i < 5 {
					return 0, 0, false, false
				}
				for _, h := range p.b[p.i+1 : p.i+5] {
					if !isHex(h) {
						return 0, 0, false, false
					}
				}
				p.i += 5
			default:
				return 0, 0, false, false
			}
		case c < 0x20:
			return 0, 0, false, false
		default:
			p.i++
		}
	}
	return 0, 0, false, false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func (p *jsonParser) value(depth int) bool {
	if p.i >= len(p.b) || depth > maxDepth {
		return false
	}
	switch c := p.b[p.i]; {
	case c == '{':
		p.i++
		p.ws()
		if p.eat('}') {
			return true
		}
		for {
			p.ws()
			if _, _, _, ok := p.str(); !ok {
				return false
			}
			p.ws()
			if !p.eat(':') {
				return false
			}
			p.ws()
			if !p.value(depth + 1) {
				return false
			}
			p.ws()
			if p.eat('}') {
				return true
			}
			if !p.eat(',') {
				return false
			}
		}
	case c == '[':
		p.i++
		p.ws()
		if p.eat(']') {
			return true
		}
		for {
			p.ws()
			if !p.value(depth + 1) {
				return false
			}
			p.ws()
			if p.eat(']') {
				return true
			}
			if !p.eat(',') {
				return false
			}
		}
	case c == '"':
		_, _, _, ok := p.str()
		return ok
	case c == 't':
		return p.lit("true")
	case c == 'f':
		return p.lit("false")
	case c == 'n':
		return p.lit("null")
	default:
		return p.number()
	}
}

func (p *jsonParser) number() bool {
	p.eat('-')
	if p.i >= len(p.b) {
		return false
	}
	switch c := p.b[p.i]; {
	case c == '0':
		p.i++
	case c >= '1' && c <= '9':
		p.digits()
	default:
		return false
	}
	if p.eat('.') {
		if !p.digits() {
			return false
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		p.i++
		if !p.eat('+') {
			p.eat('-')
		}
		if !p.digits() {
			return false
		}
	}
	return true
}

func (p *jsonParser) digits() bool {
	start := p.i
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
	}
	return p.i > start
}
