package mqtt

import (
	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
)

// copyingStore is paho's ordered memory store, except that Get returns a
// copy of a stored PUBLISH. paho's resume() (on every connect of a
// persistent session) takes the stored packets and sets their DUP flag
// while the outgoing goroutine may still be writing the very same packet
// object, published a moment earlier: a data race inside paho
// (eclipse-paho/paho.mqtt.golang#703, open), which the race detector
// reports in our tests now that writes return sooner (conn.go). With a
// copy, resume marks and sends its own packet; what goes on the wire is
// unchanged (paho may already send such a packet twice; QoS 1 allows it).
type copyingStore struct{ paho.Store }

func newStore() paho.Store { return copyingStore{paho.NewOrderedMemoryStore()} }

func (s copyingStore) Get(key string) packets.ControlPacket {
	p := s.Store.Get(key)
	if pp, ok := p.(*packets.PublishPacket); ok {
		cp := *pp
		return &cp
	}
	return p
}
