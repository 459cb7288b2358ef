package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode"
	"unicode/utf8"
)

// CheckParamKeys refuses params (a valid JSON value) with two keys, in one
// object at any depth, that are equal under Unicode case folding
// (docs/protocol.md §1: `rpm` and `RPM` make a command invalid). Many
// device decoders match keys without case (Go's encoding/json takes the
// last such match), so the policy, which sees the keys as they are, could
// judge another value than the one the device takes. ParseCommand applies
// it; controllers can check before they send.
func CheckParamKeys(b []byte) error {
	bad := errors.New("params is not valid JSON")
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	// One frame per open object or array: an object's keys as folded (to
	// the key as written), and whether its next token is a key.
	type frame struct {
		keys    map[string]string
		wantKey bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF && len(stack) == 0 {
			return nil
		}
		if err != nil {
			return bad
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.wantKey {
			if key, ok := tok.(string); ok {
				f := foldKey(key)
				if prev, dup := top.keys[f]; dup {
					return fmt.Errorf("params keys %q and %q are equal under case folding (a device may take either)", clip([]byte(prev)), clip([]byte(key)))
				}
				top.keys[f] = key
				top.wantKey = false
				continue
			}
		}
		if d, ok := tok.(json.Delim); ok {
			switch d {
			case '{', '[':
				if len(stack) > MaxDepth {
					return bad
				}
				fr := &frame{}
				if d == '{' {
					fr.keys, fr.wantKey = map[string]string{}, true
				}
				stack = append(stack, fr)
				continue
			default: // '}' or ']': the container is a value of its parent
				stack = stack[:len(stack)-1]
			}
		}
		if len(stack) > 0 && stack[len(stack)-1].keys != nil {
			stack[len(stack)-1].wantKey = true // a value ended: a key or '}' comes next
		}
	}
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
