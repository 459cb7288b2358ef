package mqtttest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// Received is one message seen by Subscribe.
type Received struct {
	Topic     string
	Payload   []byte
	Retained  bool
	Duplicate bool
}

var clientSeq atomic.Uint64

func clientID(kind string) string {
	return fmt.Sprintf("mqtttest-%s-%d-%d", kind, time.Now().UnixNano()%1e9, clientSeq.Add(1))
}

// Subscribe connects a throwaway client (clean session, automatic acks) to
// url, subscribes to filter at QoS 1 and returns once the broker confirmed
// the subscription. Every message then arrives on the returned channel, in
// order, however slowly the test reads it (an unbounded queue sits in
// between). The client is disconnected in t.Cleanup. Retained messages
// matching filter arrive first, with Retained set.
func Subscribe(t testing.TB, url, filter string) <-chan Received {
	t.Helper()
	out := make(chan Received)
	var (
		mu    sync.Mutex
		queue []Received
		wake  = make(chan struct{}, 1)
		stop  = make(chan struct{})
		done  = make(chan struct{})
	)
	handler := func(_ paho.Client, m paho.Message) {
		mu.Lock()
		queue = append(queue, Received{Topic: m.Topic(), Payload: m.Payload(), Retained: m.Retained(), Duplicate: m.Duplicate()})
		mu.Unlock()
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	go func() {
		defer close(done)
		for {
			mu.Lock()
			var next *Received
			if len(queue) > 0 {
				next = &queue[0]
				queue = queue[1:]
			}
			mu.Unlock()
			if next == nil {
				select {
				case <-wake:
					continue
				case <-stop:
					return
				}
			}
			select {
			case out <- *next:
			case <-stop:
				return
			}
		}
	}()
	o := paho.NewClientOptions().AddBroker(url).SetClientID(clientID("sub")).
		SetCleanSession(true).SetProtocolVersion(4).SetAutoReconnect(true).
		SetConnectTimeout(5 * time.Second).SetOrderMatters(true).
		SetDefaultPublishHandler(handler).
		SetConnectionLostHandler(func(paho.Client, error) {})
	// Subscribe again after a reconnect (a clean session loses it), not on
	// the first connect: the SUBSCRIBE below does that, and a second one
	// would make the broker send the retained messages twice.
	var connects atomic.Int64
	o.SetOnConnectHandler(func(c paho.Client) {
		if connects.Add(1) > 1 {
			c.Subscribe(filter, 1, nil)
		}
	})
	c := paho.NewClient(o)
	t.Cleanup(func() {
		c.Disconnect(250)
		close(stop)
		<-done
	})
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("mqtttest: subscriber connect to %s: %v", url, tok.Error())
	}
	if tok := c.Subscribe(filter, 1, nil); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("mqtttest: subscribe %q on %s: %v", filter, url, tok.Error())
	}
	return out
}

// Await returns the first message from ch that match accepts (nil accepts
// any), discarding the others, and fails the test if none comes within
// timeout.
func Await(t testing.TB, ch <-chan Received, timeout time.Duration, match func(Received) bool) Received {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case m := <-ch:
			if match == nil || match(m) {
				return m
			}
		case <-deadline.C:
			t.Fatalf("mqtttest: no matching message within %s", timeout)
			return Received{}
		}
	}
}

// AwaitPayload waits for a message with exactly this payload (on any
// topic of the subscription).
func AwaitPayload(t testing.TB, ch <-chan Received, timeout time.Duration, payload string) Received {
	t.Helper()
	return Await(t, ch, timeout, func(m Received) bool { return string(m.Payload) == payload })
}

// Publish connects a throwaway client to url, publishes one QoS 1 message,
// waits for its PUBACK and disconnects; failures fail the test.
func Publish(t testing.TB, url, topic string, payload []byte, retained bool) {
	t.Helper()
	if err := TryPublish(url, topic, payload, retained); err != nil {
		t.Fatal(err)
	}
}

// TryPublish is Publish returning its error: for a broker that may drop a
// connection (a NATS node while its cluster elects leaders).
func TryPublish(url, topic string, payload []byte, retained bool) error {
	o := paho.NewClientOptions().AddBroker(url).SetClientID(clientID("pub")).
		SetCleanSession(true).SetProtocolVersion(4).SetAutoReconnect(false).
		SetConnectTimeout(5 * time.Second)
	c := paho.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return fmt.Errorf("mqtttest: publisher connect to %s: %v", url, tok.Error())
	}
	defer c.Disconnect(250)
	if tok := c.Publish(topic, 1, retained, payload); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return fmt.Errorf("mqtttest: publish to %s on %s: %v", topic, url, tok.Error())
	}
	return nil
}
