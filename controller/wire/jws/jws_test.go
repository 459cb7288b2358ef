package jws

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// seedKey is a fixed key, so the test vectors are stable.
var seedKey = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize))

const cmd = `{"op_id":"op-1","fence":42,"action":"set","params":{"rpm":1200},"gateway":"gw-1","device":"pump-7","expires_at":"2030-01-01T00:00:00Z"}`

func enc(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// forge builds a JWS with any header and payload, signed with key over the
// segments as written.
func forge(key ed25519.PrivateKey, header, payload string) string {
	in := enc(header) + "." + enc(payload)
	return in + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(key, []byte(in)))
}

func TestSignThenParseAndVerify(t *testing.T) {
	msg, err := Sign(seedKey, "ctl-a", []byte(cmd))
	if err != nil {
		t.Fatal(err)
	}
	h, _, _ := strings.Cut(string(msg), ".")
	if got, _ := base64.RawURLEncoding.DecodeString(h); string(got) != `{"alg":"EdDSA","kid":"ctl-a"}` {
		t.Fatalf("header %s, want exactly {\"alg\":\"EdDSA\",\"kid\":\"ctl-a\"}", got)
	}
	if !Looks(msg) || Looks([]byte(" \n{\"op_id\":1}")) || Looks(nil) {
		t.Fatal("Looks: a JWS looks like one, a JSON object and nothing do not")
	}
	tok, err := Parse(append(append([]byte(" "), msg...), '\n'))
	if err != nil {
		t.Fatal(err)
	}
	if tok.Header != (Header{Alg: AlgEdDSA, Kid: "ctl-a"}) || string(tok.Payload) != cmd {
		t.Fatalf("parsed %+v %s", tok.Header, tok.Payload)
	}
	if err := tok.Verify(seedKey.Public().(ed25519.PublicKey)); err != nil {
		t.Fatal(err)
	}
	_, other, _ := ed25519.GenerateKey(nil)
	if err := tok.Verify(other.Public().(ed25519.PublicKey)); !errors.Is(err, ErrSignature) {
		t.Fatalf("another key: %v, want ErrSignature", err)
	}
	if err := tok.Verify(ed25519.PublicKey("short")); !errors.Is(err, ErrSignature) {
		t.Fatalf("a short key: %v, want ErrSignature", err)
	}
	if _, err := Sign(seedKey, "bad kid", nil); !errors.Is(err, ErrKeyID) {
		t.Fatalf("Sign with kid %q: %v, want ErrKeyID", "bad kid", err)
	}
}

func TestAlgEd25519IsAccepted(t *testing.T) {
	tok, err := Parse([]byte(forge(seedKey, `{"kid":"k","alg":"Ed25519","typ":"x"}`, cmd)))
	if err != nil {
		t.Fatal(err)
	}
	if tok.Header.Alg != AlgEd25519 || tok.Verify(seedKey.Public().(ed25519.PublicKey)) != nil {
		t.Fatalf("%+v", tok.Header)
	}
}

func TestTamperedPayloadDoesNotVerify(t *testing.T) {
	msg, _ := Sign(seedKey, "ctl-a", []byte(cmd))
	parts := strings.Split(string(msg), ".")
	parts[1] = enc(strings.Replace(cmd, `"fence":42`, `"fence":9223372036854775807`, 1))
	tok, err := Parse([]byte(strings.Join(parts, ".")))
	if err != nil {
		t.Fatal(err)
	}
	if err := tok.Verify(seedKey.Public().(ed25519.PublicKey)); !errors.Is(err, ErrSignature) {
		t.Fatalf("tampered payload verified: %v", err)
	}
}

func TestParseRefuses(t *testing.T) {
	pub := seedKey.Public().(ed25519.PublicKey)
	good, _ := Sign(seedKey, "k", []byte(cmd))
	parts := strings.Split(string(good), ".")
	// HS256 with the public key as the HMAC secret: the classic key
	// confusion. It must be refused before any key is used.
	tests := []struct {
		name string
		in   string
		is   error
		want string
	}{
		{"alg none", enc(`{"alg":"none","kid":"k"}`) + "." + enc(cmd) + ".", ErrMalformed, "segment is empty"},
		{"alg none with a signature", forge(seedKey, `{"alg":"none","kid":"k"}`, cmd), ErrAlgorithm, `alg "none"`},
		{"alg HS256", forge(seedKey, `{"alg":"HS256","kid":"k"}`, cmd), ErrAlgorithm, `alg "HS256"`},
		{"alg RS256", forge(seedKey, `{"alg":"RS256","kid":"k"}`, cmd), ErrAlgorithm, "RS256"},
		{"alg eddsa lower case", forge(seedKey, `{"alg":"eddsa","kid":"k"}`, cmd), ErrAlgorithm, "eddsa"},
		{"alg missing", forge(seedKey, `{"kid":"k"}`, cmd), ErrAlgorithm, "no alg"},
		{"alg not a string", forge(seedKey, `{"alg":1,"kid":"k"}`, cmd), ErrAlgorithm, "alg 1"},
		{"crit", forge(seedKey, `{"alg":"EdDSA","kid":"k","crit":["b64"],"b64":false}`, cmd), ErrCritical, "crit"},
		{"duplicate alg", forge(seedKey, `{"alg":"HS256","alg":"EdDSA","kid":"k"}`, cmd), ErrMalformed, `"alg" appears twice`},
		{"kid not a string", forge(seedKey, `{"alg":"EdDSA","kid":7}`, cmd), ErrMalformed, "kid is not a string"},
		{"header not an object", forge(seedKey, `["alg","EdDSA"]`, cmd), ErrMalformed, "not a JSON object"},
		{"header with trailing data", forge(seedKey, `{"alg":"EdDSA"}{}`, cmd), ErrMalformed, "data after"},
		{"header not JSON", forge(seedKey, `{"alg":`, cmd), ErrMalformed, "not valid JSON"},
		{"two segments", parts[0] + "." + parts[1], ErrMalformed, "three segments"},
		{"four segments", string(good) + ".x", ErrMalformed, "three segments"},
		{"padding", parts[0] + "=." + parts[1] + "." + parts[2], ErrMalformed, "not base64url"},
		{"standard base64", strings.NewReplacer("-", "+", "_", "/").Replace(string(good)), ErrMalformed, ""},
		{"a newline inside", parts[0] + "\n." + parts[1] + "." + parts[2], ErrMalformed, "not base64url"},
		{"short signature", parts[0] + "." + parts[1] + "." + parts[2][:40], ErrMalformed, "signature"},
		{"non-canonical last character", parts[0] + "." + parts[1] + "." + parts[2][:85] + "x", ErrMalformed, "signature"},
		{"too large", strings.Repeat("a", MaxSize+1), ErrMalformed, "more than"},
		{"header too large", enc(`{"alg":"EdDSA","x":"`+strings.Repeat("y", MaxHeader)+`"}`) + "." + parts[1] + "." + parts[2], ErrMalformed, "header longer"},
		{"JSON", cmd, ErrMalformed, "three segments"},
		{"JSON with dots", `{"a":"x.y.z"}`, ErrMalformed, "not base64url"},
		{"empty", "", ErrMalformed, "three segments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok, err := Parse([]byte(tt.in))
			if err == nil {
				t.Fatalf("accepted (verifies: %v)", tok.Verify(pub))
			}
			if !errors.Is(err, tt.is) || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want %v containing %q", err, tt.is, tt.want)
			}
		})
	}
}

// FuzzParse: Parse never panics; what it accepts has an accepted alg,
// no crit, a 64-byte signature, and a header that encoding/json reads
// with the same alg and kid; Sign's output always parses back to its
// input and verifies.
func FuzzParse(f *testing.F) {
	good, _ := Sign(seedKey, "ctl-a", []byte(cmd))
	f.Add(good, []byte("ctl-a"))
	f.Add([]byte(forge(seedKey, `{"alg":"Ed25519","kid":"k","typ":"JOSE"}`, cmd)), []byte("k"))
	f.Add([]byte(forge(seedKey, `{"alg":"HS256","kid":"k"}`, cmd)), []byte("x"))
	f.Add([]byte(forge(seedKey, `{"alg":"EdDSA","crit":["b64"]}`, cmd)), []byte(""))
	f.Add([]byte(forge(seedKey, `{"alg":"EdDSA","alg":"none"}`, "")), []byte("a b"))
	f.Add([]byte("a.b.c"), []byte("k"))
	f.Add([]byte(".."), []byte("k"))
	f.Fuzz(func(t *testing.T, msg, kid []byte) {
		tok, err := Parse(msg)
		if err == nil {
			if tok.Header.Alg != AlgEdDSA && tok.Header.Alg != AlgEd25519 || len(tok.sig) != ed25519.SignatureSize {
				t.Fatalf("accepted %+v", tok.Header)
			}
			h64, _, _ := bytes.Cut(bytes.Trim(msg, " \t\r\n"), []byte("."))
			hb, _ := base64.RawURLEncoding.DecodeString(string(h64))
			var m map[string]any
			if json.Unmarshal(hb, &m) != nil || m["alg"] != tok.Header.Alg || m["crit"] != nil {
				t.Fatalf("encoding/json reads header %s differently from %+v", hb, tok.Header)
			}
			if k, ok := m["kid"]; ok && k != tok.Header.Kid {
				t.Fatalf("kid %v vs %q", k, tok.Header.Kid)
			}
		} else if !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v does not wrap ErrMalformed", err)
		}
		out, err := Sign(seedKey, string(kid), msg)
		if !ValidKeyID(string(kid)) {
			if err == nil {
				t.Fatalf("signed with kid %q", kid)
			}
			return
		}
		if len(msg) > MaxSize/2 {
			return
		}
		tok, err = Parse(out)
		if err != nil || !bytes.Equal(tok.Payload, msg) || tok.Header.Kid != string(kid) || tok.Verify(seedKey.Public().(ed25519.PublicKey)) != nil {
			t.Fatalf("Sign's output does not round-trip: %v", err)
		}
	})
}
