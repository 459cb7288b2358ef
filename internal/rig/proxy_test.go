package rig

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"testing"
	"time"
)

// echoServer echoes every connection's bytes back.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// Through the proxy: a pause holds bytes (counted) and Resume delivers them
// in order; Cut closes the connection and a new one works; Refuse(true)
// refuses connections until Refuse(false).
func TestProxy(t *testing.T) {
	p, err := NewProxy("tcp://" + echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip := func(s string) {
		t.Helper()
		if _, err := io.WriteString(c, s+"\n"); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if got, err := r.ReadString('\n'); err != nil || got != s+"\n" {
			t.Fatalf("echo of %q: %q %v", s, got, err)
		}
	}
	roundTrip("hello")

	p.Pause()
	for i := range 50 {
		if _, err := io.WriteString(c, strconv.Itoa(i)+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if line, err := r.ReadString('\n'); err == nil {
		t.Fatalf("read %q through a paused proxy", line)
	}
	if p.Held() == 0 {
		t.Fatal("the pause held nothing")
	}
	p.Resume()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i := range 50 {
		if got, err := r.ReadString('\n'); err != nil || got != strconv.Itoa(i)+"\n" {
			t.Fatalf("after Resume, line %d: %q %v", i, got, err)
		}
	}

	if err := p.Cut(); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("the connection survived Cut")
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("no new connection after Cut: %v", err)
	}
	c2.Close()

	if err := p.Refuse(true); err != nil {
		t.Fatal(err)
	}
	if c3, err := net.Dial("tcp", p.Addr()); err == nil {
		c3.Close()
		t.Fatal("a refusing proxy accepted a connection")
	}
	if err := p.Refuse(false); err != nil {
		t.Fatal(err)
	}
	c4, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("no connection after Refuse(false): %v", err)
	}
	c4.Close()
}
