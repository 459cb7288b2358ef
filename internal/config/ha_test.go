package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/config"
)

func TestHADefaults(t *testing.T) {
	c, err := config.Parse([]byte("gateway_id: gw-1\nmqtt: {broker: embedded}\n" + secDev))
	if err != nil {
		t.Fatal(err)
	}
	if c.HA.Enabled || c.HA.SafetyMargin.D() != 2*time.Second {
		t.Fatalf("defaults: %+v", c.HA)
	}
	c, err = config.Parse([]byte("gateway_id: gw-1\nmqtt: {broker: embedded}\ncoordination:\n  etcd: {endpoints: [\"http://127.0.0.1:2379\"], session_ttl: 3s}\nha: {enabled: true, safety_margin: 1s}\n" + secDev))
	if err != nil || !c.HA.Enabled || c.HA.SafetyMargin.D() != time.Second {
		t.Fatalf("enabled: %v %+v", err, c.HA)
	}
}

func TestHAProblems(t *testing.T) {
	const etcd = "coordination:\n  etcd: {endpoints: [\"http://127.0.0.1:2379\"], session_ttl: 3s}\n"
	for _, tc := range []struct{ name, block, want string }{
		{"no etcd", "ha: {enabled: true}\n", "ha.enabled: needs coordination.etcd"},
		{"margin above ttl", etcd + "ha: {enabled: true, safety_margin: 3s}\n", "ha.safety_margin: 3s: must be below coordination.etcd.session_ttl (3s)"},
		{"negative margin", "ha: {safety_margin: -1s}\n", "ha.safety_margin: must be positive"},
		{"unknown key", "ha: {enable: true}\n", "ha.enable (line 3): unknown key; did you mean enabled?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte("gateway_id: gw-1\nmqtt: {broker: embedded}\n" + tc.block + secDev))
			if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
