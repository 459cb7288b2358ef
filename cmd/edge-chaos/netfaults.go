package main

import (
	"context"
	"fmt"
	"strings"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/edge-agent/edge-agent/internal/rig"
)

// links are the campaign's network faults: toxiproxy (run in this process)
// between the agent and the broker, the agent and the firmware, and the
// controllers and each etcd member. A link can be slowed (latency), cut
// (the proxy stops: open connections close, new ones are refused),
// black-holed (data dropped, connections left open: timeout toxic),
// reset (RST) or made to close slowly (slow_close).
type links struct {
	srv *toxiproxy.ApiServer

	mu      sync.Mutex
	proxies map[string]*toxiproxy.Proxy
}

func newLinks() *links {
	return &links{
		srv:     toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop()),
		proxies: map[string]*toxiproxy.Proxy{},
	}
}

// add starts a proxy named name in front of upstream and returns its
// listening address.
func (l *links) add(name, upstream string) (string, error) {
	listen, err := rig.FreeAddr()
	if err != nil {
		return "", err
	}
	p := toxiproxy.NewProxy(l.srv, name, listen, upstream)
	if err := l.srv.Collection.Add(p, true); err != nil {
		return "", fmt.Errorf("toxiproxy %s: %w", name, err)
	}
	l.mu.Lock()
	l.proxies[name] = p
	l.mu.Unlock()
	return p.Listen, nil
}

// named returns the proxies whose names start with prefix.
func (l *links) named(prefix string) []*toxiproxy.Proxy {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*toxiproxy.Proxy
	for n, p := range l.proxies {
		if strings.HasPrefix(n, prefix) {
			out = append(out, p)
		}
	}
	return out
}

// toxic adds a toxic to every proxy named prefix*: kind latency (ms =
// delay), timeout (black hole), reset_peer, slow_close (ms = delay).
func (l *links) toxic(prefix, kind string, ms int) error {
	var attrs string
	switch kind {
	case "latency":
		attrs = fmt.Sprintf(`{"latency":%d,"jitter":%d}`, ms, ms/10)
	case "timeout":
		attrs = `{"timeout":0}`
	case "reset_peer":
		attrs = fmt.Sprintf(`{"timeout":%d}`, ms)
	case "slow_close":
		attrs = fmt.Sprintf(`{"delay":%d}`, ms)
	default:
		return fmt.Errorf("toxiproxy: unknown toxic %q", kind)
	}
	for _, p := range l.named(prefix) {
		for _, stream := range []string{"upstream", "downstream"} {
			body := fmt.Sprintf(`{"name":"%s_%s","type":"%s","stream":"%s","toxicity":1,"attributes":%s}`, kind, stream, kind, stream, attrs)
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
				return fmt.Errorf("toxiproxy %s: %s: %w", p.Name, kind, err)
			}
		}
	}
	return nil
}

// cut stops every proxy named prefix* (connections close, new ones are
// refused) or starts it again.
func (l *links) cut(prefix string, down bool) error {
	for _, p := range l.named(prefix) {
		if down {
			p.Stop()
		} else if err := p.Start(); err != nil && err != toxiproxy.ErrProxyAlreadyStarted {
			return fmt.Errorf("toxiproxy %s: start again: %w", p.Name, err)
		}
	}
	return nil
}

// heal removes every toxic and starts every stopped proxy.
func (l *links) heal(prefix string) error {
	for _, p := range l.named(prefix) {
		p.Toxics.ResetToxics(context.Background())
	}
	return l.cut(prefix, false)
}

func (l *links) close() {
	for _, p := range l.named("") {
		p.Stop()
	}
}
