// Package auth decides whether a command is signed by a key allowed to
// command its device (docs/protocol.md §6, "Signed commands"). It does no
// I/O: the keys are given (read by the configuration), and Open is a pure
// function of the message, the topic's device, the key ring and the clock,
// so the agent's intake calls it on arrival, before anything is written.
package auth

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"sync/atomic"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
	"github.com/edge-agent/edge-agent/internal/clip"
	"github.com/edge-agent/edge-agent/internal/wirefast"
)

// Key is one controller key of security.keys.
type Key struct {
	ID string // the JWS kid
	// Public holds the key's Ed25519 public keys: one, or a few while a
	// key is being rotated (a signature by any of them counts).
	Public []ed25519.PublicKey
	// Devices are path.Match globs of the devices the key may command;
	// empty means every device.
	Devices []string
}

// Options configure a Verifier. Zero values: no keys, signatures not
// required, MaxTTL 15 minutes.
type Options struct {
	Gateway string // the gateway_id signed commands must name; required
	Keys    []Key
	// Require makes every device require signatures (security.require_signed).
	Require bool
	// MaxTTL: a signed command must carry expires_at no later than arrival
	// + MaxTTL.
	MaxTTL time.Duration
}

// DefaultMaxTTL is security.max_ttl's default.
const DefaultMaxTTL = 15 * time.Minute

// Verifier checks signed commands. Its keys can be replaced while it is
// in use (SetKeys, on SIGHUP); everything else is fixed.
type Verifier struct {
	gw      string
	require bool
	maxTTL  time.Duration
	ring    atomic.Pointer[map[string]*Key]
}

// New builds a Verifier; it does no I/O.
func New(o Options) (*Verifier, error) {
	if o.Gateway == "" {
		return nil, fmt.Errorf("%w: the gateway is required", ErrInvalidKeys)
	}
	if o.MaxTTL <= 0 {
		o.MaxTTL = DefaultMaxTTL
	}
	v := &Verifier{gw: o.Gateway, require: o.Require, maxTTL: o.MaxTTL}
	if err := v.SetKeys(o.Keys); err != nil {
		return nil, err
	}
	return v, nil
}

// Required reports whether devices require signed commands.
func (v *Verifier) Required() bool { return v.require }

// MaxTTL is the longest a signed command may be valid after its arrival.
func (v *Verifier) MaxTTL() time.Duration { return v.maxTTL }

// SetKeys replaces the keys at once: a command arriving from now on is
// checked against the new keys only; commands already admitted are not
// affected (they were checked on arrival). On error the keys in use stay.
func (v *Verifier) SetKeys(keys []Key) error {
	ring := make(map[string]*Key, len(keys))
	for i := range keys {
		k := keys[i]
		if !jws.ValidKeyID(k.ID) {
			return fmt.Errorf("%w: key id %q: want [A-Za-z0-9._:-]{1,64}", ErrInvalidKeys, k.ID)
		}
		if _, dup := ring[k.ID]; dup {
			return fmt.Errorf("%w: key id %q appears twice", ErrInvalidKeys, k.ID)
		}
		if len(k.Public) == 0 || len(k.Public) > jws.MaxKeysPerFile {
			return fmt.Errorf("%w: key %s: %d public keys, want 1 to %d", ErrInvalidKeys, k.ID, len(k.Public), jws.MaxKeysPerFile)
		}
		for _, p := range k.Public {
			if len(p) != ed25519.PublicKeySize {
				return fmt.Errorf("%w: key %s: not an Ed25519 public key", ErrInvalidKeys, k.ID)
			}
		}
		for _, g := range k.Devices {
			if _, err := path.Match(g, ""); err != nil {
				return fmt.Errorf("%w: key %s: devices glob %q: %v", ErrInvalidKeys, k.ID, g, err)
			}
		}
		ring[k.ID] = &k
	}
	v.ring.Store(&ring)
	return nil
}

// allows reports whether k may command dev.
func (k *Key) allows(dev string) bool {
	if len(k.Devices) == 0 {
		return true
	}
	for _, g := range k.Devices {
		if ok, _ := path.Match(g, dev); ok {
			return true
		}
	}
	return false
}

// Open checks a signed command that arrived on dev's cmd topic at now and
// returns the Command it carries and the ID of the key that signed it.
// The order: a compact JWS (alg EdDSA or Ed25519, no crit), a kid naming a
// configured key, that key allowed for dev, the signature verifying with
// it, then the binding: "gateway" and "device" equal to the topic's, and
// expires_at present and no later than now + MaxTTL. Anything else is an
// *Error (ErrUnauthorized). A message signed by an allowed key whose
// binding holds but which is not a valid Command is a *wire.ParseError
// (invalid): the signer is trusted, its command is malformed.
//
// Nothing is cached: every call verifies the signature, so a replay costs
// a verification like any command and then meets its record or its
// expiry (§6).
func (v *Verifier) Open(msg []byte, dev string, now time.Time) (wire.Command, string, error) {
	tok, err := jws.Parse(msg)
	if err != nil {
		return wire.Command{}, "", &Error{Reason: fmt.Sprintf("not a valid signed command: %v", err)}
	}
	kid := tok.Header.Kid
	k := (*v.ring.Load())[kid]
	switch {
	case kid == "":
		return wire.Command{}, "", &Error{Reason: "the JWS header names no key (kid)"}
	case k == nil:
		return wire.Command{}, kid, &Error{Reason: fmt.Sprintf("key %q is not configured (security.keys)", clip.String(kid, 64)), KeyID: kid}
	case !k.allows(dev):
		return wire.Command{}, kid, &Error{Reason: fmt.Sprintf("key %q may not command device %s", kid, dev), KeyID: kid}
	}
	verified := false
	for _, p := range k.Public {
		if tok.Verify(p) == nil {
			verified = true
			break
		}
	}
	if !verified {
		return wire.Command{}, kid, &Error{Reason: fmt.Sprintf("the signature does not verify with key %q", kid), KeyID: kid}
	}
	cmd, perr := wirefast.ParseCommand(tok.Payload)
	var b binding
	if perr == nil {
		b = binding{Gateway: cmd.Gateway, Device: cmd.Device, ExpiresAt: cmd.ExpiresAt}
	} else {
		b = readBinding(tok.Payload)
	}
	if err := v.bind(b, dev, now); err != nil {
		err.KeyID = kid
		return wire.Command{}, kid, err
	}
	if perr != nil {
		return wire.Command{}, kid, perr
	}
	return cmd, kid, nil
}

// binding is what ties a signed command to one topic and one time window.
type binding struct {
	Gateway   string     `json:"gateway"`
	Device    string     `json:"device"`
	ExpiresAt *time.Time `json:"expires_at"`
}

// readBinding reads the binding members of a payload that is not a valid
// Command, as far as they can be read (so that a malformed command by a
// trusted signer is answered invalid, and a malformed replay elsewhere
// unauthorized).
func readBinding(payload []byte) binding {
	var raw struct {
		Gateway   json.RawMessage `json:"gateway"`
		Device    json.RawMessage `json:"device"`
		ExpiresAt json.RawMessage `json:"expires_at"`
	}
	var b binding
	_ = json.Unmarshal(payload, &raw)
	_ = json.Unmarshal(raw.Gateway, &b.Gateway)
	_ = json.Unmarshal(raw.Device, &b.Device)
	var s string
	if json.Unmarshal(raw.ExpiresAt, &s) == nil {
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
			b.ExpiresAt = &t
		}
	}
	return b
}

func (v *Verifier) bind(b binding, dev string, now time.Time) *Error {
	switch {
	case b.Gateway != v.gw:
		return &Error{Reason: fmt.Sprintf("signed for gateway %q, not this gateway (%s)", clip.String(b.Gateway, 64), v.gw)}
	case b.Device != dev:
		return &Error{Reason: fmt.Sprintf("signed for device %q, not %s (the topic's)", clip.String(b.Device, 64), dev)}
	case b.ExpiresAt == nil:
		return &Error{Reason: "a signed command must carry expires_at"}
	case b.ExpiresAt.After(now.Add(v.maxTTL)):
		return &Error{Reason: fmt.Sprintf("expires_at %s is more than max_ttl (%s) after its arrival at %s",
			b.ExpiresAt.UTC().Format(time.RFC3339Nano), v.maxTTL, now.UTC().Format(time.RFC3339Nano))}
	}
	return nil
}

// Is reports whether err says a command is unauthorized.
func Is(err error) bool { return errors.Is(err, ErrUnauthorized) }
