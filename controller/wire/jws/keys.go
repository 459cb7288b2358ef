package jws

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
)

// MaxKeysPerFile bounds how many public keys one file may hold (a key
// being rotated and its successor; docs/config.md, "Signed commands"):
// a forged command costs at most this many verifications.
const MaxKeysPerFile = 4

// ParsePublicKeys reads Ed25519 public keys in PKIX PEM ("PUBLIC KEY"
// blocks), one or more (at most MaxKeysPerFile). Text around the blocks
// is ignored; any block of another type, a key of another algorithm or
// nothing at all is an error naming the problem.
func ParsePublicKeys(b []byte) ([]ed25519.PublicKey, error) {
	var keys []ed25519.PublicKey
	for n := 1; ; n++ {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("PEM block %d is %q, want \"PUBLIC KEY\" (PKIX)", n, blk.Type)
		}
		k, err := x509.ParsePKIXPublicKey(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("PEM block %d: %w", n, err)
		}
		pub, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("PEM block %d is a %T key, want Ed25519", n, k)
		}
		if len(keys) == MaxKeysPerFile {
			return nil, fmt.Errorf("more than %d keys", MaxKeysPerFile)
		}
		keys = append(keys, pub)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("no PEM \"PUBLIC KEY\" block")
	}
	return keys, nil
}

// ParsePrivateKey reads one Ed25519 private key in PKCS#8 PEM ("PRIVATE
// KEY").
func ParsePrivateKey(b []byte) (ed25519.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("no PEM block")
	}
	if blk.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("PEM block is %q, want \"PRIVATE KEY\" (PKCS#8)", blk.Type)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, err
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("a %T key, want Ed25519", k)
	}
	return priv, nil
}

// GenerateKey returns a new Ed25519 key pair as PEM: the private key in
// PKCS#8 ("PRIVATE KEY"), the public key in PKIX ("PUBLIC KEY"), the
// forms edgectl keygen writes and the agent reads.
func GenerateKey() (privPEM, pubPEM []byte, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	return MarshalKeys(priv, pub)
}

// MarshalKeys encodes a key pair as GenerateKey does.
func MarshalKeys(priv ed25519.PrivateKey, pub ed25519.PublicKey) (privPEM, pubPEM []byte, err error) {
	p8, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, nil, err
	}
	px, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, nil, err
	}
	var a, b bytes.Buffer
	pem.Encode(&a, &pem.Block{Type: "PRIVATE KEY", Bytes: p8})
	pem.Encode(&b, &pem.Block{Type: "PUBLIC KEY", Bytes: px})
	return a.Bytes(), b.Bytes(), nil
}
