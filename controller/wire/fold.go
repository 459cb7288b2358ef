package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/edge-agent/edge-agent/plugins/sdk/jsonscan"
)

// CheckParamKeys refuses params (a valid JSON value) with two keys, in one
// object at any depth, that are equal under Unicode case folding
// (docs/protocol.md §1: `rpm` and `RPM` make a command invalid). Many
// device decoders match keys without case (Go's encoding/json takes the
// last such match), so the policy, which sees the keys as they are, could
// judge another value than the one the device takes. ParseCommand applies
// it; controllers can check before they send.
func CheckParamKeys(b []byte) error {
	s := jsonscan.Scanner{B: b}
	s.WS()
	return twins(&s, 0)
}

func twins(s *jsonscan.Scanner, depth int) error {
	if s.I >= len(s.B) || depth > MaxDepth {
		return errors.New("params is not valid JSON")
	}
	switch s.B[s.I] {
	case '{':
		s.I++
		s.WS()
		if s.Eat('}') {
			return nil
		}
		seen := map[string]string{} // folded key -> key as written
		for {
			s.WS()
			start, end, esc, ok := s.Str()
			if !ok {
				return errors.New("params is not valid JSON")
			}
			key := string(s.B[start:end])
			if esc && json.Unmarshal(s.B[start-1:end+1], &key) != nil {
				return errors.New("params is not valid JSON")
			}
			f := foldKey(key)
			if prev, dup := seen[f]; dup {
				return fmt.Errorf("params keys %q and %q are equal under case folding (a device may take either)", clip([]byte(prev)), clip([]byte(key)))
			}
			seen[f] = key
			s.WS()
			if !s.Eat(':') {
				return errors.New("params is not valid JSON")
			}
			s.WS()
			if err := twins(s, depth+1); err != nil {
				return err
			}
			s.WS()
			if s.Eat('}') {
				return nil
			}
			if !s.Eat(',') {
				return errors.New("params is not valid JSON")
			}
		}
	case '[':
		s.I++
		s.WS()
		if s.Eat(']') {
			return nil
		}
		for {
			s.WS()
			if err := twins(s, depth+1); err != nil {
				return err
			}
			s.WS()
			if s.Eat(']') {
				return nil
			}
			if !s.Eat(',') {
				return errors.New("params is not valid JSON")
			}
		}
	}
	if !s.Value(depth, MaxDepth) {
		return errors.New("params is not valid JSON")
	}
	return nil
}

// foldKey maps every rune of k to the smallest rune of its Unicode
// simple case-folding orbit (as encoding/json does to match field names),
// so two keys are equal under case folding exactly when their foldKeys
// are equal (strings.EqualFold's relation).
func foldKey(k string) string {
	b := make([]byte, 0, len(k))
	for _, r := range k {
		b = utf8.AppendRune(b, foldRune(r))
	}
	return string(b)
}

func foldRune(r rune) rune {
	m := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		m = min(m, f)
	}
	return m
}
