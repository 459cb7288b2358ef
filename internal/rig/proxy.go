package rig

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Proxy is a toxiproxy proxy (run in this process) from a free loopback
// port to a TCP server (a broker, an etcd member, a Modbus server):
//   - Cut closes every connection through it at once, which both ends see
//     as an ungraceful disconnect (the broker sends the client's last
//     will); new connections are accepted as before;
//   - Refuse(true) stops it (open connections close, new ones are
//     refused) until Refuse(false);
//   - Pause holds every byte read in either direction until Resume, as if
//     the network (or the client process) froze: a client paused this way
//     sends nothing its server sees (an etcd lease runs out for real).
//
// The chaos campaign's links (cmd/edge-chaos) are toxiproxy proxies too,
// with its latency, timeout, reset_peer and slow_close toxics.
type Proxy struct {
	px   *toxiproxy.Proxy
	gate *gate

	mu      sync.Mutex
	refused bool
}

var proxySeq atomic.Int64

// NewProxy starts a proxy to target (host:port, tcp://host:port or
// http://host:port).
func NewProxy(target string) (*Proxy, error) {
	listen, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	name := fmt.Sprintf("rig-%d", proxySeq.Add(1))
	px := toxiproxy.NewProxy(srv, name, listen, strings.TrimPrefix(strings.TrimPrefix(target, "tcp://"), "http://"))
	g := &gate{open: make(chan struct{})}
	close(g.open)
	gates.Store(name, g)
	for _, stream := range []string{"upstream", "downstream"} {
		spec := fmt.Sprintf(`{"name":"pause_%s","type":"rig_pause","stream":%q,"attributes":{"gate":%q}}`, stream, stream, name)
		if _, err := px.Toxics.AddToxicJson(strings.NewReader(spec)); err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
	}
	if err := srv.Collection.Add(px, true); err != nil {
		return nil, fmt.Errorf("proxy to %s: %w", target, err)
	}
	return &Proxy{px: px, gate: g}, nil
}

// Addr is the proxy's 127.0.0.1:port.
func (p *Proxy) Addr() string { return p.px.Listen }

// URL is the proxy's tcp://127.0.0.1:port (an MQTT broker URL).
func (p *Proxy) URL() string { return "tcp://" + p.Addr() }

// Cut closes every connection through the proxy; new connections are
// accepted as before (after Refuse(true), not until Refuse(false)).
func (p *Proxy) Cut() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.px.Stop()
	if p.refused {
		return nil
	}
	return p.px.Start()
}

// Refuse stops the proxy (true: open connections are closed, new ones
// refused) or starts it again (false): with Cut, a test can keep a client
// away until the server has reacted to the cut, rather than race its
// reconnect.
func (p *Proxy) Refuse(on bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refused = on
	if on {
		p.px.Stop()
		return nil
	}
	if err := p.px.Start(); err != nil && err != toxiproxy.ErrProxyAlreadyStarted {
		return err
	}
	return nil
}

// Pause holds all traffic until Resume.
func (p *Proxy) Pause() { p.gate.set(false) }

// Resume delivers held traffic and forwards again.
func (p *Proxy) Resume() { p.gate.set(true) }

// Held counts reads that were held by a pause: proof that the pause
// actually stopped traffic.
func (p *Proxy) Held() int64 { return p.gate.held.Load() }

// Close resumes held traffic, closes every connection and the listener.
func (p *Proxy) Close() {
	p.Resume()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.px.Stop()
	gates.Delete(p.px.Name)
}

// gate is one proxy's pause: closed open channel = forwarding.
type gate struct {
	mu   sync.Mutex
	open chan struct{}
	held atomic.Int64
}

func (g *gate) set(open bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		if !open {
			g.open = make(chan struct{})
		}
	default:
		if open {
			close(g.open)
		}
	}
}

func (g *gate) wait() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}

// gates are the proxies' pauses by proxy name (a toxic is made by
// toxiproxy from its JSON attributes: the name is how it finds its gate).
var gates sync.Map

// pauseToxic forwards each chunk once its proxy's gate is open. It stays
// in place for the proxy's life (Pause and Resume only move the gate), so
// held data is never reordered by a toxic's removal.
type pauseToxic struct {
	Gate string `json:"gate"`
}

func (t *pauseToxic) Pipe(stub *toxics.ToxicStub) {
	v, _ := gates.Load(t.Gate)
	g, _ := v.(*gate)
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if g != nil {
				open := g.wait()
				select {
				case <-open:
				default:
					g.held.Add(1)
					select {
					case <-open:
					case <-stub.Interrupt:
						stub.Output <- c // do not drop what was held
						return
					}
				}
			}
			stub.Output <- c
		}
	}
}

func init() { toxics.Register("rig_pause", new(pauseToxic)) }
