package mqtt_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/mqtt"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// brokers are the two brokers every behaviour is tested against.
var brokers = []struct {
	name  string
	start func(testing.TB) mqtttest.Broker
}{
	{"mosquitto", func(t testing.TB) mqtttest.Broker { return mqtttest.StartMosquitto(t) }},
	{"embedded", func(t testing.TB) mqtttest.Broker { return mqtttest.StartEmbedded(t) }},
}

// forEachBroker runs f as a subtest against each broker.
func forEachBroker(t *testing.T, f func(t *testing.T, b mqtttest.Broker)) {
	for _, bk := range brokers {
		t.Run(bk.name, func(t *testing.T) {
			t.Parallel()
			f(t, bk.start(t))
		})
	}
}

// inbox is a Handler that queues deliveries on a channel (never blocking
// paho's router for a test that reads slowly).
type inbox chan *mqtt.Message

func newInbox() inbox { return make(inbox, 100_000) }

func (in inbox) handler(m *mqtt.Message) {
	select {
	case in <- m:
	default:
		panic("test inbox full")
	}
}

// next returns the next delivery or fails after timeout.
func (in inbox) next(t testing.TB, timeout time.Duration) *mqtt.Message {
	t.Helper()
	select {
	case m := <-in:
		return m
	case <-time.After(timeout):
		t.Fatalf("no delivery within %s", timeout)
		return nil
	}
}

// startClient makes and starts a Client, closed in t.Cleanup.
func startClient(t testing.TB, o mqtt.Options) *mqtt.Client {
	t.Helper()
	if o.Logger == nil {
		o.Logger = testLogger(t)
	}
	c, err := mqtt.New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	return c
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tlog{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tlog struct{ t testing.TB }

func (w tlog) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // t.Log after the test ended panics
	w.t.Log(string(p))
	return len(p), nil
}

// uniqueID makes client IDs and topics distinct per test.
func uniqueID(t testing.TB, what string) string {
	return fmt.Sprintf("%s-%d", what, time.Now().UnixNano()%1e9)
}

func publish(t testing.TB, c *mqtt.Client, topic, payload string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Publish(ctx, topic, []byte(payload), false); err != nil {
		t.Fatalf("Publish %s: %v", topic, err)
	}
}
