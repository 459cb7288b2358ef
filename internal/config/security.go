package config

import (
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire/jws"
)

// This file holds the keys added on 2026-12-01 (docs/protocol.md §3, §5 and
// §6): signed commands (security), the embedded broker's authentication,
// ACL and TLS, and the access rules that depend on a listener being
// loopback. Their defaults, checks and file reads are called from
// config.go's defaults, check and readFiles.

// Security is signed commands (docs/protocol.md §6).
type Security struct {
	Keys []*Key `yaml:"keys"`
	// RequireSigned: nil means true when Keys is not empty, else false.
	RequireSigned *bool    `yaml:"require_signed"`
	MaxTTL        Duration `yaml:"max_ttl"` // default 15m
	// ResultKeyFile is the gateway's Ed25519 private key (PKCS#8 PEM):
	// when set, Results and DeviceStates are published signed.
	ResultKeyFile string `yaml:"result_key_file"`

	// ResultKey is ResultKeyFile's key, read by validate.
	ResultKey ed25519.PrivateKey `yaml:"-"`
}

// Key is one controller key.
type Key struct {
	ID            string   `yaml:"id"`
	PublicKeyFile string   `yaml:"public_key_file"`
	Devices       []string `yaml:"devices"` // path.Match globs; empty: every device

	// Public is PublicKeyFile's keys, read by validate (ReadKeys on reload).
	Public []ed25519.PublicKey `yaml:"-"`
}

// EmbeddedTLS makes the embedded broker's listener TLS.
type EmbeddedTLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile, when set, makes client certificates signed by it
	// required.
	ClientCAFile string `yaml:"client_ca_file"`
}

// Embedded is what readFiles read of the embedded broker's files.
type Embedded struct {
	// Passwords and ACL are embedded_password_file's and
	// embedded_acl_file's contents, checked by the broker's format
	// (RegisterBrokerFormat); nil: none.
	Passwords []byte
	ACL       []byte
	TLS       *tls.Config // embedded_tls; nil: plain TCP
}

// BrokerFormat checks the embedded broker's password and ACL files: their
// format is the broker's, which registers it (RegisterBrokerFormat), so
// that config depends on no broker. Each error says what is wrong where
// ("line 3: ...").
type BrokerFormat struct {
	Passwords func([]byte) error
	ACL       func([]byte) error
}

var brokerFormat struct {
	sync.RWMutex
	f *BrokerFormat
}

// RegisterBrokerFormat sets the format of the embedded broker's files; the
// broker's package calls it from init.
func RegisterBrokerFormat(f BrokerFormat) {
	brokerFormat.Lock()
	defer brokerFormat.Unlock()
	brokerFormat.f = &f
}

// registeredBrokerFormat is the format of the embedded broker's files; it
// panics when the program registered none (it must import the broker's
// package).
func registeredBrokerFormat() *BrokerFormat {
	brokerFormat.RLock()
	defer brokerFormat.RUnlock()
	if brokerFormat.f == nil {
		panic("config: no embedded broker file format registered (import internal/mqtt)")
	}
	return brokerFormat.f
}

// DefaultMaxTTL is security.max_ttl's default.
const DefaultMaxTTL = 15 * time.Minute

// MaxFileSize bounds every file the configuration names (keys, passwords,
// ACLs, certificates): a mistaken path to a device or a huge file is an
// error, not a hang.
const MaxFileSize = 1 << 20

// Signed reports whether commands must be signed (security.require_signed
// with its default).
func (s *Security) Signed() bool { return s.RequireSigned != nil && *s.RequireSigned }

func (c *Config) defaultsSecurity() {
	s := &c.Security
	if s.RequireSigned == nil {
		r := len(s.Keys) > 0
		s.RequireSigned = &r
	}
	if s.MaxTTL == 0 {
		s.MaxTTL = Duration(DefaultMaxTTL)
	}
	for _, k := range s.Keys {
		if k != nil && len(k.Devices) == 0 {
			k.Devices = []string{"*"}
		}
	}
}

// IsLoopback reports whether a listen address (host:port) accepts
// connections from this host only: its host is a loopback IP or
// "localhost". An empty host (":1883") listens on every address.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (c *Config) checkSecurity(p *Problems) {
	s := &c.Security
	seen := map[string]int{}
	for i, k := range s.Keys {
		key := fmt.Sprintf("security.keys[%d]", i)
		if k == nil {
			p.Add(key, "empty entry")
			continue
		}
		if k.ID != "" {
			key = fmt.Sprintf("security.keys[%d] (%s)", i, k.ID)
		}
		switch j, dup := seen[k.ID]; {
		case k.ID == "":
			p.Add(key+".id", "required")
		case !jws.ValidKeyID(k.ID):
			p.Add(key+".id", "%q must match [A-Za-z0-9._:-]{1,64}", k.ID)
		case dup:
			p.Add(key+".id", "duplicate key id %q (also security.keys[%d])", k.ID, j)
		default:
			seen[k.ID] = i
		}
		if k.PublicKeyFile == "" {
			p.Add(key+".public_key_file", "required")
		}
		for _, g := range k.Devices {
			if _, err := path.Match(g, ""); err != nil || g == "" {
				p.Add(key+".devices", "%q is not a path.Match glob", g)
			}
		}
	}
	if s.Signed() && len(s.Keys) == 0 {
		p.Add("security.require_signed", "true, but security.keys is empty: every command would be unauthorized")
	}
	if s.MaxTTL <= 0 {
		p.Add("security.max_ttl", "must be positive")
	} else if c.Dedup.Retention > 0 && c.Dedup.Retention < s.MaxTTL {
		p.Add("dedup.retention", "%s is shorter than security.max_ttl (%s): a replay of a signed command must meet either its record or its expiry",
			c.Dedup.Retention.D(), s.MaxTTL.D())
	}

	m := &c.MQTT
	embedded := m.Broker == "embedded"
	if !embedded {
		for _, k := range []struct {
			name string
			set  bool
		}{
			{"embedded_password_file", m.EmbeddedPasswordFile != ""},
			{"embedded_acl_file", m.EmbeddedACLFile != ""},
			{"embedded_tls", m.EmbeddedTLS != (EmbeddedTLS{})},
			{"embedded_allow_anonymous", m.EmbeddedAllowAnonymous},
		} {
			if k.set {
				p.Add("mqtt."+k.name, "only with broker: embedded")
			}
		}
	} else if !IsLoopback(m.EmbeddedListen) && m.EmbeddedPasswordFile == "" && !m.EmbeddedAllowAnonymous {
		p.Add("mqtt.embedded_listen", "%q is not a loopback address: set mqtt.embedded_password_file (or embedded_allow_anonymous: true to accept anonymous clients from the network)", m.EmbeddedListen)
	}
	if t := m.EmbeddedTLS; (t.CertFile == "") != (t.KeyFile == "") || (t.ClientCAFile != "" && t.CertFile == "") {
		p.Add("mqtt.embedded_tls", "cert_file and key_file go together (and client_ca_file needs them)")
	}

	for i, h := range c.Admin.AllowedHosts {
		if h == "" || strings.ContainsAny(h, ":/ *") {
			p.Add(fmt.Sprintf("admin.allowed_hosts[%d]", i), "%q: want a host name as a browser sends it in Host, without scheme, port or wildcard", h)
		}
	}
	if l := c.Admin.Listen; l != "" && !IsLoopback(l) && c.Admin.Token == "" {
		p.Add("admin.token", "required when admin.listen (%q) is not a loopback address (docs/protocol.md §3)", l)
	}
}

// readSecurityFiles reads the key files (a bad one is a problem naming the
// key) and the embedded broker's password, ACL and TLS files.
func (c *Config) readSecurityFiles(p *Problems) {
	c.readEmbeddedFiles(p)
	s := &c.Security
	for i, k := range s.Keys {
		pub, err := ReadKey(k)
		if err != nil {
			p.Add(fmt.Sprintf("security.keys[%d] (%s).public_key_file", i, k.ID), "%v", err)
			continue
		}
		k.Public = pub
	}
	if s.ResultKeyFile != "" {
		b, err := ReadFile(s.ResultKeyFile)
		if err == nil {
			s.ResultKey, err = jws.ParsePrivateKey(b)
			if err != nil {
				err = fmt.Errorf("%s: %w", s.ResultKeyFile, err)
			}
		}
		if err != nil {
			p.Add("security.result_key_file", "%v", err)
		}
	}
}

func (c *Config) readEmbeddedFiles(p *Problems) {
	m := &c.MQTT
	if f := m.EmbeddedPasswordFile; f != "" {
		b, err := ReadFile(f)
		if err == nil {
			err = registeredBrokerFormat().Passwords(b)
		}
		if err == nil {
			m.Embedded.Passwords = b
		} else {
			p.Add("mqtt.embedded_password_file", "%s: %v", f, err)
		}
	}
	if f := m.EmbeddedACLFile; f != "" {
		b, err := ReadFile(f)
		if err == nil {
			err = registeredBrokerFormat().ACL(b)
		}
		if err == nil {
			m.Embedded.ACL = b
		} else {
			p.Add("mqtt.embedded_acl_file", "%s: %v", f, err)
		}
	}
	if t := m.EmbeddedTLS; t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			p.Add("mqtt.embedded_tls", "cert_file %s, key_file %s: %v", t.CertFile, t.KeyFile, err)
			return
		}
		cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if t.ClientCAFile != "" {
			b, err := ReadFile(t.ClientCAFile)
			pool := x509.NewCertPool()
			if err == nil && !pool.AppendCertsFromPEM(b) {
				err = fmt.Errorf("%s: no PEM certificate", t.ClientCAFile)
			}
			if err != nil {
				p.Add("mqtt.embedded_tls.client_ca_file", "%v", err)
				return
			}
			cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
		}
		m.Embedded.TLS = cfg
	}
}

// ReadKey reads a key's public key file (at start-up, and again on
// SIGHUP). The error names the file and the problem.
func ReadKey(k *Key) ([]ed25519.PublicKey, error) {
	b, err := ReadFile(k.PublicKeyFile)
	if err != nil {
		return nil, err
	}
	pub, err := jws.ParsePublicKeys(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", k.PublicKeyFile, err)
	}
	return pub, nil
}

// ReadFile reads a regular file named by the configuration, at most
// MaxFileSize bytes.
func ReadFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", name)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxFileSize {
		return nil, fmt.Errorf("%s: larger than %d bytes", name, MaxFileSize)
	}
	return b, nil
}

// trimNewline drops a file's trailing line end.
func trimNewline(b []byte) string { return strings.TrimRight(string(b), "\r\n") }
