package mqtt

import (
	"bufio"
	"errors"
	"net"
	"net/url"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"golang.org/x/net/proxy"
)

// paho reads every packet from the connection in three or more reads (the
// type byte, each byte of the remaining length, then the rest) and writes
// every packet with its own write: with one command costing a PUBACK, a
// Result and a retained DeviceState, system calls on the MQTT connection
// were the largest single cost of the agent at 64 devices (BENCHMARKS.md).
// A plain tcp:// or mqtt:// connection is therefore wrapped: reads come
// through a buffer, and writes made while an earlier one is still on its way
// to the socket are sent together by one writer goroutine. (TLS connections
// already read whole records; ws:// and unix sockets are left as paho opens
// them.)

// connBuffer bounds the bytes written and not yet on the socket: a Write
// beyond it waits for the writer, so a slow broker slows paho down instead
// of growing memory.
const connBuffer = 1 << 20

// OpenConnection is a paho.OpenConnectionFunc: for tcp:// and mqtt:// it
// dials (through a proxy from the environment, as paho does) and returns
// the buffered connection; other schemes are refused (use paho's own).
func OpenConnection(uri *url.URL, o paho.ClientOptions) (net.Conn, error) {
	switch uri.Scheme {
	case "tcp", "mqtt":
	default:
		return nil, errors.New("mqtt: OpenConnection handles tcp:// and mqtt:// only")
	}
	d := o.Dialer
	if d == nil {
		d = &net.Dialer{Timeout: o.ConnectTimeout}
	}
	c, err := proxy.FromEnvironmentUsing(d).Dial("tcp", uri.Host)
	if err != nil {
		return nil, err
	}
	return newBufConn(c), nil
}

// buffered reports whether OpenConnection handles broker's scheme.
func buffered(broker string) bool {
	u, err := url.Parse(broker)
	return err == nil && (u.Scheme == "tcp" || u.Scheme == "mqtt")
}

type bufConn struct {
	net.Conn
	r *bufio.Reader

	mu      sync.Mutex
	more    *sync.Cond // the writer has taken the buffer, or failed
	buf     []byte     // written, not yet taken by the writer
	busy    bool       // the writer goroutine holds a buffer
	err     error      // the first write error: every later Write returns it
	closed  bool
	spare   []byte
	flushed *sync.Cond // the writer has finished with a buffer
}

func newBufConn(c net.Conn) *bufConn {
	b := &bufConn{Conn: c, r: bufio.NewReaderSize(c, 64<<10)}
	b.more = sync.NewCond(&b.mu)
	b.flushed = b.more
	return b
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// Write queues p for the writer goroutine and returns; an error of an
// earlier write is returned instead (the connection is then broken and
// paho reconnects).
func (b *bufConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.err == nil && !b.closed && len(b.buf)+len(p) > connBuffer && len(b.buf) > 0 {
		b.more.Wait()
	}
	if b.err != nil {
		return 0, b.err
	}
	if b.closed {
		return 0, net.ErrClosed
	}
	b.buf = append(b.buf, p...)
	if !b.busy {
		b.busy = true
		go b.writer()
	}
	return len(p), nil
}

// writer sends what has been queued until nothing is left, then ends (a
// Write starts a new one): no goroutine lingers on an idle connection.
func (b *bufConn) writer() {
	b.mu.Lock()
	for len(b.buf) > 0 && b.err == nil {
		out := b.buf
		b.buf = b.spare[:0]
		b.more.Broadcast()
		b.mu.Unlock()
		_, err := b.Conn.Write(out)
		b.mu.Lock()
		b.spare = out[:0]
		if err != nil && b.err == nil {
			b.err = err
			// Make paho's reader fail now, with an error it reports (it
			// ignores "use of closed network connection", taking that
			// for its own Close), so it reconnects at once.
			b.Conn.SetReadDeadline(time.Now())
		}
	}
	b.busy = false
	b.more.Broadcast()
	b.mu.Unlock()
}

// Close sends what is queued (bounded by a second: paho's DISCONNECT is
// the last packet), then closes the socket.
func (b *bufConn) Close() error {
	b.mu.Lock()
	deadline := time.Now().Add(time.Second)
	if b.busy {
		b.Conn.SetWriteDeadline(deadline)
	}
	for b.busy && b.err == nil {
		b.flushed.Wait()
	}
	b.closed = true
	b.more.Broadcast()
	b.mu.Unlock()
	return b.Conn.Close()
}
