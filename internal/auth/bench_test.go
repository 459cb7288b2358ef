package auth

import (
	"crypto/ed25519"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire/jws"
	"github.com/edge-agent/edge-agent/internal/wirefast"
)

// What a signed command costs the agent's intake over a plain one
// (BENCHMARKS.md, "Signed commands"): Open (JWS parse, key lookup, Ed25519
// verification, the command parse, the binding) against wirefast.ParseCommand
// of the same command unsigned, which the intake does either way.
// go test ./internal/auth -run XXX -bench Intake
func BenchmarkIntake(b *testing.B) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	v, err := New(Options{Gateway: "bench", Require: true, Keys: []Key{{ID: "bench", Public: []ed25519.PublicKey{pub}}}})
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	plain := command("bench", "d7", now.Add(time.Minute))
	signed, _ := jws.Sign(priv, "bench", plain)
	b.Run("unsigned", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := wirefast.ParseCommand(plain); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("signed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := v.Open(signed, "d7", now); err != nil {
				b.Fatal(err)
			}
		}
	})
}
