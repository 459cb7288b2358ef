package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire/jws"
	"github.com/edge-agent/edge-agent/internal/config"
	_ "github.com/edge-agent/edge-agent/internal/device" // registers kind: http
	_ "github.com/edge-agent/edge-agent/internal/mqtt"   // registers the broker's file format
)

const secDev = "devices:\n  - {id: pump-7, type: pump, driver: {url: \"http://x\"}}\n"

// keyFiles writes a key pair and returns the public and private files.
func keyFiles(t *testing.T, dir, name string) (pub, priv string) {
	t.Helper()
	privPEM, pubPEM, err := jws.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	pub, priv = filepath.Join(dir, name+".pub"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(pub, pubPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(priv, privPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

func TestSecurityKeysLoad(t *testing.T) {
	dir := t.TempDir()
	pa, _ := keyFiles(t, dir, "a")
	pb, rk := keyFiles(t, dir, "b")
	c, err := config.Parse([]byte(`gateway_id: gw-1
mqtt: {broker: embedded}
security:
  keys:
    - {id: ctl-a, public_key_file: "` + pa + `", devices: ["pump-*"]}
    - {id: ctl-b, public_key_file: "` + pb + `"}
  result_key_file: "` + rk + `"
` + secDev))
	if err != nil {
		t.Fatal(err)
	}
	s := c.Security
	if !s.Signed() || s.MaxTTL.D() != 15*time.Minute || len(s.Keys) != 2 || len(s.Keys[0].Public) != 1 || len(s.ResultKey) != 64 {
		t.Fatalf("security: %+v", s)
	}
	if got := s.Keys[1].Devices; len(got) != 1 || got[0] != "*" {
		t.Fatalf("devices default %v, want [*]", got)
	}
	c, err = config.Parse([]byte("gateway_id: g\nmqtt: {broker: embedded}\n" + secDev))
	if err != nil || c.Security.Signed() {
		t.Fatalf("without keys, signatures are not required by default: %v %v", err, c.Security.Signed())
	}
}

func TestSecurityProblemsNameTheKey(t *testing.T) {
	dir := t.TempDir()
	pa, priv := keyFiles(t, dir, "a")
	garbage := filepath.Join(dir, "garbage.pub")
	os.WriteFile(garbage, []byte("not a key"), 0o644)
	base := "gateway_id: g\nmqtt: {broker: embedded}\n"
	for _, tc := range []struct{ name, yaml, want string }{
		{"a bad key file", base + "security: {keys: [{id: ctl-a, public_key_file: \"" + garbage + "\"}]}\n" + secDev,
			"security.keys[0] (ctl-a).public_key_file: " + garbage + ": no PEM \"PUBLIC KEY\" block"},
		{"a private key as public", base + "security: {keys: [{id: ctl-a, public_key_file: \"" + priv + "\"}]}\n" + secDev,
			"security.keys[0] (ctl-a).public_key_file"},
		{"a missing key file", base + "security: {keys: [{id: ctl-a, public_key_file: /nonexistent.pub}]}\n" + secDev,
			"security.keys[0] (ctl-a).public_key_file: open /nonexistent.pub"},
		{"a key file that is a device", base + "security: {keys: [{id: ctl-a, public_key_file: /dev/zero}]}\n" + secDev,
			"/dev/zero: not a regular file"},
		{"bad key id", base + "security: {keys: [{id: \"a b\", public_key_file: \"" + pa + "\"}]}\n" + secDev, "security.keys[0] (a b).id"},
		{"duplicate key id", base + "security: {keys: [{id: a, public_key_file: \"" + pa + "\"}, {id: a, public_key_file: \"" + pa + "\"}]}\n" + secDev,
			"security.keys[1] (a).id: duplicate key id \"a\" (also security.keys[0])"},
		{"bad glob", base + "security: {keys: [{id: a, public_key_file: \"" + pa + "\", devices: [\"[x\"]}]}\n" + secDev, "security.keys[0] (a).devices"},
		{"required without keys", base + "security: {require_signed: true}\n" + secDev, "security.require_signed"},
		{"retention shorter than max_ttl", base + "dedup: {retention: 10m}\nsecurity: {max_ttl: 15m}\n" + secDev, "dedup.retention: 10m0s is shorter than security.max_ttl (15m0s)"},
		{"bad result key", base + "security: {result_key_file: \"" + pa + "\"}\n" + secDev, "security.result_key_file"},
		{"embedded keys with tcp", "gateway_id: g\nmqtt: {broker: \"tcp://h:1\", embedded_password_file: x}\n" + secDev, "mqtt.embedded_password_file: only with broker: embedded"},
		{"embedded broker off loopback, anonymous", "gateway_id: g\nmqtt: {broker: embedded, embedded_listen: \"0.0.0.0:1883\"}\n" + secDev,
			"mqtt.embedded_listen: \"0.0.0.0:1883\" is not a loopback address: set mqtt.embedded_password_file"},
		{"embedded broker on every address", "gateway_id: g\nmqtt: {broker: embedded, embedded_listen: \":1883\"}\n" + secDev, "mqtt.embedded_listen"},
		{"a bad password file", "gateway_id: g\nmqtt: {broker: embedded, embedded_password_file: \"" + garbage + "\"}\n" + secDev, "mqtt.embedded_password_file: " + garbage + ": mosq: malformed file: line 1"},
		{"a bad ACL file", "gateway_id: g\nmqtt: {broker: embedded, embedded_acl_file: \"" + garbage + "\"}\n" + secDev, "mqtt.embedded_acl_file"},
		{"TLS without key", "gateway_id: g\nmqtt: {broker: embedded, embedded_tls: {cert_file: a}}\n" + secDev, "mqtt.embedded_tls"},
		{"TLS files unreadable", "gateway_id: g\nmqtt: {broker: embedded, embedded_tls: {cert_file: /nonexistent, key_file: /nonexistent}}\n" + secDev, "mqtt.embedded_tls: cert_file /nonexistent"},
		{"admin off loopback without a token", base + "admin: {listen: \"0.0.0.0:9464\"}\n" + secDev, "admin.token: required when admin.listen (\"0.0.0.0:9464\") is not a loopback address"},
		{"admin allowed host with a port", base + "admin: {allowed_hosts: [gw-1.example, \"gw-1:9464\"]}\n" + secDev, "admin.allowed_hosts[1]: \"gw-1:9464\": want a host name"},
		{"admin allowed host wildcard", base + "admin: {allowed_hosts: [\"*\"]}\n" + secDev, "admin.allowed_hosts[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.yaml))
			if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want config.ErrInvalid naming %q", err, tc.want)
			}
		})
	}
	// What the rules allow.
	for _, ok := range []string{
		"gateway_id: g\nmqtt: {broker: embedded, embedded_listen: \"0.0.0.0:1883\", embedded_allow_anonymous: true}\n" + secDev,
		"gateway_id: g\nmqtt: {broker: embedded, embedded_listen: \"localhost:1883\"}\n" + secDev,
		"gateway_id: g\nmqtt: {broker: embedded, embedded_listen: \"[::1]:1883\"}\n" + secDev,
		base + "admin: {listen: \"0.0.0.0:9464\", token: t}\n" + secDev,
		base + "admin: {listen: \"\"}\n" + secDev,
		base + "admin: {allowed_hosts: [gw-1.plant.example, localhost]}\n" + secDev,
		base + "dedup: {retention: 15m}\n" + secDev,
	} {
		if _, err := config.Parse([]byte(ok)); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}

// FuzzParse: decoding and validating any document never panics, and a
// document it accepts has its defaults filled in.
func FuzzParse(f *testing.F) {
	f.Add([]byte("gateway_id: g\nmqtt: {broker: embedded}\n" + secDev))
	f.Add([]byte("gateway_id: g\nmqtt: {broker: embedded, embedded_listen: \"0.0.0.0:1\", embedded_allow_anonymous: true}\nsecurity: {keys: [{id: a, public_key_file: /dev/null, devices: [\"p-*\"]}], max_ttl: 1m}\n" + secDev))
	f.Add([]byte("gateway_id: g\nmqtt: {broker: \"tcp://h:1\"}\nadmin: {listen: \":9\", token: x}\ndedup: {retention: 1s}\n" + secDev))
	f.Add([]byte("security: {keys: [null, {id: \"\"}], require_signed: true}\ndevices: [null]\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := config.Parse(b)
		if err != nil {
			if !errors.Is(err, config.ErrInvalid) {
				t.Fatalf("error %v does not wrap config.ErrInvalid", err)
			}
			return
		}
		if c.Security.RequireSigned == nil || c.Security.MaxTTL <= 0 || c.DataDir == "" {
			t.Fatalf("defaults missing: %+v", c.Security)
		}
	})
}
