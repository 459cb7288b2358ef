package jws

import (
	"crypto/ed25519"
	"testing"

	jose "github.com/go-jose/go-jose/v4"
)

// The verification cost per command (BENCHMARKS.md, "Signed commands"):
// this package (Parse + Verify) against go-jose v4.1.9 (ParseSigned +
// Verify) on the same ~200-byte signed command, and Ed25519 alone, the
// floor both pay. go test ./wire/jws -run XXX -bench Verify
func BenchmarkVerify(b *testing.B) {
	pub := seedKey.Public().(ed25519.PublicKey)
	msg, err := Sign(seedKey, "ctl-a", []byte(cmd))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("jws", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			tok, err := Parse(msg)
			if err != nil || tok.Verify(pub) != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("go-jose", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sig, err := jose.ParseSignedCompact(string(msg), []jose.SignatureAlgorithm{jose.EdDSA})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := sig.Verify(pub); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ed25519-only", func(b *testing.B) {
		tok, _ := Parse(msg)
		for b.Loop() {
			if !ed25519.Verify(pub, tok.signed, tok.sig) {
				b.Fatal("no")
			}
		}
	})
	b.Run("parse-only", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Parse(msg); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestGoJoseAgrees: what Sign writes, go-jose verifies (the format is
// standard JWS, not this package's own), and what go-jose signs with
// EdDSA, this package verifies.
func TestGoJoseAgrees(t *testing.T) {
	pub := seedKey.Public().(ed25519.PublicKey)
	msg, _ := Sign(seedKey, "ctl-a", []byte(cmd))
	sig, err := jose.ParseSignedCompact(string(msg), []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		t.Fatal(err)
	}
	out, err := sig.Verify(pub)
	if err != nil || string(out) != cmd || sig.Signatures[0].Header.KeyID != "ctl-a" {
		t.Fatalf("go-jose: %v %s", err, out)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: seedKey}, (&jose.SignerOptions{}).WithHeader("kid", "ctl-b"))
	if err != nil {
		t.Fatal(err)
	}
	js, err := signer.Sign([]byte(cmd))
	if err != nil {
		t.Fatal(err)
	}
	compact, _ := js.CompactSerialize()
	tok, err := Parse([]byte(compact))
	if err != nil || tok.Verify(pub) != nil || tok.Header.Kid != "ctl-b" || string(tok.Payload) != cmd {
		t.Fatalf("go-jose's JWS: %v %+v", err, tok)
	}
}
