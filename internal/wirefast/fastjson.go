package wirefast

import (
	"bytes"
	"sort"
	"unicode/utf8"

	"github.com/edge-agent/edge-agent/plugins/sdk/jsonscan"
)

// The fast path of ParseCommand and Canonical: one pass over the bytes,
// no reflection, few allocations. encoding/json's token API (duplicate-key
// check) and the decode-then-re-encode of Canonical cost about 24 µs and 160
// allocations per command, a visible part of the agent's CPU at thousands
// of commands per second. The fast path only answers when it is sure: any
// input it does not fully understand (an invalid document, a key with an
// escape, a string that encoding/json would re-escape, a number in a form
// other than a plain integer) is handed to the reference path (wire.ParseCommand,
// canonicalRef), which
// also writes every error message. FuzzFastPathAgrees checks that the two
// agree.

type member struct {
	key string
	val []byte
}

// scan is the project's JSON scanner (plugins/sdk/jsonscan) with the walks
// this parser needs.
type scan struct{ jsonscan.Scanner }

// str scans a string and returns it with its quotes; esc says whether it
// holds an escape.
func (s *scan) str() (raw []byte, esc bool, ok bool) {
	start, end, esc, ok := s.Str()
	if !ok {
		return nil, false, false
	}
	return s.B[start-1 : end+1], esc, true
}

// fastObject validates b as one JSON object (nesting at most maxDepth, no
// duplicate keys at any depth, nothing after it) and returns its members in
// order; ok is false when it cannot be sure (see above).
func fastObject(b []byte) (ms []member, ok bool) {
	s := scan{jsonscan.Scanner{B: b}}
	s.WS()
	if s.I >= len(b) || b[s.I] != '{' {
		return nil, false
	}
	ms, ok = s.object(0, true)
	if !ok {
		return nil, false
	}
	s.WS()
	return ms, s.I == len(b)
}

func (s *scan) value(depth int) bool {
	if depth > maxDepth || s.I >= len(s.B) {
		return false
	}
	switch s.B[s.I] {
	case '{':
		_, ok := s.object(depth, false)
		return ok
	case '[':
		return s.array(depth)
	}
	return s.Value(depth, maxDepth) // a scalar
}

// members walks the object at s.I ('{'): for each member it scans the key
// (which must have no escape) and calls each with it, quotes included, and
// s.I at the value, which each must scan. False: not sure (see above).
func (s *scan) members(each func(key []byte) bool) bool {
	s.I++ // '{'
	s.WS()
	if s.I < len(s.B) && s.B[s.I] == '}' {
		s.I++
		return true
	}
	for {
		if s.I >= len(s.B) || s.B[s.I] != '"' {
			return false
		}
		key, esc, ok := s.str()
		if !ok || esc {
			return false
		}
		s.WS()
		if s.I >= len(s.B) || s.B[s.I] != ':' {
			return false
		}
		s.I++
		s.WS()
		if !each(key) {
			return false
		}
		if more, ok := s.next('}'); !more {
			return ok
		}
	}
}

// elements walks the array at s.I ('['), calling each with s.I at every
// element, which each must scan.
func (s *scan) elements(each func(n int) bool) bool {
	s.I++ // '['
	s.WS()
	if s.I < len(s.B) && s.B[s.I] == ']' {
		s.I++
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
	s.WS()
	if s.I >= len(s.B) {
		return false, false
	}
	switch s.B[s.I] {
	case ',':
		s.I++
		s.WS()
		return true, true
	case end:
		s.I++
		return false, true
	}
	return false, false
}

// object scans an object at s.I; keep says whether to return its members.
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
		start := s.I
		if !s.value(depth + 1) {
			return false
		}
		if keep {
			ms = append(ms, member{key: k, val: s.B[start:s.I]})
		}
		return true
	})
	return ms, ok
}

func (s *scan) array(depth int) bool {
	return s.elements(func(int) bool { return s.value(depth + 1) })
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
	s := scan{jsonscan.Scanner{B: b}}
	s.WS()
	out, ok := s.canon(out, 0)
	if !ok {
		return nil, false
	}
	s.WS()
	return out, s.I == len(b)
}

func (s *scan) canon(out []byte, depth int) ([]byte, bool) {
	if depth > maxDepth || s.I >= len(s.B) {
		return nil, false
	}
	start := s.I
	switch c := s.B[s.I]; {
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
		plain, ok := s.Number()
		if !ok || !plain {
			return nil, false
		}
		return append(out, s.B[start:s.I]...), true
	case c == 't':
		return append(out, "true"...), s.Lit("true")
	case c == 'f':
		return append(out, "false"...), s.Lit("false")
	case c == 'n':
		return append(out, "null"...), s.Lit("null")
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
