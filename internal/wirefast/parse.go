// Package wirefast is the agent's fast path through the contract of
// package wire: the command parser, the canonical form and content hash
// that op_conflict compares, and the encoders of Results and DeviceStates,
// each without reflection and with few allocations. Each answers exactly
// what its reference answers (wire.ParseCommand, encoding/json); the
// controller SDK (module controller) has no use for them and does not
// carry them.
package wirefast

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/big"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// maxDepth is the contract's bound on JSON nesting.
const maxDepth = wire.MaxDepth

// ParseCommand is wire.ParseCommand (the same Command or the same
// *wire.ParseError for every payload), through the fast path when it is
// sure.
func ParseCommand(payload []byte) (wire.Command, error) {
	if len(payload) <= wire.MaxCommandSize && utf8.Valid(payload) {
		if ms, ok := fastObject(payload); ok {
			// Valid, no duplicate keys, not too deep: wire's document
			// check would pass.
			raw := make(map[string]json.RawMessage, len(ms))
			for _, m := range ms {
				raw[m.key] = m.val
			}
			return wire.CommandFromMembers(raw)
		}
	}
	return wire.ParseCommand(payload)
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
