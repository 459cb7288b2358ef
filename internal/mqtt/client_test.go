package mqtt_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/mqtt"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

func TestNewValidatesOptions(t *testing.T) {
	ok := mqtt.Options{Broker: "tcp://127.0.0.1:1883", ClientID: "c"}
	h := func(*mqtt.Message) {}
	tests := []struct {
		name   string
		change func(*mqtt.Options)
		want   string // "" means valid
	}{
		{"minimal", func(*mqtt.Options) {}, ""},
		{"ssl with tls files", func(o *mqtt.Options) {
			o.Broker = "ssl://h:8883"
			o.TLS = mqtt.TLSOptions{CAFile: "ca.pem", CertFile: "c.pem", KeyFile: "k.pem"}
		}, ""},
		{"full", func(o *mqtt.Options) {
			o.Subscriptions, o.Handler = []string{"edge/gw/devices/+/cmd", "a/#"}, h
			o.WillTopic, o.WillPayload, o.OnlinePayload, o.OfflinePayload = "edge/gw/status", []byte("off"), []byte("on"), []byte("off")
		}, ""},
		{"no broker", func(o *mqtt.Options) { o.Broker = "" }, "mqtt: invalid options: broker is required"},
		{"bad scheme", func(o *mqtt.Options) { o.Broker = "http://h:1" }, `mqtt: invalid options: broker "http://h:1": scheme must be tcp, mqtt, ssl, tls, mqtts, ws or wss`},
		{"no host", func(o *mqtt.Options) { o.Broker = "tcp://" }, `mqtt: invalid options: broker "tcp://": no host`},
		{"brokers", func(o *mqtt.Options) { o.Broker, o.Brokers = "", []string{"tcp://a:1", "ssl://b:2"} }, ""},
		{"broker and brokers", func(o *mqtt.Options) { o.Brokers = []string{"tcp://a:1"} }, "mqtt: invalid options: broker and brokers: set one of them"},
		{"bad second node", func(o *mqtt.Options) { o.Broker, o.Brokers = "", []string{"tcp://a:1", "http://b:2"} }, `mqtt: invalid options: broker "http://b:2": scheme must be tcp, mqtt, ssl, tls, mqtts, ws or wss`},
		{"tls with a tcp node", func(o *mqtt.Options) {
			o.Broker, o.Brokers, o.TLS.CAFile = "", []string{"ssl://a:1", "tcp://b:2"}, "ca.pem"
		}, `mqtt: invalid options: tls files are set but broker "tcp://b:2" is not ssl://`},
		{"no client id", func(o *mqtt.Options) { o.ClientID = "" }, "mqtt: invalid options: client_id is required (a persistent session needs a stable one)"},
		{"password alone", func(o *mqtt.Options) { o.Password = "p" }, "mqtt: invalid options: password without username"},
		{"cert without key", func(o *mqtt.Options) {
			o.Broker, o.TLS.CertFile = "ssl://h:1", "c.pem"
		}, "mqtt: invalid options: tls: cert_file and key_file go together"},
		{"tls on tcp", func(o *mqtt.Options) { o.TLS.CAFile = "ca.pem" }, `mqtt: invalid options: tls files are set but broker "tcp://127.0.0.1:1883" is not ssl://`},
		{"bad filter", func(o *mqtt.Options) { o.Subscriptions, o.Handler = []string{"a/#/b"}, h }, `mqtt: invalid options: subscription "a/#/b" is not a valid topic filter`},
		{"partial plus", func(o *mqtt.Options) { o.Subscriptions, o.Handler = []string{"a/b+"}, h }, `mqtt: invalid options: subscription "a/b+" is not a valid topic filter`},
		{"subscriptions without handler", func(o *mqtt.Options) { o.Subscriptions = []string{"a"} }, "mqtt: invalid options: subscriptions need a handler"},
		{"wildcard will", func(o *mqtt.Options) { o.WillTopic = "a/+" }, `mqtt: invalid options: will topic "a/+" is not a valid topic`},
		{"online without topic", func(o *mqtt.Options) { o.OnlinePayload = []byte("x") }, "mqtt: invalid options: will, online and offline payloads need a will topic"},
		{"empty will", func(o *mqtt.Options) { o.WillTopic = "s" }, `mqtt: invalid options: will topic "s" needs a will payload`},
		{"negative timeout", func(o *mqtt.Options) { o.ConnectTimeout = -1 }, "mqtt: invalid options: timeouts must not be negative"},
		{"tiny keepalive", func(o *mqtt.Options) { o.KeepAlive = time.Millisecond }, "mqtt: invalid options: keep_alive must be at least 1s"},
		{"huge inflight", func(o *mqtt.Options) { o.MaxInflight = 70000 }, "mqtt: invalid options: max_inflight 70000 is outside 0..60000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := ok
			tt.change(&o)
			_, err := mqtt.New(o)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil || err.Error() != tt.want {
				t.Fatalf("New error = %v, want %q", err, tt.want)
			}
			if !errors.Is(err, mqtt.ErrInvalidOptions) {
				t.Fatalf("error %v is not ErrInvalidOptions", err)
			}
		})
	}
}

func TestValidFilterAndTopic(t *testing.T) {
	for f, want := range map[string]bool{
		"a": true, "a/b": true, "+": true, "#": true, "a/+/c": true, "a/#": true, "/": true,
		"": false, "a/#/c": false, "a+": false, "a/b#": false, "a\x00": false,
	} {
		if got := mqtt.ValidFilter(f); got != want {
			t.Errorf("ValidFilter(%q) = %v, want %v", f, got, want)
		}
	}
	for s, want := range map[string]bool{"a/b": true, "": false, "a/+": false, "#": false, "a\x00": false} {
		if got := mqtt.ValidTopic(s); got != want {
			t.Errorf("ValidTopic(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestLifecycleErrors(t *testing.T) {
	c, err := mqtt.New(mqtt.Options{Broker: "tcp://127.0.0.1:1", ClientID: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishAsync(context.Background(), "a", nil, false); !errors.Is(err, mqtt.ErrNotStarted) {
		t.Fatalf("publish before Start: %v, want ErrNotStarted", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := c.Start(context.Background()); !errors.Is(err, mqtt.ErrClosed) {
		t.Fatalf("Start after Close: %v, want ErrClosed", err)
	}
	if err := c.Publish(context.Background(), "a", nil, false); !errors.Is(err, mqtt.ErrClosed) {
		t.Fatalf("Publish after Close: %v, want ErrClosed", err)
	}
}

func TestStartGivesUpWithContext(t *testing.T) {
	// Nothing listens on this port (it was free a moment ago).
	b := mqtttest.StartMosquitto(t)
	b.Stop()
	c, err := mqtt.New(mqtt.Options{Broker: b.URL(), ClientID: uniqueID(t, "ctx"), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := c.Start(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Start = %v, want DeadlineExceeded", err)
	}
	if err := c.Start(context.Background()); !errors.Is(err, mqtt.ErrStarted) {
		t.Fatalf("second Start = %v, want ErrStarted", err)
	}
}

func TestStartWaitsForTheBroker(t *testing.T) {
	b := mqtttest.StartMosquitto(t)
	b.Stop()
	in := newInbox()
	c, err := mqtt.New(mqtt.Options{Broker: b.URL(), ClientID: uniqueID(t, "wait"),
		Subscriptions: []string{"wait/#"}, Handler: in.handler, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done <- c.Start(ctx)
	}()
	time.Sleep(300 * time.Millisecond) // a few refused attempts
	if c.Subscribed() {
		t.Fatal("Subscribed while the broker is down")
	}
	b.Restart()
	if err := <-done; err != nil {
		t.Fatalf("Start: %v", err)
	}
	if !c.Subscribed() {
		t.Fatal("Start returned but not Subscribed")
	}
}

func TestPublishRoundTrip(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b mqtttest.Broker) {
		in := newInbox()
		sub := startClient(t, mqtt.Options{Broker: b.URL(), ClientID: uniqueID(t, "rt-sub"),
			Subscriptions: []string{"rt/+/cmd"}, Handler: in.handler})
		if !sub.Subscribed() {
			t.Fatal("not Subscribed after Start")
		}
		pub := startClient(t, mqtt.Options{Broker: b.URL(), ClientID: uniqueID(t, "rt-pub")})
		publish(t, pub, "rt/dev-1/cmd", "hello")
		m := in.next(t, 5*time.Second)
		if m.Topic != "rt/dev-1/cmd" || string(m.Payload) != "hello" || m.Retained || m.Duplicate || m.QoS != 1 || m.Seq != 1 {
			t.Fatalf("got %+v", m)
		}
		m.Ack()

		// Pipelined publishes arrive complete and in order.
		ctx := context.Background()
		var pend []*mqtt.Pending
		for i := range 500 {
			p, err := pub.PublishAsync(ctx, "rt/dev-2/cmd", []byte(fmt.Sprint(i)), false)
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
		for i := range 500 {
			m := in.next(t, 5*time.Second)
			if string(m.Payload) != fmt.Sprint(i) {
				t.Fatalf("message %d: payload %q", i, m.Payload)
			}
			m.Ack()
		}
		if _, err := pub.PublishAsync(ctx, "rt/+/cmd", nil, false); !errors.Is(err, mqtt.ErrInvalidTopic) {
			t.Fatalf("wildcard publish: %v, want ErrInvalidTopic", err)
		}
	})
}

// Acks are released in arrival order; whatever was not released is
// redelivered (Duplicate) to the next session with the same client ID.
func TestManualAckOrderAndRedelivery(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b mqtttest.Broker) {
		id, topic := uniqueID(t, "ack"), uniqueID(t, "ack")+"/cmd"
		pub := startClient(t, mqtt.Options{Broker: b.URL(), ClientID: id + "-pub"})
		opts := func(in inbox) mqtt.Options {
			return mqtt.Options{Broker: b.URL(), ClientID: id, Subscriptions: []string{topic}, Handler: in.handler,
				// Close's offline publish makes the broker process the acks
				// before the next session takes over (see Close).
				WillTopic: id + "/status", WillPayload: []byte("will"), OfflinePayload: []byte("offline")}
		}

		in1 := newInbox()
		c1 := startClient(t, opts(in1))
		for _, p := range []string{"m1", "m2", "m3"} {
			publish(t, pub, topic, p)
		}
		var got []*mqtt.Message
		for range 3 {
			got = append(got, in1.next(t, 5*time.Second))
		}
		for i, m := range got {
			if want := fmt.Sprintf("m%d", i+1); string(m.Payload) != want || m.Duplicate {
				t.Fatalf("delivery %d: %q dup=%v, want %q", i, m.Payload, m.Duplicate, want)
			}
		}
		got[2].Ack() // held: m1 and m2 are not acked
		got[1].Ack() // held: m1 is not acked
		if err := c1.Close(); err != nil {
			t.Fatal(err)
		}

		in2 := newInbox()
		c2 := startClient(t, opts(in2))
		for i := range 3 {
			m := in2.next(t, 5*time.Second)
			if want := fmt.Sprintf("m%d", i+1); string(m.Payload) != want || !m.Duplicate {
				t.Fatalf("redelivery %d: %q dup=%v, want %q dup=true", i, m.Payload, m.Duplicate, want)
			}
			m.Ack()
		}
		publish(t, pub, topic, "m4")
		if m := in2.next(t, 5*time.Second); string(m.Payload) != "m4" {
			t.Fatalf("got %q, want m4", m.Payload)
		} else {
			m.Ack()
		}
		if err := c2.Close(); err != nil {
			t.Fatal(err)
		}

		// Everything was acked: the next session gets only new messages.
		in3 := newInbox()
		startClient(t, opts(in3))
		publish(t, pub, topic, "m5")
		if m := in3.next(t, 5*time.Second); string(m.Payload) != "m5" || m.Duplicate {
			t.Fatalf("got %q dup=%v, want m5 (nothing redelivered)", m.Payload, m.Duplicate)
		}
	})
}

// A connection that dies (no DISCONNECT) is re-established by the client
// itself, and the unacked message comes again on the new connection.
func TestRedeliveryAfterConnectionCut(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b mqtttest.Broker) {
		id, topic := uniqueID(t, "cut"), uniqueID(t, "cut")+"/cmd"
		proxy := testkit.NewProxy(t, b.URL())
		pub := startClient(t, mqtt.Options{Broker: b.URL(), ClientID: id + "-pub"})
		in := newInbox()
		opts := mqtt.Options{Broker: proxy.URL(), ClientID: id, Subscriptions: []string{topic}, Handler: in.handler,
			WillTopic: id + "/status", WillPayload: []byte("will"), OfflinePayload: []byte("offline")}
		c := startClient(t, opts)

		publish(t, pub, topic, "m1")
		first := in.next(t, 5*time.Second)
		proxy.Cut()
		again := in.next(t, 15*time.Second)
		if string(again.Payload) != "m1" || !again.Duplicate {
			t.Fatalf("redelivery: %q dup=%v, want m1 dup=true", again.Payload, again.Duplicate)
		}
		testkit.Eventually(t, 5*time.Second, "subscribed again", c.Subscribed)
		first.Ack() // its connection is gone: dropped by paho, releases the next
		again.Ack()
		publish(t, pub, topic, "m2")
		if m := in.next(t, 5*time.Second); string(m.Payload) != "m2" {
			t.Fatalf("got %q, want m2", m.Payload)
		} else {
			m.Ack()
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}

		in2 := newInbox()
		opts.Handler = in2.handler
		startClient(t, opts)
		publish(t, pub, topic, "m3")
		if m := in2.next(t, 5*time.Second); string(m.Payload) != "m3" {
			t.Fatalf("got %q, want m3 (m1, m2 were acked)", m.Payload)
		}
	})
}

// After the broker restarts with its state lost, the client reconnects and
// subscribes again by itself.
func TestResubscribeAfterBrokerRestart(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b mqtttest.Broker) {
		topic := uniqueID(t, "resub") + "/cmd"
		in := newInbox()
		c := startClient(t, mqtt.Options{Broker: b.URL(), ClientID: uniqueID(t, "resub"),
			Subscriptions: []string{topic}, Handler: in.handler})
		b.Stop()
		testkit.Eventually(t, 5*time.Second, "Subscribed false while the broker is down", func() bool { return !c.Subscribed() })
		b.Wipe() // no persisted session: only a new SUBSCRIBE brings messages
		b.Restart()
		testkit.Eventually(t, 20*time.Second, "Subscribed again", c.Subscribed)
		mqtttest.Publish(t, b.URL(), topic, []byte("after"), false)
		if m := in.next(t, 5*time.Second); string(m.Payload) != "after" {
			t.Fatalf("got %q", m.Payload)
		} else {
			m.Ack()
		}
	})
}

// Messages published while the persistent subscriber is away are queued,
// survive a broker restart, and arrive in order when it returns.
func TestQueuedMessagesSurviveBrokerRestart(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b mqtttest.Broker) {
		id, topic := uniqueID(t, "offline"), uniqueID(t, "offline")+"/cmd"
		opts := func(in inbox) mqtt.Options {
			return mqtt.Options{Broker: b.URL(), ClientID: id, Subscriptions: []string{topic}, Handler: in.handler}
		}
		c := startClient(t, opts(newInbox()))
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		pub := startClient(t, mqtt.Options{Broker: b.URL(), ClientID: id + "-pub"})
		const n = 200
		for i := range n {
			publish(t, pub, topic, fmt.Sprint(i))
		}
		_ = pub.Close()
		b.Restart()

		in := newInbox()
		startClient(t, opts(in))
		seen := map[string]bool{}
		var order []string
		for len(seen) < n {
			m := in.next(t, 10*time.Second)
			if !seen[string(m.Payload)] {
				order = append(order, string(m.Payload))
			}
			seen[string(m.Payload)] = true
			m.Ack()
		}
		for i, p := range order {
			if p != fmt.Sprint(i) {
				t.Errorf("queued messages out of order after restart: position %d holds %s", i, p)
				break
			}
		}
	})
}

// The retained status topic: online on connect, the will when the
// connection dies, offline on Close.
func TestStatusOnlineOfflineAndWill(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b mqtttest.Broker) {
		status := uniqueID(t, "edge/gw") + "/status"
		watch := mqtttest.Subscribe(t, b.URL(), status)
		proxy := testkit.NewProxy(t, b.URL())
		c := startClient(t, mqtt.Options{Broker: proxy.URL(), ClientID: uniqueID(t, "status"),
			WillTopic: status, WillPayload: []byte("will"),
			OnlinePayload: []byte("online"), OfflinePayload: []byte("offline")})
		mqtttest.AwaitPayload(t, watch, 5*time.Second, "online")

		// The broker sees the connection die and sends the will. The
		// client is kept away until then: a reconnect that wins the race
		// is a session takeover, after which mochi drops the will (the
		// status is online again then, which is right, but proves nothing).
		proxy.Refuse(true)
		proxy.Cut()
		mqtttest.AwaitPayload(t, watch, 10*time.Second, "will")
		proxy.Refuse(false)
		// Reconnected by itself.
		mqtttest.AwaitPayload(t, watch, 15*time.Second, "online")
		now := mqtttest.Subscribe(t, b.URL(), status)
		if m := mqtttest.Await(t, now, 5*time.Second, nil); string(m.Payload) != "online" || !m.Retained {
			t.Fatalf("retained status after the reconnect: %q retained=%v, want online", m.Payload, m.Retained)
		}

		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		mqtttest.AwaitPayload(t, watch, 5*time.Second, "offline")

		late := mqtttest.Subscribe(t, b.URL(), status)
		if m := mqtttest.Await(t, late, 5*time.Second, nil); string(m.Payload) != "offline" || !m.Retained {
			t.Fatalf("retained status: %q retained=%v, want offline retained", m.Payload, m.Retained)
		}

		// ClearRetained removes it.
		pub := startClient(t, mqtt.Options{Broker: b.URL(), ClientID: uniqueID(t, "clear")})
		if err := pub.ClearRetained(context.Background(), status); err != nil {
			t.Fatal(err)
		}
		after := mqtttest.Subscribe(t, b.URL(), status)
		mqtttest.Publish(t, b.URL(), status, []byte("marker"), false)
		// mochi acknowledges a publish before routing it, so the clearing
		// message itself may still reach this new subscription (live,
		// empty): skip it, but no retained message may come.
		if m := mqtttest.Await(t, after, 5*time.Second, func(m mqtttest.Received) bool {
			return m.Retained || len(m.Payload) > 0
		}); string(m.Payload) != "marker" || m.Retained {
			t.Fatalf("after ClearRetained: %q retained=%v, want the marker", m.Payload, m.Retained)
		}
	})
}

// A client that publishes while it holds unacknowledged deliveries (the
// agent publishing Results) must not lose them: MQTT packet IDs are
// separate in each direction, so its own publish IDs may equal the IDs of
// the broker's deliveries to it.
func TestUnackedSurviveOwnPublishes(t *testing.T) {
	forEachBroker(t, func(t *testing.T, b mqtttest.Broker) {
		id, topic := uniqueID(t, "own"), uniqueID(t, "own")+"/cmd"
		pub := startClient(t, mqtt.Options{Broker: b.URL(), ClientID: id + "-pub"})
		opts := func(in inbox) mqtt.Options {
			return mqtt.Options{Broker: b.URL(), ClientID: id, Subscriptions: []string{topic}, Handler: in.handler}
		}
		in1 := newInbox()
		c1 := startClient(t, opts(in1))
		const n = 20
		for i := range n {
			publish(t, pub, topic, fmt.Sprint(i))
		}
		for range n {
			in1.next(t, 5*time.Second) // delivered, never acked
		}
		for i := range 3 * n { // IDs 1..60 from this client: they cover the deliveries' IDs
			publish(t, c1, topic+"/result", fmt.Sprint(i))
		}
		if err := c1.Close(); err != nil {
			t.Fatal(err)
		}
		in2 := newInbox()
		startClient(t, opts(in2))
		for i := range n {
			m := in2.next(t, 5*time.Second)
			if string(m.Payload) != fmt.Sprint(i) || !m.Duplicate {
				t.Fatalf("redelivery %d: %q dup=%v", i, m.Payload, m.Duplicate)
			}
			m.Ack()
		}
	})
}
