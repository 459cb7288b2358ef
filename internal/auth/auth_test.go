package auth

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
)

var now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

type keypair struct {
	priv ed25519.PrivateKey
	pub  ed25519.PublicKey
}

func newKey(t *testing.T) keypair {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return keypair{priv, pub}
}

func command(gw, dev string, exp time.Time) []byte {
	b, _ := json.Marshal(map[string]any{"op_id": "op-1", "fence": 7, "action": "set", "params": map[string]int{"rpm": 10},
		"gateway": gw, "device": dev, "expires_at": exp.Format(time.RFC3339Nano)})
	return b
}

func sign(t *testing.T, k keypair, kid string, payload []byte) []byte {
	b, err := jws.Sign(k.priv, kid, payload)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestOpen(t *testing.T) {
	a, b, rogue := newKey(t), newKey(t), newKey(t)
	v, err := New(Options{Gateway: "gw-1", Require: true, MaxTTL: 15 * time.Minute, Keys: []Key{
		{ID: "ctl-a", Public: []ed25519.PublicKey{a.pub}, Devices: []string{"pump-*"}},
		{ID: "ctl-b", Public: []ed25519.PublicKey{b.pub}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ok := command("gw-1", "pump-7", now.Add(time.Minute))
	good := sign(t, a, "ctl-a", ok)
	parts := strings.Split(string(good), ".")
	tampered := parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(ok), `"fence":7`, `"fence":9223372036854775807`, 1))) + "." + parts[2]
	hs := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"HS256","kid":"ctl-a"}`)) + "." + parts[1] + "." + parts[2]
	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","kid":"ctl-a"}`)) + "." + parts[1] + "."
	invalidSigned := []byte(`{"op_id":"op-1","fence":0,"action":"set","gateway":"gw-1","device":"pump-7","expires_at":"` + now.Add(time.Minute).Format(time.RFC3339) + `"}`)

	tests := []struct {
		name string
		msg  []byte
		dev  string
		want string // substring of the unauthorized reason; "" = accepted
		kid  string
	}{
		{"valid", good, "pump-7", "", "ctl-a"},
		{"valid, key for every device", sign(t, b, "ctl-b", command("gw-1", "valve-1", now.Add(time.Minute))), "valve-1", "", "ctl-b"},
		{"tampered payload", []byte(tampered), "pump-7", `does not verify with key "ctl-a"`, "ctl-a"},
		{"wrong kid (another configured key)", sign(t, a, "ctl-b", ok), "pump-7", `does not verify with key "ctl-b"`, "ctl-b"},
		{"unknown kid", sign(t, a, "ctl-z", ok), "pump-7", `key "ctl-z" is not configured`, "ctl-z"},
		{"no kid", []byte(base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"EdDSA"}`)) + "." + parts[1] + "." + parts[2]), "pump-7", "names no key", ""},
		{"a rogue key under a real kid", sign(t, rogue, "ctl-a", ok), "pump-7", "does not verify", "ctl-a"},
		{"key not allowed for the device", sign(t, a, "ctl-a", command("gw-1", "valve-1", now.Add(time.Minute))), "valve-1", `key "ctl-a" may not command device valve-1`, "ctl-a"},
		{"alg none", []byte(none), "pump-7", "not a valid signed command", ""},
		{"alg HS256 with the public key as secret", []byte(hs), "pump-7", "algorithm not accepted", ""},
		{"for another gateway", sign(t, a, "ctl-a", command("gw-2", "pump-7", now.Add(time.Minute))), "pump-7", `signed for gateway "gw-2"`, "ctl-a"},
		{"for another device (replayed on pump-8's topic)", good, "pump-8", `signed for device "pump-7", not pump-8`, "ctl-a"},
		{"no gateway", sign(t, a, "ctl-a", []byte(`{"op_id":"o","fence":1,"action":"set","device":"pump-7","expires_at":"2030-01-01T00:00:00Z"}`)), "pump-7", `signed for gateway ""`, "ctl-a"},
		{"no expires_at", sign(t, a, "ctl-a", []byte(`{"op_id":"o","fence":1,"action":"set","gateway":"gw-1","device":"pump-7"}`)), "pump-7", "must carry expires_at", "ctl-a"},
		{"expires_at beyond max_ttl", sign(t, a, "ctl-a", command("gw-1", "pump-7", now.Add(16*time.Minute))), "pump-7", "more than max_ttl (15m0s)", "ctl-a"},
		{"expires_at exactly at max_ttl", sign(t, a, "ctl-a", command("gw-1", "pump-7", now.Add(15*time.Minute))), "pump-7", "", "ctl-a"},
		{"already expired is not unauthorized (the worker answers expired)", sign(t, a, "ctl-a", command("gw-1", "pump-7", now.Add(-time.Minute))), "pump-7", "", "ctl-a"},
		{"plain JSON", ok, "pump-7", "not a valid signed command", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd, kid, err := v.Open(tt.msg, tt.dev, now)
			if kid != tt.kid {
				t.Errorf("kid %q, want %q", kid, tt.kid)
			}
			if tt.want == "" {
				if err != nil || cmd.OpID != "op-1" || cmd.Fence != 7 {
					t.Fatalf("refused: %v %+v", err, cmd)
				}
				return
			}
			var ae *Error
			if !errors.As(err, &ae) || !errors.Is(err, ErrUnauthorized) || !strings.Contains(ae.Reason, tt.want) {
				t.Fatalf("err %v, want unauthorized %q", err, tt.want)
			}
			if cmd.OpID != "" {
				t.Fatalf("an unauthorized command came back: %+v", cmd)
			}
		})
	}
	// Signed by an allowed key, bound, but not a valid command: invalid.
	_, _, err = v.Open(sign(t, a, "ctl-a", invalidSigned), "pump-7", now)
	var pe *wire.ParseError
	if !errors.As(err, &pe) || Is(err) || !strings.Contains(pe.Reason, "fence") {
		t.Fatalf("a malformed signed command: %v, want a ParseError about fence", err)
	}
	// The same, replayed on another device's topic: unauthorized first.
	if _, _, err = v.Open(sign(t, a, "ctl-a", invalidSigned), "pump-8", now); !Is(err) {
		t.Fatalf("a malformed signed command on another topic: %v, want unauthorized", err)
	}
}

func TestSetKeysRotatesAndKeepsOnError(t *testing.T) {
	old, cur := newKey(t), newKey(t)
	v, err := New(Options{Gateway: "gw-1", Keys: []Key{{ID: "ctl-a", Public: []ed25519.PublicKey{old.pub}}}})
	if err != nil {
		t.Fatal(err)
	}
	if v.Required() || v.MaxTTL() != DefaultMaxTTL {
		t.Fatalf("defaults: required %v, max_ttl %v", v.Required(), v.MaxTTL())
	}
	msg := func(k keypair) []byte { return sign(t, k, "ctl-a", command("gw-1", "d", now.Add(time.Minute))) }
	if _, _, err := v.Open(msg(old), "d", now); err != nil {
		t.Fatal(err)
	}
	// Both keys while rotating.
	if err := v.SetKeys([]Key{{ID: "ctl-a", Public: []ed25519.PublicKey{old.pub, cur.pub}}}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []keypair{old, cur} {
		if _, _, err := v.Open(msg(k), "d", now); err != nil {
			t.Fatalf("during rotation: %v", err)
		}
	}
	if err := v.SetKeys([]Key{{ID: "ctl-a", Public: []ed25519.PublicKey{cur.pub}}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := v.Open(msg(old), "d", now); !Is(err) {
		t.Fatalf("the retired key: %v", err)
	}
	for _, bad := range [][]Key{
		{{ID: "bad id", Public: []ed25519.PublicKey{cur.pub}}},
		{{ID: "a", Public: []ed25519.PublicKey{cur.pub}}, {ID: "a", Public: []ed25519.PublicKey{cur.pub}}},
		{{ID: "a"}},
		{{ID: "a", Public: []ed25519.PublicKey{cur.pub}, Devices: []string{"[x"}}},
	} {
		if err := v.SetKeys(bad); !errors.Is(err, ErrInvalidKeys) {
			t.Fatalf("SetKeys(%+v): %v", bad, err)
		}
	}
	if _, _, err := v.Open(msg(cur), "d", now); err != nil {
		t.Fatalf("the keys in use were not kept after a refused SetKeys: %v", err)
	}
}
