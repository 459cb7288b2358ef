// Package jsonscan is the project's one hand-written JSON scanner, shared
// by the plugin SDK (plugins/sdk, which runs in wasm guests, where
// reflection is slow and every allocation costs), the policy host
// (internal/policy/codec.go), the HTTP device driver and the agent's fast
// path of the command parser (internal/wirefast/fastjson.go). It validates
// strictly (the RFC 8259 grammar; whether strings are valid UTF-8 is the
// caller's affair, as with encoding/json.Valid), allocates nothing, and
// leaves decoding to its callers.
//
// It lives in the SDK's module, which requires nothing, so that a plugin
// author's build needs nothing else; the agent's module requires the SDK
// module and imports it from here (one definition). It is public because
// another module cannot import an internal package; its API is for the
// project's own packages and may change with the SDK's version.
package jsonscan

import (
	"strings"
	"unicode/utf8"
)

// Scanner reads B from I.
type Scanner struct {
	B []byte
	I int
}

// WS skips white space.
func (s *Scanner) WS() {
	for s.I < len(s.B) {
		switch s.B[s.I] {
		case ' ', '\t', '\n', '\r':
			s.I++
		default:
			return
		}
	}
}

// Eat consumes c if it is next.
func (s *Scanner) Eat(c byte) bool {
	if s.I < len(s.B) && s.B[s.I] == c {
		s.I++
		return true
	}
	return false
}

// Lit consumes the literal w (true, false, null) if it is next.
func (s *Scanner) Lit(w string) bool {
	if len(s.B)-s.I >= len(w) && string(s.B[s.I:s.I+len(w)]) == w {
		s.I += len(w)
		return true
	}
	return false
}

// Str scans a string; it returns the bounds of its contents (without the
// quotes) and whether it holds escapes.
func (s *Scanner) Str() (start, end int, esc, ok bool) {
	if !s.Eat('"') {
		return 0, 0, false, false
	}
	start = s.I
	for s.I < len(s.B) {
		c := s.B[s.I]
		switch {
		case c == '"':
			end = s.I
			s.I++
			return start, end, esc, true
		case c == '\\':
			esc = true
			s.I++
			if s.I >= len(s.B) {
				return 0, 0, false, false
			}
			switch s.B[s.I] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.I++
			case 'u':
				if len(s.B)-s.I < 5 {
					return 0, 0, false, false
				}
				for _, h := range s.B[s.I+1 : s.I+5] {
					if !isHex(h) {
						return 0, 0, false, false
					}
				}
				s.I += 5
			default:
				return 0, 0, false, false
			}
		case c < 0x20:
			return 0, 0, false, false
		default:
			s.I++
		}
	}
	return 0, 0, false, false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// Number scans a number; plain says it is an integer written without a
// fraction, an exponent or as "-0".
func (s *Scanner) Number() (plain, ok bool) {
	start := s.I
	s.Eat('-')
	if s.I >= len(s.B) {
		return false, false
	}
	switch c := s.B[s.I]; {
	case c == '0':
		s.I++
	case c >= '1' && c <= '9':
		s.digits()
	default:
		return false, false
	}
	plain = string(s.B[start:s.I]) != "-0"
	if s.Eat('.') {
		plain = false
		if !s.digits() {
			return false, false
		}
	}
	if s.I < len(s.B) && (s.B[s.I] == 'e' || s.B[s.I] == 'E') {
		plain = false
		s.I++
		if !s.Eat('+') {
			s.Eat('-')
		}
		if !s.digits() {
			return false, false
		}
	}
	return plain, true
}

func (s *Scanner) digits() bool {
	start := s.I
	for s.I < len(s.B) && s.B[s.I] >= '0' && s.B[s.I] <= '9' {
		s.I++
	}
	return s.I > start
}

// Value validates and skips one value at depth (0 for a document's own
// value); a value nested deeper than maxDepth is refused, so a hostile
// document cannot exhaust the stack.
func (s *Scanner) Value(depth, maxDepth int) bool {
	if s.I >= len(s.B) || depth > maxDepth {
		return false
	}
	switch c := s.B[s.I]; {
	case c == '{':
		s.I++
		s.WS()
		if s.Eat('}') {
			return true
		}
		for {
			s.WS()
			if _, _, _, ok := s.Str(); !ok {
				return false
			}
			s.WS()
			if !s.Eat(':') {
				return false
			}
			s.WS()
			if !s.Value(depth+1, maxDepth) {
				return false
			}
			s.WS()
			if s.Eat('}') {
				return true
			}
			if !s.Eat(',') {
				return false
			}
		}
	case c == '[':
		s.I++
		s.WS()
		if s.Eat(']') {
			return true
		}
		for {
			s.WS()
			if !s.Value(depth+1, maxDepth) {
				return false
			}
			s.WS()
			if s.Eat(']') {
				return true
			}
			if !s.Eat(',') {
				return false
			}
		}
	case c == '"':
		_, _, _, ok := s.Str()
		return ok
	case c == 't':
		return s.Lit("true")
	case c == 'f':
		return s.Lit("false")
	case c == 'n':
		return s.Lit("null")
	}
	_, ok := s.Number()
	return ok
}

// Valid reports whether b is exactly one JSON value (white space around
// it allowed), nested at most maxDepth deep.
func Valid(b []byte, maxDepth int) bool {
	s := Scanner{B: b}
	s.WS()
	if !s.Value(0, maxDepth) {
		return false
	}
	s.WS()
	return s.I == len(b)
}

// AppendString appends s as a JSON string: quotes, backslashes and control
// characters escaped, invalid UTF-8 written as \ufffd (so the document is
// valid UTF-8). Unlike encoding/json it does not escape <, > and &.
func AppendString(b []byte, s string) []byte {
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

const hexDigits = "0123456789abcdef"

// Member returns the value of key in the JSON object b (nil when b has no
// such member), checking that b is one valid object. ok is false when b is
// not, or when Member cannot be sure what encoding/json would read into a
// field named key: a key with an escape, key given twice (encoding/json
// takes the last), or another key that matches it regardless of case (as
// encoding/json matches).
func Member(b []byte, key string, maxDepth int) (val []byte, ok bool) {
	s := Scanner{B: b}
	s.WS()
	if !s.Eat('{') {
		return nil, false
	}
	s.WS()
	if !s.Eat('}') {
		for {
			s.WS()
			ks, ke, esc, ok := s.Str()
			if !ok || esc {
				return nil, false
			}
			s.WS()
			if !s.Eat(':') {
				return nil, false
			}
			s.WS()
			start := s.I
			if !s.Value(1, maxDepth) {
				return nil, false
			}
			switch k := string(b[ks:ke]); {
			case k == key:
				if val != nil {
					return nil, false
				}
				val = b[start:s.I]
			case strings.EqualFold(k, key):
				return nil, false
			}
			s.WS()
			if s.Eat('}') {
				break
			}
			if !s.Eat(',') {
				return nil, false
			}
		}
	}
	s.WS()
	return val, s.I == len(b)
}
