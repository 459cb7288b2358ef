package jws

import (
	"bytes"
	"crypto/ed25519"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestPythonSignersMatch runs the Python signers of docs/controller.md
// ("Signing in another language") and checks that each writes, for the
// same key, key ID and payload, exactly the bytes Sign writes (Ed25519 is
// deterministic), which Parse and Verify accept. The joserfc one runs
// where an interpreter has joserfc (skipped, said so, elsewhere); the
// cryptography one needs python3-cryptography, which .ci/run installs.
func TestPythonSignersMatch(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/controller.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```python\n(.*?)```").FindAllSubmatch(doc, -1)
	if len(blocks) != 2 {
		t.Fatalf("docs/controller.md has %d python blocks, want 2 (joserfc, cryptography)", len(blocks))
	}
	dir := t.TempDir()
	privPEM, _, err := marshalKeysOf(seedKey)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "ctl-a.key")
	os.WriteFile(keyFile, privPEM, 0o600)
	payloadFile := filepath.Join(dir, "payload.json")
	os.WriteFile(payloadFile, []byte(cmd), 0o600)
	want, err := Sign(seedKey, "ctl-a", []byte(cmd))
	if err != nil {
		t.Fatal(err)
	}
	for i, lib := range []string{"joserfc", "cryptography"} {
		t.Run(lib, func(t *testing.T) {
			py := python(lib)
			if py == "" {
				if lib == "joserfc" {
					t.Skipf("no python3 with %s here (pip install joserfc); the cryptography signer is checked", lib)
				}
				t.Fatalf("no python3 with %s (apt-get install python3-cryptography)", lib)
			}
			snippet := filepath.Join(dir, lib+".py")
			os.WriteFile(snippet, blocks[i][1], 0o600)
			if !bytes.Contains(blocks[i][1], []byte("import "+lib)) && !bytes.Contains(blocks[i][1], []byte("from "+lib)) {
				t.Fatalf("python block %d does not use %s", i+1, lib)
			}
			prog := "import sys\nexec(open(sys.argv[1]).read())\n" +
				"sys.stdout.write(sign(open(sys.argv[2], 'rb').read(), open(sys.argv[3], 'rb').read(), 'ctl-a'))\n"
			out, err := exec.Command(py, "-W", "ignore", "-c", prog, snippet, payloadFile, keyFile).Output()
			if err != nil {
				t.Fatalf("%s: %v", py, err)
			}
			if got := strings.TrimSpace(string(out)); got != string(want) {
				t.Fatalf("the %s signer differs from Sign:\n got %s\nwant %s", lib, got, want)
			}
			tok, err := Parse(out)
			if err != nil || tok.Verify(seedKey.Public().(ed25519.PublicKey)) != nil {
				t.Fatalf("not accepted: %v", err)
			}
		})
	}
}

// python returns an interpreter that imports mod ("" when none does).
func python(mod string) string {
	for _, p := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(p, "-c", "import "+mod).Run() == nil {
			return p
		}
	}
	return ""
}

// marshalKeysOf is MarshalKeys for a private key alone.
func marshalKeysOf(priv ed25519.PrivateKey) ([]byte, []byte, error) {
	return MarshalKeys(priv, priv.Public().(ed25519.PublicKey))
}
