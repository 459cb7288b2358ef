package mqtttest

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/mqtt"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// EmbeddedBroker is an mqtt.Embedded on a free loopback port with its data
// in t.TempDir().
type EmbeddedBroker struct {
	t       testing.TB
	dataDir string
	addr    string // fixed after the first start, reused by Restart

	mu sync.Mutex
	e  *mqtt.Embedded
}

// StartEmbedded starts an embedded broker (the agent's own configuration,
// mqtt.Embedded) on a free loopback port; it is closed in t.Cleanup.
// Its warnings (e.g. "client store quota reached") go to t.Log.
func StartEmbedded(t testing.TB) *EmbeddedBroker {
	t.Helper()
	b := &EmbeddedBroker{t: t, dataDir: t.TempDir(), addr: "127.0.0.1:" + strconv.Itoa(testkit.FreePort(t))}
	t.Cleanup(func() { b.Stop() })
	b.start()
	return b
}

func (b *EmbeddedBroker) start() {
	b.t.Helper()
	e, err := mqtt.NewEmbedded(mqtt.EmbeddedOptions{
		Listen:  b.addr,
		DataDir: b.dataDir,
		Logger:  slog.New(slog.NewTextHandler(tlogWriter{b.t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		b.t.Fatalf("mqtttest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		b.t.Fatalf("mqtttest: embedded broker: %v", err)
	}
	b.mu.Lock()
	b.e = e
	b.addr = e.Addr()
	b.mu.Unlock()
}

// URL is tcp://127.0.0.1:port.
func (b *EmbeddedBroker) URL() string { return "tcp://" + b.addr }

// DataDir is where the broker's bbolt file lives.
func (b *EmbeddedBroker) DataDir() string { return b.dataDir }

// Embedded returns the running broker, nil while stopped.
func (b *EmbeddedBroker) Embedded() *mqtt.Embedded {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.e
}

// Dropped is the running broker's mqtt.Embedded.Dropped (0 while stopped).
func (b *EmbeddedBroker) Dropped() int64 {
	if e := b.Embedded(); e != nil {
		return e.Dropped()
	}
	return 0
}

// Stop closes the broker (its store is closed cleanly). A no-op when it
// is not running.
func (b *EmbeddedBroker) Stop() {
	b.mu.Lock()
	e := b.e
	b.e = nil
	b.mu.Unlock()
	if e == nil {
		return
	}
	if err := e.Close(); err != nil {
		b.t.Errorf("mqtttest: embedded broker close: %v", err)
	}
}

// Restart stops the broker if it runs and starts a new one on the same
// port and data directory.
func (b *EmbeddedBroker) Restart() {
	b.t.Helper()
	b.Stop()
	b.start()
}

// Wipe deletes the broker's data; only while it is stopped.
func (b *EmbeddedBroker) Wipe() {
	b.t.Helper()
	if b.Embedded() != nil {
		b.t.Fatal("mqtttest: Wipe while the embedded broker runs")
	}
	if err := os.RemoveAll(b.dataDir); err != nil {
		b.t.Fatal(err)
	}
}

// tlogWriter sends log lines to t.Log (and drops them once the test is
// over, when t.Log would panic).
type tlogWriter struct{ t testing.TB }

func (w tlogWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }()
	w.t.Log(string(p))
	return len(p), nil
}
