package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"time"
)

// This file holds the coordination block (docs/protocol.md §7): the etcd
// cluster that issues the fences, which the agent uses to remember them
// beyond its own disk. Its defaults, checks and file reads are called from
// config.go's defaults, check and readFiles.

// Coordination is the coordination service. A nil Etcd means none: fences
// are remembered only by this gateway's disk.
type Coordination struct {
	Etcd *Etcd `yaml:"etcd"`
}

// Etcd is the etcd cluster that issues the fences (the controllers' lock
// service).
type Etcd struct {
	Endpoints    []string `yaml:"endpoints"`
	Prefix       string   `yaml:"prefix"`       // default "edge"
	DialTimeout  Duration `yaml:"dial_timeout"` // default 5s
	SessionTTL   Duration `yaml:"session_ttl"`  // default 10s
	Username     string   `yaml:"username"`     // with password_file
	PasswordFile string   `yaml:"password_file"`
	TLS          TLS      `yaml:"tls"`

	// Password is PasswordFile's content, read by validate.
	Password string `yaml:"-"`
	// TLSConfig is built from TLS by validate; nil for http:// endpoints
	// without TLS files.
	TLSConfig *tls.Config `yaml:"-"`
}

// Defaults of the coordination block.
const (
	DefaultCoordPrefix = "edge"
	DefaultDialTimeout = 5 * time.Second
	DefaultSessionTTL  = 10 * time.Second
)

// coordPrefixRe: path segments of safe characters, so every key the agent
// writes ({prefix}/gateways/{gw}, {prefix}/devices/{dev}/...) is what an
// operator reads in etcdctl, and no prefix is a prefix of another's keys
// by accident.
var coordPrefixRe = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}(/[A-Za-z0-9_.-]{1,64}){0,7}$`)

func (c *Config) defaultsCoordination() {
	e := c.Coordination.Etcd
	if e == nil {
		return
	}
	if e.Prefix == "" {
		e.Prefix = DefaultCoordPrefix
	}
	if e.DialTimeout == 0 {
		e.DialTimeout = Duration(DefaultDialTimeout)
	}
	if e.SessionTTL == 0 {
		e.SessionTTL = Duration(DefaultSessionTTL)
	}
}

func (c *Config) checkCoordination(p *Problems) {
	e := c.Coordination.Etcd
	if e == nil {
		return
	}
	const k = "coordination.etcd"
	if len(e.Endpoints) == 0 {
		p.Add(k+".endpoints", "at least one endpoint is required (http://host:2379 or https://host:2379)")
	}
	var https, plain bool
	for i, ep := range e.Endpoints {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			p.Add(fmt.Sprintf("%s.endpoints[%d]", k, i), "%q: want http://host:port or https://host:port", ep)
			continue
		}
		if _, port, err := net.SplitHostPort(u.Host); err != nil || port == "" {
			p.Add(fmt.Sprintf("%s.endpoints[%d]", k, i), "%q: the port is required (etcd's client port, usually 2379)", ep)
		}
		https = https || u.Scheme == "https"
		plain = plain || u.Scheme == "http"
	}
	if https && plain {
		p.Add(k+".endpoints", "mixes http:// and https://: one cluster speaks one of them")
	}
	if plain && (e.TLS.CAFile != "" || e.TLS.CertFile != "") {
		p.Add(k+".tls", "set, but the endpoints are http://: use https:// endpoints")
	}
	if !coordPrefixRe.MatchString(e.Prefix) {
		p.Add(k+".prefix", "%q: want path segments of [A-Za-z0-9_.-] separated by /, without a leading or trailing /", e.Prefix)
	}
	if e.DialTimeout < 0 {
		p.Add(k+".dial_timeout", "must be positive")
	}
	if e.SessionTTL.D() < 2*time.Second || e.SessionTTL.D() > time.Hour {
		p.Add(k+".session_ttl", "%s: must be from 2s to 1h (etcd leases are whole seconds)", e.SessionTTL.D())
	}
	if (e.Username == "") != (e.PasswordFile == "") {
		p.Add(k+".password_file", "username and password_file go together")
	}
	if (e.TLS.CertFile == "") != (e.TLS.KeyFile == "") {
		p.Add(k+".tls", "cert_file and key_file go together")
	}
}

// readCoordinationFiles reads the etcd password file and TLS files, so a
// wrong path or a bad certificate is a configuration error naming the key,
// not a failure to connect later.
func (c *Config) readCoordinationFiles(p *Problems) {
	e := c.Coordination.Etcd
	if e == nil {
		return
	}
	const k = "coordination.etcd"
	if e.PasswordFile != "" {
		b, err := ReadFile(e.PasswordFile)
		if err != nil {
			p.Add(k+".password_file", "%v", err)
		} else {
			e.Password = trimNewline(b)
		}
	}
	if len(e.Endpoints) == 0 {
		return
	}
	if u, _ := url.Parse(e.Endpoints[0]); u == nil || u.Scheme != "https" {
		return
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if e.TLS.CAFile != "" {
		b, err := ReadFile(e.TLS.CAFile)
		if err != nil {
			p.Add(k+".tls.ca_file", "%v", err)
			return
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			p.Add(k+".tls.ca_file", "%s: no PEM certificate in it", e.TLS.CAFile)
			return
		}
		tc.RootCAs = pool
	}
	if e.TLS.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(e.TLS.CertFile, e.TLS.KeyFile)
		if err != nil {
			p.Add(k+".tls.cert_file", "%v", err)
			return
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	e.TLSConfig = tc
}
