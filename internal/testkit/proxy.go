package testkit

import (
	"testing"

	"github.com/edge-agent/edge-agent/internal/rig"
)

// Proxy is a rig.Proxy (toxiproxy) to a broker or any TCP server (etcdtest
// uses it for etcd), closed in t.Cleanup:
//   - Cut drops every connection through it at once, which both ends see
//     as an ungraceful disconnect: the broker sends the client's last
//     will, and the client reconnects (through the proxy, which keeps
//     accepting);
//   - Refuse(true) closes connections and refuses new ones until
//     Refuse(false);
//   - Pause holds every byte read in either direction until Resume, as if
//     the network (or the client process) froze: a client paused this way
//     sends nothing its server sees (an etcd lease runs out for real);
//     Held counts the reads it held.
type Proxy struct {
	*rig.Proxy
	t testing.TB
}

// NewProxy starts a proxy to target (host:port, tcp://host:port or
// http://host:port); it is closed in t.Cleanup.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := rig.NewProxy(target)
	if err != nil {
		t.Fatalf("testkit: %v", err)
	}
	t.Cleanup(p.Close)
	return &Proxy{Proxy: p, t: t}
}

// Cut closes every connection through the proxy; new connections are
// accepted as before.
func (p *Proxy) Cut() {
	if err := p.Proxy.Cut(); err != nil {
		p.t.Errorf("testkit: proxy cut: %v", err)
	}
}

// Refuse makes the proxy close connections and refuse new ones (true) or
// forward them again (false).
func (p *Proxy) Refuse(on bool) {
	if err := p.Proxy.Refuse(on); err != nil {
		p.t.Errorf("testkit: proxy refuse(%v): %v", on, err)
	}
}
