// Package jws is the JSON Web Signature format of signed commands and
// signed Results (docs/protocol.md §6): RFC 7515 compact serialization,
// signed with Ed25519 (RFC 8037), nothing else. The agent, the controller
// SDK and edgectl all use it, so a command is signed and checked by one
// definition.
//
// It is a small parser of its own, not a general JOSE library: go-jose
// v4.1.9 verifies only the alg name EdDSA (not RFC 9864's Ed25519, which
// the contract accepts too) and accepts a crit header it understands
// (b64), which changes what is signed; the contract refuses every crit.
// Parse reads at most MaxSize bytes, allocates the decoded payload and
// little else, and is fuzzed (FuzzParse) against Sign and against
// encoding/json's reading of the header. Verification costs one Ed25519
// verification (crypto/ed25519); BenchmarkVerify compares it with go-jose.
package jws

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
)

// The algorithm names accepted in a header's alg (docs/protocol.md §6).
// Sign writes AlgEdDSA, the name most JOSE libraries verify; RFC 9864
// deprecates it for new work in favour of AlgEd25519, which Parse accepts
// too.
const (
	AlgEdDSA   = "EdDSA"
	AlgEd25519 = "Ed25519"
)

// MaxSize is the largest compact JWS Parse reads: a 64 KiB Command
// (wire.MaxCommandSize) in base64url, a header of up to MaxHeader bytes
// and the signature, with room to spare.
const MaxSize = 96 << 10

// MaxHeader is the largest decoded header Parse reads.
const MaxHeader = 4 << 10

// b64 is base64url without padding, strict: the unused bits of the last
// character must be zero, so every value has one encoding.
var b64 = base64.RawURLEncoding.Strict()

// Header is what the agent reads of a JWS header; other members are
// ignored.
type Header struct {
	Alg string // AlgEdDSA or AlgEd25519
	Kid string // the key ID; "" when absent
}

// Token is a parsed compact JWS whose signature has not been checked yet.
type Token struct {
	Header  Header
	Payload []byte // the decoded payload
	signed  []byte // BASE64URL(header) '.' BASE64URL(payload), as received
	sig     []byte // 64 bytes
}

// Looks reports whether msg is meant as a compact JWS rather than a JSON
// document: its first byte that is not white space is not '{'. (A JSON
// Command is an object; a compact JWS starts with base64url.)
func Looks(msg []byte) bool {
	for _, c := range msg {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		case '{':
			return false
		}
		return true
	}
	return false
}

// Parse reads a compact JWS: three segments of base64url without padding
// (only the characters A-Z a-z 0-9 - _; the payload may be empty)
// separated by '.', white space
// around the whole ignored. The header must be a JSON object without
// duplicate members, with alg AlgEdDSA or AlgEd25519 and no crit; kid, when
// present, a string. The signature must be 64 bytes. Every error wraps
// ErrMalformed and names the problem.
func Parse(msg []byte) (*Token, error) {
	if len(msg) > MaxSize {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrMalformed, len(msg), MaxSize)
	}
	msg = bytes.Trim(msg, " \t\r\n")
	h64, rest, ok := bytes.Cut(msg, []byte{'.'})
	if !ok {
		return nil, fmt.Errorf("%w: not three segments separated by '.'", ErrMalformed)
	}
	p64, s64, ok := bytes.Cut(rest, []byte{'.'})
	if !ok || bytes.IndexByte(s64, '.') >= 0 {
		return nil, fmt.Errorf("%w: not three segments separated by '.'", ErrMalformed)
	}
	// The payload may be empty (RFC 7515); header and signature may not.
	if len(h64) == 0 || len(s64) == 0 || !base64url(h64) || !base64url(p64) || !base64url(s64) {
		return nil, fmt.Errorf("%w: a segment is empty or not base64url", ErrMalformed)
	}
	if b64.DecodedLen(len(h64)) > MaxHeader {
		return nil, fmt.Errorf("%w: header longer than %d bytes", ErrMalformed, MaxHeader)
	}
	hb, err := decode(h64)
	if err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrMalformed, err)
	}
	t := &Token{signed: msg[:len(h64)+1+len(p64)]}
	if t.Header, err = parseHeader(hb); err != nil {
		return nil, err
	}
	if t.sig, err = decode(s64); err != nil {
		return nil, fmt.Errorf("%w: signature: %v", ErrMalformed, err)
	}
	if len(t.sig) != ed25519.SignatureSize {
		return nil, fmt.Errorf("%w: signature of %d bytes, want %d", ErrMalformed, len(t.sig), ed25519.SignatureSize)
	}
	if t.Payload, err = decode(p64); err != nil {
		return nil, fmt.Errorf("%w: payload: %v", ErrMalformed, err)
	}
	return t, nil
}

// Verify checks the signature with pub (Ed25519 over BASE64URL(header)
// '.' BASE64URL(payload) as received). It returns ErrSignature when it does
// not verify, or when pub is not an Ed25519 public key.
func (t *Token) Verify(pub ed25519.PublicKey) error {
	if len(pub) != ed25519.PublicKeySize || !ed25519.Verify(pub, t.signed, t.sig) {
		return ErrSignature
	}
	return nil
}

// ValidKeyID reports whether kid is a key ID Sign writes:
// [A-Za-z0-9._:-]{1,64}. (Such an ID needs no escaping in JSON, so every
// JOSE library writes the same header bytes for it.)
func ValidKeyID(kid string) bool {
	if len(kid) < 1 || len(kid) > 64 {
		return false
	}
	for i := 0; i < len(kid); i++ {
		c := kid[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

// Sign returns payload as a compact JWS signed with priv, with the header
// {"alg":"EdDSA","kid":KID} written exactly so (no white space, members in
// this order): the bytes docs/controller.md's Python signer produces too.
func Sign(priv ed25519.PrivateKey, kid string, payload []byte) ([]byte, error) {
	if !ValidKeyID(kid) {
		return nil, fmt.Errorf("%w: %q: want [A-Za-z0-9._:-]{1,64}", ErrKeyID, kid)
	}
	if len(priv) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("jws: not an Ed25519 private key (%d bytes)", len(priv))
	}
	h := `{"alg":"` + AlgEdDSA + `","kid":"` + kid + `"}`
	out := make([]byte, 0, b64.EncodedLen(len(h))+b64.EncodedLen(len(payload))+b64.EncodedLen(ed25519.SignatureSize)+2)
	out = b64.AppendEncode(out, []byte(h))
	out = append(out, '.')
	out = b64.AppendEncode(out, payload)
	sig := ed25519.Sign(priv, out)
	out = append(out, '.')
	return b64.AppendEncode(out, sig), nil
}

func base64url(seg []byte) bool {
	for _, c := range seg {
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func decode(seg []byte) ([]byte, error) {
	out := make([]byte, b64.DecodedLen(len(seg)))
	n, err := b64.Decode(out, seg)
	if err != nil {
		return nil, err
	}
	return out[:n], nil
}

// parseHeader reads a header: a JSON object, no duplicate members (two
// readers must never disagree on alg or kid), alg accepted, no crit.
func parseHeader(b []byte) (Header, error) {
	if h, ok := fastHeader(b); ok {
		return h, nil
	}
	var h Header
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return h, fmt.Errorf("%w: header is not a JSON object", ErrMalformed)
	}
	seen := map[string]bool{}
	var alg, kid json.RawMessage
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return h, fmt.Errorf("%w: header is not valid JSON", ErrMalformed)
		}
		k, _ := kt.(string)
		if seen[k] {
			return h, fmt.Errorf("%w: header member %q appears twice", ErrMalformed, clip(k))
		}
		seen[k] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return h, fmt.Errorf("%w: header is not valid JSON", ErrMalformed)
		}
		switch k {
		case "alg":
			alg = v
		case "kid":
			kid = v
		case "crit":
			return h, fmt.Errorf("%w: %w", ErrMalformed, ErrCritical)
		}
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return h, fmt.Errorf("%w: header is not valid JSON", ErrMalformed)
	}
	if _, err := dec.Token(); err != io.EOF {
		return h, fmt.Errorf("%w: data after the header object", ErrMalformed)
	}
	if alg == nil {
		return h, fmt.Errorf("%w: %w: header has no alg", ErrMalformed, ErrAlgorithm)
	}
	if json.Unmarshal(alg, &h.Alg) != nil || (h.Alg != AlgEdDSA && h.Alg != AlgEd25519) {
		return h, fmt.Errorf("%w: %w: alg %s (want %q or %q)", ErrMalformed, ErrAlgorithm, clip(string(alg)), AlgEdDSA, AlgEd25519)
	}
	if kid != nil && json.Unmarshal(kid, &h.Kid) != nil {
		return h, fmt.Errorf("%w: kid is not a string", ErrMalformed)
	}
	return h, nil
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// fastHeader reads the header every signer here writes,
// {"alg":"EdDSA","kid":KID} (or alg Ed25519) with a KID that needs no
// escaping, without a JSON decoder; anything else goes the long way.
// FuzzParse checks that encoding/json reads the same alg and kid.
func fastHeader(b []byte) (Header, bool) {
	var h Header
	rest, ok := bytes.CutPrefix(b, []byte(`{"alg":"`))
	if !ok {
		return h, false
	}
	switch {
	case bytes.HasPrefix(rest, []byte(AlgEdDSA+`","kid":"`)):
		h.Alg, rest = AlgEdDSA, rest[len(AlgEdDSA)+9:]
	case bytes.HasPrefix(rest, []byte(AlgEd25519+`","kid":"`)):
		h.Alg, rest = AlgEd25519, rest[len(AlgEd25519)+9:]
	default:
		return h, false
	}
	kid, ok := bytes.CutSuffix(rest, []byte(`"}`))
	if !ok || !ValidKeyID(string(kid)) {
		return h, false
	}
	h.Kid = string(kid)
	return h, true
}
