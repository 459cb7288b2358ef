package mqtt_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/mqtt"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// With Brokers, the client connects to the first node, and when that node
// dies it moves to the next one: it subscribes there, publishes its status
// there, sends there in order what was published while it was away, and
// its in-order acknowledgements carry on (a later session on that node
// gets nothing again). Each node is its own mosquitto, so the session
// itself does not move (that is a cluster's job): what moves is the client.
func TestBrokersMoveToTheNextNode(t *testing.T) {
	n1, n2 := mqtttest.StartMosquitto(t), mqtttest.StartMosquitto(t)
	id, topic := uniqueID(t, "fo"), uniqueID(t, "fo")+"/cmd"
	status := id + "/status"
	opts := func(in inbox, brokers ...string) mqtt.Options {
		return mqtt.Options{Brokers: brokers, ClientID: id, Subscriptions: []string{topic}, Handler: in.handler,
			WillTopic: status, WillPayload: []byte("offline"), OnlinePayload: []byte("online"), OfflinePayload: []byte("offline")}
	}
	in := newInbox()
	c := startClient(t, opts(in, n1.URL(), n2.URL()))
	if c.Broker() != n1.URL() {
		t.Fatalf("connected to %s, want the first node %s", c.Broker(), n1.URL())
	}
	pub1 := startClient(t, mqtt.Options{Broker: n1.URL(), ClientID: id + "-pub1"})
	publish(t, pub1, topic, "on-1")
	m := in.next(t, 5*time.Second)
	if string(m.Payload) != "on-1" {
		t.Fatalf("got %q, want on-1", m.Payload)
	}
	m.Ack()

	statuses := mqtttest.Subscribe(t, n2.URL(), status)
	out := mqtttest.Subscribe(t, n2.URL(), id+"/out")
	n1.Kill()
	// Once the client has seen the loss (a publish racing it onto the
	// dying connection fails with it, and the agent's outbox sends it
	// again; seen once in CI): published while it has no connection, or
	// already on the next node.
	testkit.Eventually(t, 10*time.Second, "the client saw node 1 go", func() bool {
		return !c.Connected() || c.Broker() == n2.URL()
	})

	// Published while the client has no connection: queued, and sent in
	// order on the next node.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var pend []*mqtt.Pending
	for i := range 5 {
		p, err := c.PublishAsync(ctx, id+"/out", fmt.Appendf(nil, "out-%d", i), false)
		if err != nil {
			t.Fatal(err)
		}
		pend = append(pend, p)
	}
	mqtttest.AwaitPayload(t, statuses, 30*time.Second, "online")
	if c.Broker() != n2.URL() || !c.Subscribed() {
		t.Fatalf("on %s, subscribed %v; want subscribed on %s", c.Broker(), c.Subscribed(), n2.URL())
	}
	for _, p := range pend {
		if err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		mqtttest.AwaitPayload(t, out, 5*time.Second, fmt.Sprintf("out-%d", i))
	}

	pub2 := startClient(t, mqtt.Options{Broker: n2.URL(), ClientID: id + "-pub2"})
	for i := range 3 {
		publish(t, pub2, topic, fmt.Sprintf("on-2-%d", i))
	}
	var got []*mqtt.Message
	for i := range 3 {
		m := in.next(t, 5*time.Second)
		if want := fmt.Sprintf("on-2-%d", i); string(m.Payload) != want {
			t.Fatalf("delivery %d on node 2: %q, want %q", i, m.Payload, want)
		}
		got = append(got, m)
	}
	for i := len(got) - 1; i >= 0; i-- { // acked backwards, sent in order
		got[i].Ack()
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	// The acknowledgements reached node 2: a new session there gets only
	// new messages.
	in2 := newInbox()
	startClient(t, opts(in2, n2.URL()))
	publish(t, pub2, topic, "after")
	if m := in2.next(t, 5*time.Second); string(m.Payload) != "after" || m.Duplicate {
		t.Fatalf("got %q dup=%v, want after (nothing redelivered)", m.Payload, m.Duplicate)
	}
}
