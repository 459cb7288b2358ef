package mqtt_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/mqtt"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

func TestNewEmbeddedValidates(t *testing.T) {
	for _, tt := range []struct {
		name string
		o    mqtt.EmbeddedOptions
		want string
	}{
		{"no listen", mqtt.EmbeddedOptions{DataDir: "d"}, "mqtt: invalid options: embedded broker: listen is required"},
		{"no data dir", mqtt.EmbeddedOptions{Listen: "127.0.0.1:0"}, "mqtt: invalid options: embedded broker: data_dir is required"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := mqtt.NewEmbedded(tt.o)
			if err == nil || err.Error() != tt.want || !errors.Is(err, mqtt.ErrInvalidOptions) {
				t.Fatalf("NewEmbedded error = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestEmbeddedLifecycle(t *testing.T) {
	e, err := mqtt.NewEmbedded(mqtt.EmbeddedOptions{Listen: "127.0.0.1:0", DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if e.Addr() != "" || e.URL() != "" {
		t.Fatalf("Addr before Start = %q", e.Addr())
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if e.Addr() == "" || e.Addr() == "127.0.0.1:0" {
		t.Fatalf("Addr after Start = %q, want the bound port", e.Addr())
	}
	if err := e.Start(context.Background()); !errors.Is(err, mqtt.ErrStarted) {
		t.Fatalf("second Start = %v, want ErrStarted", err)
	}
	mqtttest.Publish(t, e.URL(), "x", []byte("y"), false)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if err := e.Start(context.Background()); !errors.Is(err, mqtt.ErrClosed) {
		t.Fatalf("Start after Close = %v, want ErrClosed", err)
	}
}

// A burst of QoS 1 messages to a persistent subscriber that acks late and
// slowly: none may be dropped (mochi's defaults drop about 2% of such a
// burst), and they arrive in publish order.
func TestBurstToSlowSubscriber(t *testing.T) {
	const n = 20_000
	forEachBroker(t, func(t *testing.T, b mqtttest.Broker) {
		topic := uniqueID(t, "burst") + "/cmd"
		in := newInbox()
		sub := startClient(t, mqtt.Options{Broker: b.URL(), ClientID: uniqueID(t, "burst-sub"),
			Subscriptions: []string{topic}, Handler: in.handler})
		pub := startClient(t, mqtt.Options{Broker: b.URL(), ClientID: uniqueID(t, "burst-pub")})

		// The subscriber acks nothing until the publisher is done, then
		// acks in batches with pauses: the broker holds up to n unacked.
		published := make(chan struct{})
		var (
			mu    sync.Mutex
			seen  = make(map[int]bool, n)
			order []int
		)
		done := make(chan error, 1)
		go func() {
			<-published
			var batch []*mqtt.Message
			for len(seen) < n {
				select {
				case m := <-in:
					v, err := strconv.Atoi(string(m.Payload))
					if err != nil {
						done <- fmt.Errorf("payload %q", m.Payload)
						return
					}
					mu.Lock()
					if !seen[v] {
						order = append(order, v)
					}
					seen[v] = true
					mu.Unlock()
					// Batches smaller than mosquitto's in-flight window (256):
					// it sends no more until some are acked.
					if batch = append(batch, m); len(batch) == 100 {
						time.Sleep(time.Millisecond)
						for _, m := range batch {
							m.Ack()
						}
						batch = batch[:0]
					}
				case <-time.After(30 * time.Second):
					done <- fmt.Errorf("stalled at %d of %d distinct messages", len(seen), n)
					return
				}
			}
			for _, m := range batch {
				m.Ack()
			}
			done <- nil
		}()

		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second) // a bound, not a speed check: -race on a loaded machine is slow
		defer cancel()
		pend := make([]*mqtt.Pending, 0, n)
		for i := range n {
			p, err := pub.PublishAsync(ctx, topic, []byte(strconv.Itoa(i)), false)
			if err != nil {
				t.Fatal(err)
			}
			pend = append(pend, p)
		}
		for _, p := range pend {
			if err := p.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("published %d in %s", n, time.Since(start))
		close(published)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		t.Logf("received %d distinct in %s", n, time.Since(start))
		for i, v := range order {
			if v != i {
				t.Fatalf("out of order: position %d holds %d", i, v)
			}
		}
		if e, ok := b.(*mqtttest.EmbeddedBroker); ok && e.Dropped() != 0 {
			t.Fatalf("embedded broker dropped %d messages", e.Dropped())
		}
		_ = sub
	})
}

// SyncEveryWrite keeps the same state across a restart (the default mode
// is covered by TestQueuedMessagesSurviveBrokerRestart).
func TestEmbeddedSyncEveryWrite(t *testing.T) {
	dir := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	start := func() *mqtt.Embedded {
		e, err := mqtt.NewEmbedded(mqtt.EmbeddedOptions{Listen: addr, DataDir: dir, SyncEveryWrite: true, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		return e
	}
	e := start()
	id, topic := uniqueID(t, "sync"), uniqueID(t, "sync")+"/cmd"
	opts := func(in inbox) mqtt.Options {
		return mqtt.Options{Broker: e.URL(), ClientID: id, Subscriptions: []string{topic}, Handler: in.handler}
	}
	c := startClient(t, opts(newInbox()))
	_ = c.Close()
	for i := range 20 {
		mqtttest.Publish(t, e.URL(), topic, []byte(strconv.Itoa(i)), false)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	start()
	in := newInbox()
	startClient(t, opts(in))
	for i := range 20 {
		if m := in.next(t, 5*time.Second); string(m.Payload) != strconv.Itoa(i) {
			t.Fatalf("message %d: %q", i, m.Payload)
		} else {
			m.Ack()
		}
	}
}

// A store that is not a valid bbolt file is moved aside and the broker
// starts empty.
func TestEmbeddedMovesDamagedStoreAside(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, mqtt.EmbeddedDBFile)
	if err := os.WriteFile(path, bytes.Repeat([]byte("not a bbolt file "), 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	e, err := mqtt.NewEmbedded(mqtt.EmbeddedOptions{Listen: "127.0.0.1:0", DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatalf("Start with a damaged store: %v", err)
	}
	defer e.Close()
	aside, _ := filepath.Glob(path + ".corrupt-*")
	if len(aside) != 1 {
		t.Fatalf("damaged store not moved aside: %v", aside)
	}
	mqtttest.Publish(t, e.URL(), "x", []byte("y"), true)
}

// Commands published one after the other on separate connections (each
// publish waiting for its PUBACK) reach a connected subscriber in publish
// order: mochi acknowledges before it routes, so without the store hook's
// routing lock a later publish could overtake an earlier one.
func TestEmbeddedOrderAcrossPublisherConnections(t *testing.T) {
	b := mqtttest.StartEmbedded(t)
	topic := uniqueID(t, "xconn") + "/cmd"
	in := newInbox()
	startClient(t, mqtt.Options{Broker: b.URL(), ClientID: uniqueID(t, "xconn-sub"), Subscriptions: []string{topic}, Handler: in.handler})
	const n = 30
	for i := range n {
		mqtttest.Publish(t, b.URL(), topic, []byte(strconv.Itoa(i)), false)
	}
	for i := range n {
		if m := in.next(t, 5*time.Second); string(m.Payload) != strconv.Itoa(i) {
			t.Fatalf("message %d: %q", i, m.Payload)
		} else {
			m.Ack()
		}
	}
}
