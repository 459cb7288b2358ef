package main

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
	"github.com/edge-agent/edge-agent/internal/config"
)

// mqttFlags are the flags every command that talks MQTT takes
// (docs/protocol.md §4, added 2026-12-01), with their environment
// variables: a flag given wins over its variable.
type mqttFlags struct {
	broker, cafile, cert, key, username, passwordFile string
	gatewayKey                                        string
}

func (m *mqttFlags) add(fl *pflag.FlagSet) {
	fl.StringVar(&m.broker, "broker", "", "MQTT broker URL, e.g. tcp://127.0.0.1:1883 or ssl://host:8883, or the nodes of one cluster comma-separated (or EDGECTL_BROKER)")
	fl.StringVar(&m.cafile, "cafile", "", "CA certificate (PEM) to trust for an ssl:// broker")
	fl.StringVar(&m.cert, "cert", "", "client certificate (PEM), with --key")
	fl.StringVar(&m.key, "key", "", "client certificate's private key (PEM), with --cert")
	fl.StringVar(&m.username, "username", "", "MQTT user name (or EDGECTL_USERNAME)")
	fl.StringVar(&m.passwordFile, "password-file", "", "file holding the MQTT password (or EDGECTL_PASSWORD_FILE); its trailing newline is dropped")
	fl.StringVar(&m.gatewayKey, "gateway-key", "", "the gateway's public key (PEM): take only Results it signed (security.result_key_file)")
}

// options resolves the flags and the environment into connection options.
// Every problem is a usage error naming the flag.
func (m *mqttFlags) options(gateway, prefix string) (controller.ConnOptions, error) {
	env := func(v *string, name string) {
		if *v == "" {
			*v = os.Getenv(name)
		}
	}
	env(&m.broker, "EDGECTL_BROKER")
	env(&m.username, "EDGECTL_USERNAME")
	env(&m.passwordFile, "EDGECTL_PASSWORD_FILE")
	o := controller.ConnOptions{Gateway: gateway, Prefix: prefix, Username: m.username}
	if m.broker == "" {
		return o, usagef("--broker is required (or EDGECTL_BROKER)")
	}
	nodes := strings.Split(m.broker, ",")
	if len(nodes) == 1 {
		o.Broker = m.broker
	} else {
		o.Brokers = nodes
	}
	secure := true
	for _, b := range nodes {
		if b == "" {
			return o, usagef("--broker %q: an empty URL in the list", m.broker)
		}
		secure = secure && (strings.HasPrefix(b, "ssl://") || strings.HasPrefix(b, "tls://") || strings.HasPrefix(b, "mqtts://"))
	}
	if m.passwordFile != "" {
		b, err := os.ReadFile(m.passwordFile)
		if err != nil {
			return o, usagef("--password-file: %v", err)
		}
		o.Password = strings.TrimRight(string(b), "\r\n")
	}
	if (m.cert == "") != (m.key == "") {
		return o, usagef("--cert and --key go together")
	}
	if m.cafile != "" || m.cert != "" {
		if !secure {
			return o, usagef("--cafile, --cert and --key need an ssl:// broker, not %q", m.broker)
		}
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if m.cafile != "" {
			b, err := os.ReadFile(m.cafile)
			if err != nil {
				return o, usagef("--cafile: %v", err)
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(b) {
				return o, usagef("--cafile %s: no PEM certificate", m.cafile)
			}
		}
		if m.cert != "" {
			c, err := tls.LoadX509KeyPair(m.cert, m.key)
			if err != nil {
				return o, usagef("--cert/--key: %v", err)
			}
			cfg.Certificates = []tls.Certificate{c}
		}
		o.TLS = cfg
	}
	if m.gatewayKey != "" {
		b, err := os.ReadFile(m.gatewayKey)
		if err != nil {
			return o, usagef("--gateway-key: %v", err)
		}
		keys, err := jws.ParsePublicKeys(b)
		if err != nil {
			return o, usagef("--gateway-key %s: %v", m.gatewayKey, err)
		}
		o.ResultKey = keys[0]
	}
	return o, nil
}

// adminFlags are the flags of the commands that call the admin API.
type adminFlags struct{ admin, token string }

// defaultAdmin is the agent's default admin.listen, as a URL.
const defaultAdmin = "http://" + config.DefaultAdminListen

func (a *adminFlags) add(fl *pflag.FlagSet) {
	fl.StringVar(&a.admin, "admin", "", "agent admin URL (or EDGECTL_ADMIN; default "+defaultAdmin+", the agent's default admin.listen)")
	fl.StringVar(&a.token, "token", "", "admin.token, sent as a Bearer token (or EDGECTL_TOKEN)")
}

// resolve fills in the environment and the defaults: a flag given wins
// over its variable, which wins over the default.
func (a *adminFlags) resolve() error {
	if a.token == "" {
		a.token = os.Getenv("EDGECTL_TOKEN")
	}
	if a.admin == "" {
		a.admin = os.Getenv("EDGECTL_ADMIN")
	}
	if a.admin == "" {
		a.admin = defaultAdmin
	}
	if !strings.Contains(a.admin, "://") {
		a.admin = "http://" + a.admin
	}
	a.admin = strings.TrimRight(a.admin, "/")
	return nil
}
