package etcdtest

import (
	"testing"

	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// StartMosquitto runs a real mosquitto with the shipped
// configs/mosquitto.conf on a free loopback port (mqtt/mqtttest) and
// returns its URL (tcp://127.0.0.1:N). It is stopped in t.Cleanup. It is
// kept here so the controller's and edgectl's tests keep one name for it.
func StartMosquitto(t testing.TB) string {
	t.Helper()
	return mqtttest.StartMosquitto(t).URL()
}
