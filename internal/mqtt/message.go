package mqtt

import (
	"sync"

	paho "github.com/eclipse/paho.mqtt.golang"
)

// Message is one delivery from the broker.
type Message struct {
	Topic   string
	Payload []byte
	// Retained is true for the replay of a retained message (sent because
	// a subscription matched it), never for a live publish: docs/protocol.md
	// says such a delivery is never a new command.
	Retained bool
	// Duplicate is the DUP flag: the broker may have sent this message
	// before (it does so when it resends an unacknowledged message to a
	// persistent session after a reconnect). Deduplication is by content
	// (op_id), not by this flag: a message that reached a crashed agent
	// comes again with Duplicate true, and one whose first send never
	// made it may too.
	Duplicate bool
	QoS       byte
	// PacketID is the MQTT packet identifier (0 for QoS 0), for logs.
	PacketID uint16
	// Seq numbers the deliveries of one Client from 1 in arrival order,
	// across reconnects, for logs and tests.
	Seq uint64

	pm    paho.Message
	acks  *acker
	acked bool // guarded by acks.mu
	once  sync.Once
}

// Ack acknowledges the delivery (sends its PUBACK). It may be called from
// any goroutine, never blocks on the network, and only the first call
// counts.
//
// PUBACKs go out in arrival order: an Ack is held back until every
// earlier delivery of the same Client has been acked too. So every
// delivery must be acked exactly once, including the ones that are
// ignored (retained replays, empty payloads, garbage): one forgotten Ack
// stalls all later ones, and the broker stops sending once its in-flight
// window (mosquitto's max_inflight_messages) is full of unacked messages.
//
// An Ack that arrives after the connection that carried the message was
// lost is dropped (paho cannot send it on the new connection); the broker
// sends the message again on the new connection with Duplicate set.
func (m *Message) Ack() {
	if m.acks == nil {
		return
	}
	m.once.Do(func() { m.acks.ack(m) })
}

// acker releases PUBACKs in arrival order, from a goroutine of its own so
// that neither Ack nor paho's router goroutine ever blocks on the network.
//
// Invariant: waiting[head:] holds every arrived message not yet released,
// in arrival order; ready holds released messages not yet handed to paho,
// in arrival order; run hands them to paho in that order.
type acker struct {
	mu      sync.Mutex
	seq     uint64
	waiting []*Message
	head    int
	ready   []*Message

	wake chan struct{} // capacity 1: "ready is not empty"
	stop chan struct{} // closed by close
	done chan struct{} // closed when run returns
}

func newAcker() *acker {
	return &acker{
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
}

// arrive registers m as the latest delivery; called on paho's router
// goroutine before the handler sees m.
func (a *acker) arrive(m *Message) {
	a.mu.Lock()
	a.seq++
	m.Seq = a.seq
	m.acks = a
	a.waiting = append(a.waiting, m)
	a.mu.Unlock()
}

func (a *acker) ack(m *Message) {
	a.mu.Lock()
	m.acked = true
	released := false
	for a.head < len(a.waiting) && a.waiting[a.head].acked {
		a.ready = append(a.ready, a.waiting[a.head])
		a.waiting[a.head] = nil
		a.head++
		released = true
	}
	switch {
	case a.head == len(a.waiting):
		a.waiting, a.head = a.waiting[:0], 0
	case a.head >= 1024 && a.head*2 >= len(a.waiting):
		n := copy(a.waiting, a.waiting[a.head:])
		clear(a.waiting[n:])
		a.waiting, a.head = a.waiting[:n], 0
	}
	a.mu.Unlock()
	if released {
		select {
		case a.wake <- struct{}{}:
		default:
		}
	}
}

// run hands released acks to paho until close; on close it sends what is
// already released (so a clean Close does not cause needless redelivery)
// and returns.
func (a *acker) run() {
	defer close(a.done)
	for {
		select {
		case <-a.wake:
			a.flush()
		case <-a.stop:
			a.flush()
			return
		}
	}
}

func (a *acker) flush() {
	a.mu.Lock()
	batch := a.ready
	a.ready = nil
	a.mu.Unlock()
	for _, m := range batch {
		m.pm.Ack() // paho: a PUBACK for QoS 1, nothing for QoS 0
	}
}

// close stops run after a last flush and waits for it. Only for a started
// acker.
func (a *acker) close() {
	close(a.stop)
	<-a.done
}
