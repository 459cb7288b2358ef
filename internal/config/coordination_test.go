package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/config"
)

func TestCoordinationDefaults(t *testing.T) {
	c, err := config.Parse([]byte("gateway_id: gw-1\nmqtt: {broker: embedded}\ncoordination:\n  etcd: {endpoints: [\"http://127.0.0.1:2379\"]}\n" + secDev))
	if err != nil {
		t.Fatal(err)
	}
	e := c.Coordination.Etcd
	if e.Prefix != "edge" || e.DialTimeout.D() != 5*time.Second || e.SessionTTL.D() != 10*time.Second || e.TLSConfig != nil {
		t.Fatalf("defaults: %+v", e)
	}
	c, err = config.Parse([]byte("gateway_id: gw-1\nmqtt: {broker: embedded}\n" + secDev))
	if err != nil || c.Coordination.Etcd != nil {
		t.Fatalf("without the block: %v %+v", err, c.Coordination)
	}
}

func TestCoordinationProblems(t *testing.T) {
	for _, tc := range []struct{ name, block, want string }{
		{"no endpoints", "{}", "coordination.etcd.endpoints: at least one endpoint"},
		{"bad scheme", "{endpoints: [\"tcp://h:2379\"]}", "coordination.etcd.endpoints[0]: \"tcp://h:2379\": want http://host:port"},
		{"no port", "{endpoints: [\"http://h\"]}", "coordination.etcd.endpoints[0]: \"http://h\": the port is required"},
		{"mixed", "{endpoints: [\"http://h:1\", \"https://h:2\"]}", "mixes http:// and https://"},
		{"odd prefix", "{endpoints: [\"http://h:1\"], prefix: \"/edge/*\"}", "coordination.etcd.prefix: \"/edge/*\": want path segments"},
		{"prefix with space", "{endpoints: [\"http://h:1\"], prefix: \"a b\"}", "coordination.etcd.prefix: \"a b\""},
		{"short ttl", "{endpoints: [\"http://h:1\"], session_ttl: 500ms}", "coordination.etcd.session_ttl: 500ms: must be from 2s"},
		{"user alone", "{endpoints: [\"http://h:1\"], username: u}", "coordination.etcd.password_file: username and password_file go together"},
		{"tls on http", "{endpoints: [\"http://h:1\"], tls: {ca_file: /x}}", "coordination.etcd.tls: set, but the endpoints are http://"},
		{"missing ca", "{endpoints: [\"https://h:1\"], tls: {ca_file: /nonexistent/ca.pem}}", "coordination.etcd.tls.ca_file: open /nonexistent/ca.pem"},
		{"unknown key", "{endpoints: [\"http://h:1\"], endpoint: x}", "coordination.etcd.endpoint (line 4): unknown key; did you mean endpoints?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte("gateway_id: gw-1\nmqtt: {broker: embedded}\ncoordination:\n  etcd: " + tc.block + "\n" + secDev))
			if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
