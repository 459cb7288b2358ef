package jws

import "errors"

// Parsing (Parse). Every error Parse returns wraps ErrMalformed, and one of
// the others when it says more.
var (
	// ErrMalformed: the input is not a JWS in compact serialization
	// (three base64url segments, a JSON object header, a 64-byte
	// signature), or exceeds MaxSize.
	ErrMalformed = errors.New("jws: malformed")
	// ErrAlgorithm: the header's alg is not EdDSA or Ed25519 (none,
	// HS256, RS256, ... are refused whatever the key).
	ErrAlgorithm = errors.New("jws: algorithm not accepted")
	// ErrCritical: the header has a crit member; no extension is
	// understood, so none may be critical (RFC 7515 §4.1.11).
	ErrCritical = errors.New("jws: crit header not accepted")
)

// Signing and verifying (Sign, Token.Verify).
var (
	// ErrKeyID: a key ID outside [A-Za-z0-9._:-]{1,64}.
	ErrKeyID = errors.New("jws: invalid key id")
	// ErrSignature: the signature does not verify with the key.
	ErrSignature = errors.New("jws: signature does not verify")
)
