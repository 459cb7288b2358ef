package mqtt_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/mqtt"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// A client whose MayConnect refuses does not reconnect after its
// connection was taken over (another client with its client ID, as the
// agent that took over a standby pair's gateway): the other keeps the
// session. Found by edge-bench -takeover: a paused active, woken, was
// back on the broker within milliseconds, before it knew it had been
// deposed, and took the session from the new active. Once MayConnect
// allows it, the client reconnects.
func TestMayConnectHoldsReconnects(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b mqtttest.Broker) {
		id, topic := uniqueID(t, "may"), uniqueID(t, "may")+"/cmd"
		var may atomic.Bool
		var asked atomic.Int32
		may.Store(true)
		in1 := newInbox()
		c1 := startClient(t, mqtt.Options{Broker: b.URL(), ClientID: id, Subscriptions: []string{topic}, Handler: in1.handler,
			MayConnect: func() bool { asked.Add(1); return may.Load() }})
		may.Store(false)
		before := asked.Load()

		// The same client ID again: the broker closes c1's connection.
		in2 := newInbox()
		c2 := startClient(t, mqtt.Options{Broker: b.URL(), ClientID: id, Subscriptions: []string{topic}, Handler: in2.handler})
		// paho's first reconnect comes at once, the next after a second:
		// c2 must keep its connection across both.
		deadline := time.Now().Add(2500 * time.Millisecond)
		for time.Now().Before(deadline) {
			if !c2.Connected() {
				t.Fatal("the second client lost its connection: the first reconnected with the same client ID")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if n := asked.Load() - before; n < 2 {
			t.Fatalf("MayConnect asked %d times after the takeover, want a refused reconnect and its retry", n)
		}
		if c1.Connected() {
			t.Fatal("the first client is connected while MayConnect refuses")
		}
		pub := startClient(t, mqtt.Options{Broker: b.URL(), ClientID: id + "-pub"})
		publish(t, pub, topic, "m1")
		if m := in2.next(t, 5*time.Second); string(m.Payload) != "m1" {
			t.Fatalf("the second client got %q, want m1", m.Payload)
		} else {
			m.Ack()
		}
		select {
		case m := <-in1:
			t.Fatalf("the refused client got %q", m.Payload)
		default:
		}

		// Allowed again: it reconnects (and takes the session back).
		may.Store(true)
		testkit.Eventually(t, 15*time.Second, "the first client reconnected", c1.Subscribed)
	})
}

// Close of a client whose reconnects MayConnect refuses is quick (paho's
// Disconnect waited out a reconnect's backoff, up to CloseTimeout: the
// deposed active's stand-down then took 5 s before it could take over
// again), and it does not connect on the way.
func TestCloseWhileReconnectsAreRefused(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b mqtttest.Broker) {
		id := uniqueID(t, "mayclose")
		var may atomic.Bool
		var asked atomic.Int32
		may.Store(true)
		c1 := startClient(t, mqtt.Options{Broker: b.URL(), ClientID: id, Subscriptions: []string{id + "/cmd"}, Handler: newInbox().handler,
			MayConnect: func() bool { asked.Add(1); return may.Load() }})
		may.Store(false)
		before := asked.Load()
		c2 := startClient(t, mqtt.Options{Broker: b.URL(), ClientID: id})
		testkit.Eventually(t, 10*time.Second, "a reconnect refused", func() bool { return asked.Load() > before })
		start := time.Now()
		if err := c1.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("Close took %s with its reconnects refused, want well under a second", d)
		}
		if !c2.Connected() {
			t.Fatal("the other client lost its connection while the first closed")
		}
	})
}
