package wire

import (
	"bytes"
	"sort"
	"unicode/utf8"
)

// The fast path of ParseCommand and Canonical: one pass over the bytes,
// no reflection, few allocations. encoding/json's token API (duplicate-key
// check) and the decode-then-re-encode of Canonical cost about 24 µs and 160
// allocations per command, a visible part of the agent's CPU at thousands
// of commands per second. The fast path only answers when it is sure: any
// input it does not fully understand (an invalid document, a key with an
// escape, a string that encoding/json would re-escape, a number in a form
// other than a plain integer) is handed to the reference path above, which
// also writes every error message. FuzzFastPathAgrees checks that the two
// agree.

type member struct {
	key string
	val []byte
}

type scan struct {
	b []byte
	i int
}

func (s *scan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// fastObject validates b as one JSON object (nesting at most maxDepth, no
// duplicate keys at any depth, nothing after it) and returns its members in
// order; ok is false when it cannot be sure (see above).
func fastObject(b []byte) (ms []member, ok bool) {
	s := scan{b: b}
	s.ws()
	if s.i >= len(b) || b[s.i] != '{' {
		return nil, false
	}
	ms, ok = s.object(0, true)
	if !ok {
		return nil, false
	}
	s.ws()
	return ms, s.i == len(b)
}

func (s *scan) value(depth int) bool {
	if depth > maxDepth || s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '{':
		_, ok := s.object(depth, false)
		return ok
	case c == '[':
		return s.array(depth)
	case c == '"':
		_, _, ok := s.str()
		return ok
	case c == '-' || (c >= '0' && c <= '9'):
		_, ok := s.number()
		return ok
	case c == 't':
		return s.lit("true")
	case c == 'f':
		return s.lit("false")
	case c == 'n':
		return s.lit("null")
	}
	return false
}

func (s *scan) lit(w string) bool {
	if len(s.b)-s.i < len(w) || string(s.b[s.i:s.i+len(w)]) != w {
		return false
	}
	s.i += len(w)
	return true
}

// members walks the object at s.i ('{'): for each member it scans the key
// (which must have no escape) and calls each with it, quotes included, and
// s.i at the value, which each must scan. False: not sure (see above).
func (s *scan) members(each func(key []byte) bool) bool {
	s.i++ // '{'
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		return true
	}
	for {
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return false
		}
		key, esc, ok := s.str()
		if !ok || esc {
			return false
		}
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return false
		}
		s.i++
		s.ws()
		if !each(key) {
			return false
		}
		if more, ok := s.next('}'); !more {
			return ok
		}
	}
}

// elements walks the array at s.i ('['), calling each with s.i at every
// element, which each must scan.
func (s *scan) elements(each func(n int) bool) bool {
	s.i++ // '['
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		return true
	}
	for n := 0; ; n++ {
		if !each(n) {
			return false
		}
		if more, ok := s.next(']'); !more {
			return ok
		}
	}
}

// next consumes what follows a member or element: a ',' (more: another
// one follows) or the closing bracket end (ok, not more); anything else is
// not ok.
func (s *scan) next(end byte) (more, ok bool) {
	s.ws()
	if s.i >= len(s.b) {
		return false, false
	}
	switch s.b[s.i] {
	case ',':
		s.i++
		s.ws()
		return true, true
	case end:
		s.i++
		return false, true
	}
	return false, false
}

// object scans an object at s.i; keep says whether to return its members.
func (s *scan) object(depth int, keep bool) ([]member, bool) {
	var ms []member
	var keys []string
	ok := s.members(func(raw []byte) bool {
		k := string(raw[1 : len(raw)-1])
		for _, seen := range keys {
			if seen == k {
				return false // duplicate: the reference path names it
			}
		}
		if keys = append(keys, k); len(keys) > 64 {
			return false // the reference path's map is cheaper than this scan
		}
		start := s.i
		if !s.value(depth + 1) {
			return false
		}
		if keep {
			ms = append(ms, member{key: k, val: s.b[start:s.i]})
		}
		return true
	})
	return ms, ok
}

func (s *scan) array(depth int) bool {
	return s.elements(func(int) bool { return s.value(depth + 1) })
}

// str scans a string at s.i and returns it with its quotes; esc says
// whether it holds an escape. Payloads are valid UTF-8 (checked first).
func (s *scan) str() (raw []byte, esc bool, ok bool) {
	start := s.i
	s.i++
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return s.b[start:s.i], esc, true
		case c < 0x20:
			return nil, false, false
		case c == '\\':
			esc = true
			if s.i+1 >= len(s.b) {
				return nil, false, false
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) {
					return nil, false, false
				}
				for _, h := range s.b[s.i+2 : s.i+6] {
					if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
						return nil, false, false
					}
				}
				s.i += 6
			default:
				return nil, false, false
			}
		default:
			s.i++
		}
	}
	return nil, false, false
}

// number scans a JSON number; plain says it is an integer written without
// fraction, exponent or "-0" (its canonical form is itself).
func (s *scan) number() (plain bool, ok bool) {
	start := s.i
	if s.b[s.i] == '-' {
		s.i++
	}
	if s.i >= len(s.b) {
		return false, false
	}
	switch c := s.b[s.i]; {
	case c == '0':
		s.i++
	case c >= '1' && c <= '9':
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
		}
	default:
		return false, false
	}
	plain = string(s.b[start:s.i]) != "-0"
	if s.i < len(s.b) && s.b[s.i] == '.' {
		plain = false
		s.i++
		if !s.digits() {
			return false, false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		plain = false
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if !s.digits() {
			return false, false
		}
	}
	return plain, true
}

func (s *scan) digits() bool {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}

// fastString decodes a JSON string token without escapes.
func fastString(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' || bytes.IndexByte(v, '\\') >= 0 {
		return "", false
	}
	return string(v[1 : len(v)-1]), true
}

// plainString reports whether json.Marshal would write the string token raw
// (no escapes, quotes included) exactly as it is: nothing it escapes (<, >,
// &, U+2028, U+2029) and no escape in it.
func plainString(raw []byte) bool {
	for i, c := range raw[1 : len(raw)-1] {
		switch c {
		case '\\', '<', '>', '&':
			return false
		case 0xE2:
			if r := raw[1+i:]; len(r) >= 3 && r[1] == 0x80 && (r[2] == 0xA8 || r[2] == 0xA9) {
				return false
			}
		}
	}
	return true
}

// fastCanonical appends the canonical form of the JSON value b (see
// Canonical); ok is false when it cannot be sure.
func fastCanonical(out, b []byte) ([]byte, bool) {
	if !utf8.Valid(b) {
		return nil, false
	}
	s := scan{b: b}
	s.ws()
	out, ok := s.canon(out, 0)
	if !ok {
		return nil, false
	}
	s.ws()
	return out, s.i == len(b)
}

func (s *scan) canon(out []byte, depth int) ([]byte, bool) {
	if depth > maxDepth || s.i >= len(s.b) {
		return nil, false
	}
	start := s.i
	switch c := s.b[s.i]; {
	case c == '{':
		return s.canonObject(out, depth)
	case c == '[':
		out = append(out, '[')
		ok := s.elements(func(n int) bool {
			if n > 0 {
				out = append(out, ',')
			}
			var ok bool
			out, ok = s.canon(out, depth+1)
			return ok
		})
		return append(out, ']'), ok
	case c == '"':
		raw, esc, ok := s.str()
		if !ok || esc || !plainString(raw) {
			return nil, false
		}
		return append(out, raw...), true
	case c == '-' || (c >= '0' && c <= '9'):
		plain, ok := s.number()
		if !ok || !plain {
			return nil, false
		}
		return append(out, s.b[start:s.i]...), true
	case c == 't':
		return append(out, "true"...), s.lit("true")
	case c == 'f':
		return append(out, "false"...), s.lit("false")
	case c == 'n':
		return append(out, "null"...), s.lit("null")
	}
	return nil, false
}

func (s *scan) canonObject(out []byte, depth int) ([]byte, bool) {
	type kv struct {
		key []byte // with quotes
		val []byte // canonical
	}
	var ms []kv
	ok := s.members(func(key []byte) bool {
		if !plainString(key) {
			return false
		}
		val, ok := s.canon(nil, depth+1)
		ms = append(ms, kv{key, val})
		return ok
	})
	if !ok {
		return nil, false
	}
	// Keys sort as Go strings (without their quotes: '"' sorts after ' '
	// and '!').
	unq := func(k []byte) []byte { return k[1 : len(k)-1] }
	sort.Slice(ms, func(i, j int) bool { return bytes.Compare(unq(ms[i].key), unq(ms[j].key)) < 0 })
	out = append(out, '{')
	for i, m := range ms {
		if i > 0 {
			if bytes.Equal(ms[i-1].key, m.key) {
				return nil, false // duplicate: the reference keeps the last
			}
			out = append(out, ',')
		}
		out = append(out, m.key...)
		out = append(out, ':')
		out = append(out, m.val...)
	}
	return append(out, '}'), true
}
