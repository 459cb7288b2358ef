package testkit

import (
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy forwards TCP connections from a free loopback port to a broker
// (or any TCP server: etcdtest uses it for etcd).
//   - Cut drops every connection through it at once, which both ends see
//     as an ungraceful disconnect: the broker sends the client's last
//     will, and the client reconnects (through the proxy, which keeps
//     accepting).
//   - Pause holds every byte read in either direction until Resume, as if
//     the network (or the client process) froze: a client paused this way
//     sends nothing its server sees (an etcd lease runs out for real).
type Proxy struct {
	t      testing.TB
	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	closed  bool
	refused bool          // Refuse(true): new connections are closed at once
	paused  bool          // Pause: reads are held
	gate    chan struct{} // closed while not paused
	wg      sync.WaitGroup

	held atomic.Int64 // reads that had to wait for a Resume
}

// Refuse makes the proxy close new connections at once (true) or forward
// them again (false): with Cut, a test can keep a client away until the
// broker has reacted to the cut, rather than race its reconnect.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	p.refused = on
	p.mu.Unlock()
}

// NewProxy starts a proxy to target (host:port, tcp://host:port or
// http://host:port); it is closed in t.Cleanup.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testkit: proxy: %v", err)
	}
	p := &Proxy{t: t, ln: ln, target: strings.TrimPrefix(strings.TrimPrefix(target, "tcp://"), "http://"), conns: map[net.Conn]struct{}{},
		gate: make(chan struct{})}
	close(p.gate)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// URL is the proxy's tcp://127.0.0.1:port (an MQTT broker URL).
func (p *Proxy) URL() string { return "tcp://" + p.Addr() }

// Addr is the proxy's 127.0.0.1:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Pause holds all traffic until Resume.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.paused {
		p.paused = true
		p.gate = make(chan struct{})
	}
}

// Resume delivers held traffic and forwards again.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		p.paused = false
		close(p.gate)
	}
}

// Held counts reads that were held by a pause: proof that the pause
// actually stopped traffic.
func (p *Proxy) Held() int64 { return p.held.Load() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refused := p.refused
		p.mu.Unlock()
		if refused {
			_ = c.Close()
			continue
		}
		b, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			_ = b.Close()
			return
		}
		p.conns[c], p.conns[b] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, b)
		go p.pipe(b, c)
	}
}

func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate, paused := p.gate, p.paused
			p.mu.Unlock()
			if paused {
				p.held.Add(1)
				<-gate
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a closed connection: close both sides
		}
	}
}

// Cut closes every connection through the proxy (both sides, without a
// DISCONNECT); new connections are accepted as before.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST: no graceful close
		}
		_ = c.Close()
	}
}

func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	if p.paused { // let held reads finish
		p.paused = false
		close(p.gate)
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}
