package mqtt

import (
	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
)

// copyingStore is paho's ordered memory store, except that it keeps a
// private copy of each PUBLISH it is given and hands out copies of it.
// paho's Publish stores the very packet object it then gives the outgoing
// goroutine, whose Write sets fields of it (RemainingLength); on a connect
// of a persistent session, resume() takes the stored packets, reads them
// and sets their DUP flag, possibly while that Write is under way: data
// races inside paho (eclipse-paho/paho.mqtt.golang#703, open), which the
// race detector reports in our tests now that writes return sooner
// (conn.go). The first workaround copied on Get only, and still raced with
// Write while copying (seen under -race in e2e). With copies on both
// sides, no packet object is shared between the store and a writer; what
// goes on the wire is unchanged (paho may already send such a packet
// twice; QoS 1 allows it). The payload is shared: nobody writes to it.
type copyingStore struct{ paho.Store }

func newStore() paho.Store { return copyingStore{paho.NewOrderedMemoryStore()} }

func (s copyingStore) Put(key string, p packets.ControlPacket) {
	s.Store.Put(key, copyPublish(p))
}

func (s copyingStore) Get(key string) packets.ControlPacket {
	return copyPublish(s.Store.Get(key))
}

// copyPublish returns a copy of a PUBLISH, any other packet as it is.
func copyPublish(p packets.ControlPacket) packets.ControlPacket {
	if pp, ok := p.(*packets.PublishPacket); ok {
		cp := *pp
		return &cp
	}
	return p
}
