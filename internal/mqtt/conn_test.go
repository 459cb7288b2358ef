package mqtt

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.mqtt.golang/packets"
)

func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		acc <- c
	}()
	client, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-acc
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// Writes arrive whole and in order, also past the buffer bound (the writer
// then makes Write wait), and Close sends what is still queued.
func TestBufConnOrderAndClose(t *testing.T) {
	c, srv := tcpPair(t)
	b := newBufConn(c)
	var want bytes.Buffer
	got := make(chan []byte)
	go func() {
		all, _ := io.ReadAll(srv)
		got <- all
	}()
	chunk := strings.Repeat("x", 3000)
	for i := 0; i < 2000; i++ { // 6 MB: several times connBuffer
		line := fmt.Sprintf("%d:%s\n", i, chunk[:i%3000])
		want.WriteString(line)
		if _, err := b.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case all := <-got:
		if !bytes.Equal(all, want.Bytes()) {
			t.Fatalf("received %d bytes, want %d (or out of order)", len(all), want.Len())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the peer did not see the end of the stream")
	}
	if _, err := b.Write([]byte("late")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write after Close: %v, want net.ErrClosed", err)
	}
}

// A failed write makes the reader fail at once with an error paho reports
// (not "use of closed network connection", which paho ignores), and every
// later Write returns the failure.
func TestBufConnWriteFailureReachesReader(t *testing.T) {
	c, _ := tcpPair(t)
	b := newBufConn(c)
	// The write fails (its deadline has passed) while the socket is fine
	// for reading: only the failure handling can wake the reader.
	c.SetWriteDeadline(time.Now().Add(-time.Second))
	readErr := make(chan error, 1)
	go func() {
		_, err := b.Read(make([]byte, 10))
		readErr <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	var werr error
	for werr == nil && time.Now().Before(deadline) {
		_, werr = b.Write([]byte("ping"))
	}
	if werr == nil {
		t.Fatal("writes to a reset connection never failed")
	}
	select {
	case err := <-readErr:
		if err == nil || strings.Contains(err.Error(), "use of closed network connection") {
			t.Fatalf("reader error %v: paho would not reconnect", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the reader did not fail after the write failure")
	}
	if _, err := b.Write([]byte("again")); err == nil {
		t.Error("a Write after the failure succeeded")
	}
}

// resume() may set DUP on what Get returns while the packet stored by
// Publish is being written: Get must hand out a copy (paho issue #703).
func TestStoreCopiesPublishes(t *testing.T) {
	s := newStore()
	s.Open()
	p := packets.NewControlPacket(packets.Publish).(*packets.PublishPacket)
	p.Qos, p.MessageID, p.TopicName, p.Payload = 1, 7, "a/b", []byte("x")
	s.Put("o.7", p)
	// The publisher's packet, written by paho's outgoing goroutine after
	// Put: the store must not share it.
	p.FixedHeader.RemainingLength = 99
	got := s.Get("o.7").(*packets.PublishPacket)
	if got == p {
		t.Fatal("Get returned the packet given to Put")
	}
	if got.RemainingLength == 99 {
		t.Fatal("the store shares the packet given to Put: a write of it races with resume()")
	}
	if again := s.Get("o.7").(*packets.PublishPacket); again == got {
		t.Fatal("Get returned the same object twice")
	}
	got.Dup = true
	if p.Dup || got.TopicName != "a/b" || string(got.Payload) != "x" || got.MessageID != 7 || got.Qos != 1 {
		t.Fatalf("copy %+v, stored %+v", got, p)
	}
	if keys := s.All(); len(keys) != 1 || keys[0] != "o.7" {
		t.Fatalf("All = %v", keys)
	}
}
