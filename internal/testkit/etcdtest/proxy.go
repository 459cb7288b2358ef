package etcdtest

import (
	"strings"
	"testing"

	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// Proxy forwards TCP connections from a loopback address to an etcd
// member: mqtttest's proxy (Pause, Resume, Held, Cut), with its address as
// an etcd endpoint. A client that talks to etcd through a paused proxy
// sends no keepalive that etcd sees, so its lease runs out for real.
type Proxy struct{ *mqtttest.Proxy }

// NewProxy starts a proxy to target (host:port or http://host:port); it
// is closed in t.Cleanup.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	return &Proxy{mqtttest.NewProxy(t, strings.TrimPrefix(target, "http://"))}
}

// URL is the proxy's address as an etcd endpoint.
func (p *Proxy) URL() string { return "http://" + p.Addr() }
