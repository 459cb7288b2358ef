package jws

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
)

func TestKeysRoundTrip(t *testing.T) {
	privPEM, pubPEM, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	priv, err := ParsePrivateKey(privPEM)
	if err != nil {
		t.Fatal(err)
	}
	pubs, err := ParsePublicKeys(append([]byte("# ctl-a\n"), pubPEM...))
	if err != nil || len(pubs) != 1 || !pubs[0].Equal(priv.Public()) {
		t.Fatalf("%v %v", pubs, err)
	}
	_, pub2, _ := GenerateKey()
	two, err := ParsePublicKeys(append(append([]byte{}, pubPEM...), pub2...))
	if err != nil || len(two) != 2 {
		t.Fatalf("two keys in one file: %d %v", len(two), err)
	}
}

func TestKeysRefused(t *testing.T) {
	privPEM, pubPEM, _ := GenerateKey()
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecDER, _ := x509.MarshalPKIXPublicKey(&ec.PublicKey)
	ecPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ecDER})
	ec8, _ := x509.MarshalPKCS8PrivateKey(ec)
	ec8PEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: ec8})
	for _, tt := range []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "no PEM"},
		{"a private key as public", privPEM, `"PRIVATE KEY", want "PUBLIC KEY"`},
		{"ECDSA", ecPEM, "want Ed25519"},
		{"garbage in the block", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte("xx")}), "PEM block 1"},
		{"five keys", bytes.Repeat(pubPEM, 5), "more than 4"},
	} {
		if _, err := ParsePublicKeys(tt.in); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
	for _, tt := range []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "no PEM"},
		{"a public key as private", pubPEM, `want "PRIVATE KEY"`},
		{"ECDSA", ec8PEM, "want Ed25519"},
	} {
		if _, err := ParsePrivateKey(tt.in); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("private %s: %v, want %q", tt.name, err, tt.want)
		}
	}
}

// FuzzParseKeys: neither parser panics, and a key either parser accepts
// is an Ed25519 key of the right size.
func FuzzParseKeys(f *testing.F) {
	privPEM, pubPEM, _ := GenerateKey()
	f.Add(pubPEM)
	f.Add(privPEM)
	f.Add(append(append([]byte("x\n"), pubPEM...), pubPEM...))
	f.Add([]byte("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if keys, err := ParsePublicKeys(b); err == nil {
			if len(keys) == 0 || len(keys) > MaxKeysPerFile {
				t.Fatalf("%d keys", len(keys))
			}
			for _, k := range keys {
				if len(k) != 32 {
					t.Fatalf("key of %d bytes", len(k))
				}
			}
		}
		if k, err := ParsePrivateKey(b); err == nil && len(k) != 64 {
			t.Fatalf("private key of %d bytes", len(k))
		}
	})
}
