package mqtt

import (
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/mqtt/mosq"
)

// The embedded broker's password and ACL files are mosquitto's; config
// checks them with these (config check reports a malformed one).
func init() {
	config.RegisterBrokerFormat(config.BrokerFormat{
		Passwords: func(b []byte) error { _, err := mosq.ParsePasswords(b); return err },
		ACL:       func(b []byte) error { _, err := mosq.ParseACL(b); return err },
	})
}
