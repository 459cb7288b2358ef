package mqtt

import (
	"bytes"
	"cmp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/hooks/storage/bolt"
	"github.com/mochi-mqtt/server/v2/packets"
)

// sessionHook is mochi-mqtt v2.7.9's bbolt storage hook with four
// defects of mochi fixed around it, each of which loses or reorders QoS 1
// messages of a persistent session (the agent's command subscription).
// docs/mochi.md describes each, and mochi_defects_test.go reproduces each
// against upstream mochi:
//
//  1. The bolt hook does not store an in-flight message's packet ID. After
//     a broker restart every restored message has ID 0, they collapse
//     into one, and resending it to the returning client fails ("missing
//     packet id"): the client is disconnected on every connect and gets
//     nothing, forever. StoredInflightMessages takes the ID back from the
//     record's key (which ends in ":<packet id>").
//
//  2. mochi resends a session's in-flight messages sorted by
//     uint16(Created), Created being in seconds: after a reconnect the
//     messages of the same second come in random order (docs/design.md needs
//     each device's commands in order). The hook numbers every outbound
//     message (seq, stored as the record's Created so it survives a
//     restart) and, just before mochi resends (OnSessionEstablish), sets
//     each waiting message's in-memory Created to its rank in seq order,
//     so mochi's sort yields publish order. Messages routed afterwards get
//     the next ranks.
//
//  3. mochi keeps the packets of both directions of a client in one map
//     keyed by packet ID, but MQTT's IDs are per direction. When a client
//     sends a QoS 1 PUBLISH with the ID of a message the broker delivered
//     to it and that is not acked yet (the agent publishing a Result while
//     it holds commands), mochi deletes that message from memory and from
//     the store, so it is never redelivered after a crash; a SUBSCRIBE or
//     UNSUBSCRIBE with such an ID is refused (SUBACK 0x91), which after a
//     broker restart (IDs from 1 again on both sides) refuses the agent's
//     subscription. The hook moves such a message aside while the
//     client's packet is processed (from OnPacketRead until mochi is done
//     with the ID), does not store mochi's transient record of an inbound
//     QoS 1 publish, and does not let its completion delete the outbound
//     message's record. If mochi gave the freed ID to a new message
//     meanwhile, the message moved aside gets a new ID (a duplicate
//     delivery at worst, never a loss).
//
//  4. mochi sends the PUBACK of a QoS 1 publish before it routes the
//     message to the subscribers (and stores their copies), and each
//     connection routes on its own goroutine. A publish that a client
//     sends after the PUBACK of an earlier one, on another connection (a
//     controller that reconnects, one connection per command, two
//     controllers), can therefore be routed first: the subscriber gets
//     (and after a restart is resent) the later command first. The hook
//     makes routing one at a time, in the order the publishes reach
//     OnPublish: a connection takes the route lock in OnPublish, before
//     its PUBACK is sent, and gives it back in OnPacketProcessed, once
//     the message is routed; so a publish sent after a PUBACK is routed
//     after the acknowledged message. Storing the copies already takes
//     bbolt's single writer lock, so little concurrency is lost.
//
// It also keeps the store when a persistent session is taken over by a
// new connection (mochi "drops" the old connection's in-flight messages
// that the new one has just inherited).
type sessionHook struct {
	*bolt.Hook
	srv *mochi.Server // set before Serve

	route sync.Mutex // held by the connection routing a publish (fix 4)

	mu      sync.Mutex
	nextSeq int64
	seq     map[inflightID]int64 // outbound QoS 1 messages in some client's in-flight map
	rank    map[string]int64     // client ID -> next in-memory Created for its new messages
	// Per connection (a taken-over session has two with one client ID):
	inbound map[*mochi.Client]uint16  // ID of its QoS 1 publish being processed
	stash   map[*mochi.Client]stashed // its outbound message moved aside for it
	routing map[*mochi.Client]bool    // it holds route (fix 4)
	// restored is closed, and replaced, whenever a moved-aside message
	// goes back (restoreLocked): OnSessionEstablish waits on it without
	// holding mu.
	restored chan struct{}
}

// stashed is an outbound message moved out of its client's in-flight map
// while the client's own packet with the same ID is processed.
type stashed struct {
	pk     packets.Packet
	seq    int64
	hasSeq bool
}

type inflightID struct {
	client string
	id     uint16
}

func newSessionHook() *sessionHook {
	return &sessionHook{
		Hook:     new(bolt.Hook),
		seq:      map[inflightID]int64{},
		rank:     map[string]int64{},
		inbound:  map[*mochi.Client]uint16{},
		stash:    map[*mochi.Client]stashed{},
		routing:  map[*mochi.Client]bool{},
		restored: make(chan struct{}),
	}
}

// Provides adds the events the fixes need to the bolt hook's, and drops
// the $SYS statistics (a write every second, and an error logged at every
// start with an empty store, for numbers nobody needs restored).
func (h *sessionHook) Provides(b byte) bool {
	if b == mochi.OnSysInfoTick || b == mochi.StoredSysInfo {
		return false
	}
	return h.Hook.Provides(b) || bytes.Contains([]byte{
		mochi.OnSessionEstablish,
		mochi.OnPacketRead,
		mochi.OnPublish,
		mochi.OnPacketProcessed,
	}, []byte{b})
}

// StoredInflightMessages restores packet IDs (fix 1) and the publish
// order (fix 2) of the stored in-flight messages.
func (h *sessionHook) StoredInflightMessages() ([]storage.Message, error) {
	v, err := h.Hook.StoredInflightMessages()
	if err != nil {
		return v, err
	}
	kept := v[:0]
	for _, m := range v {
		if m.PacketID == 0 {
			i := strings.LastIndexByte(m.ID, ':')
			id, perr := strconv.ParseUint(m.ID[i+1:], 10, 16)
			if i < 0 || perr != nil || id == 0 {
				h.Log.Error("stored in-flight message without a packet id, skipped", "key", m.ID)
				continue
			}
			m.PacketID = uint16(id)
		}
		kept = append(kept, m)
	}
	slices.SortStableFunc(kept, func(a, b storage.Message) int { return cmp.Compare(a.Created, b.Created) })
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range kept {
		if m.FixedHeader.Type == packets.Publish {
			h.seq[inflightID{m.Client, m.PacketID}] = m.Created
			h.nextSeq = max(h.nextSeq, m.Created)
		}
	}
	return kept, nil
}

// OnQosPublish numbers new outbound messages (fix 2) and skips the
// transient record of an inbound QoS 1 publish (fix 3).
func (h *sessionHook) OnQosPublish(cl *mochi.Client, pk packets.Packet, sent int64, resends int) {
	switch pk.FixedHeader.Type {
	case packets.Puback:
		return
	case packets.Publish:
		h.mu.Lock()
		k := inflightID{cl.ID, pk.PacketID}
		s, known := h.seq[k]
		if !known {
			h.nextSeq++
			s = h.nextSeq
			h.seq[k] = s
			r := h.rank[cl.ID]
			h.rank[cl.ID] = r + 1
			if e, ok := cl.State.Inflight.Get(pk.PacketID); ok && e.FixedHeader.Type == packets.Publish {
				e.Created = r
				cl.State.Inflight.Set(e)
			}
		}
		h.mu.Unlock()
		pk.Created = s // the stored Created is the publish order
	}
	h.Hook.OnQosPublish(cl, pk, sent, resends)
}

// OnSessionEstablish runs before mochi hands a persistent session's
// in-flight messages to the new connection and resends them sorted by
// uint16(Created): it sets Created to each message's rank (fix 2).
func (h *sessionHook) OnSessionEstablish(cl *mochi.Client, pk packets.Packet) {
	if pk.Connect.Clean || h.srv == nil {
		return
	}
	old, ok := h.srv.Clients.Get(cl.ID)
	if !ok {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	// The old connection may be finishing a packet of its own with a
	// message moved aside: give it a moment to put it back, or this
	// session would not resend it.
	h.awaitRestoredLocked(cl.ID, 200*time.Millisecond)
	var msgs []packets.Packet
	for _, e := range old.State.Inflight.GetAll(false) {
		if e.FixedHeader.Type == packets.Publish {
			msgs = append(msgs, e)
		}
	}
	slices.SortStableFunc(msgs, func(a, b packets.Packet) int {
		return cmp.Compare(h.seq[inflightID{cl.ID, a.PacketID}], h.seq[inflightID{cl.ID, b.PacketID}])
	})
	for i, e := range msgs { // at most 65535: ranks fit mochi's uint16 sort key
		e.Created = int64(i)
		old.State.Inflight.Set(e)
	}
	h.rank[cl.ID] = int64(len(msgs))
}

// OnPacketRead moves aside the outbound message whose ID the client's
// QoS 1 PUBLISH, SUBSCRIBE or UNSUBSCRIBE reuses (fix 3).
func (h *sessionHook) OnPacketRead(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.restoreLocked(cl) // left over if the last packet's processing was cut short
	switch pk.FixedHeader.Type {
	case packets.Publish:
		if pk.FixedHeader.Qos != 1 || cl.Net.Inline {
			return pk, nil
		}
		h.inbound[cl] = pk.PacketID
	case packets.Subscribe, packets.Unsubscribe:
	default:
		return pk, nil
	}
	if e, ok := cl.State.Inflight.Get(pk.PacketID); ok && e.FixedHeader.Type == packets.Publish {
		cl.State.Inflight.Delete(pk.PacketID)
		k := inflightID{cl.ID, pk.PacketID}
		s, has := h.seq[k]
		delete(h.seq, k) // a new message mochi gives this ID meanwhile is numbered anew
		h.stash[cl] = stashed{pk: e, seq: s, hasSeq: has}
	}
	return pk, nil
}

// awaitRestoredLocked waits, for at most d, until no connection of
// clientID has a message moved aside. h.mu is held on entry and on
// return, and released during the wait (restoreLocked signals each
// message put back on h.restored).
func (h *sessionHook) awaitRestoredLocked(clientID string, d time.Duration) {
	if !h.stashedLocked(clientID) {
		return
	}
	timeout := time.NewTimer(d)
	defer timeout.Stop()
	for h.stashedLocked(clientID) {
		ch := h.restored
		h.mu.Unlock()
		select {
		case <-ch:
		case <-timeout.C:
			h.mu.Lock()
			return
		}
		h.mu.Lock()
	}
}

// stashedLocked reports whether a connection of clientID has a message
// moved aside. h.mu is held.
func (h *sessionHook) stashedLocked(clientID string) bool {
	for c := range h.stash {
		if c.ID == clientID {
			return true
		}
	}
	return false
}

// OnSubscribed runs once mochi has checked the SUBSCRIBE's packet ID and
// before it sends retained messages (which take new packet IDs): the
// message moved aside goes back now (fix 3).
func (h *sessionHook) OnSubscribed(cl *mochi.Client, pk packets.Packet, reasonCodes []byte) {
	h.mu.Lock()
	h.restoreLocked(cl)
	h.mu.Unlock()
	h.Hook.OnSubscribed(cl, pk, reasonCodes)
}

// OnUnsubscribed: as OnSubscribed, for UNSUBSCRIBE.
func (h *sessionHook) OnUnsubscribed(cl *mochi.Client, pk packets.Packet) {
	h.mu.Lock()
	h.restoreLocked(cl)
	h.mu.Unlock()
	h.Hook.OnUnsubscribed(cl, pk)
}

// OnPublish runs before mochi acknowledges a client's publish and routes
// it: the connection waits for its turn to route (fix 4). mochi calls
// OnPacketProcessed after every packet it passed to OnPublish, however
// the processing ended, and from the same goroutine. The inline client
// (not enabled by Embedded) sends no acknowledgements and may publish
// from several goroutines at once: it is left out.
func (h *sessionHook) OnPublish(cl *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.Net.Inline {
		return pk, nil
	}
	h.route.Lock()
	h.mu.Lock()
	h.routing[cl] = true
	h.mu.Unlock()
	return pk, nil
}

// OnPacketProcessed puts the message moved aside back if nothing did
// earlier (fix 3), and ends the routing of a publish (fix 4).
func (h *sessionHook) OnPacketProcessed(cl *mochi.Client, pk packets.Packet, _ error) {
	switch pk.FixedHeader.Type {
	case packets.Publish, packets.Subscribe, packets.Unsubscribe:
		h.mu.Lock()
		h.restoreLocked(cl)
		routed := h.routing[cl]
		delete(h.routing, cl)
		h.mu.Unlock()
		if routed {
			h.route.Unlock()
		}
	}
}

// restoreLocked ends the processing of cl's packet: the outbound message
// moved aside goes back into the in-flight map of the client ID's current
// connection (cl, or the one that took it over), under a new packet ID if
// mochi has given its ID to a new message meanwhile. h.mu is held.
func (h *sessionHook) restoreLocked(cl *mochi.Client) {
	delete(h.inbound, cl)
	st, ok := h.stash[cl]
	if !ok {
		return
	}
	delete(h.stash, cl)
	close(h.restored) // wakes OnSessionEstablish
	h.restored = make(chan struct{})
	cur := cl
	if h.srv != nil {
		if c, ok := h.srv.Clients.Get(cl.ID); ok {
			cur = c
		}
	}
	if !st.hasSeq {
		h.nextSeq++
		st.seq = h.nextSeq
	}
	e := st.pk
	if _, used := cur.State.Inflight.Get(e.PacketID); used {
		id, err := cur.NextPacketID()
		if err != nil {
			h.Log.Error("in-flight message lost: no packet id free", "client", cl.ID, "packet_id", e.PacketID)
			return
		}
		h.Log.Warn("in-flight message moved to a new packet id", "client", cl.ID, "packet_id", e.PacketID, "new_packet_id", id)
		e.PacketID = uint16(id)
		cur.State.Inflight.Set(e)
		h.seq[inflightID{cl.ID, e.PacketID}] = st.seq
		rec := e
		rec.Created = st.seq
		h.Hook.OnQosPublish(cur, rec, 0, 0) // its old record now holds the new message
		return
	}
	cur.State.Inflight.Set(e)
	h.seq[inflightID{cl.ID, e.PacketID}] = st.seq
}

// OnQosComplete ignores mochi completing its own ack of an inbound QoS 1
// publish: nothing was stored for it, and the record under that ID is an
// outbound message's (fix 3). mochi is done with the ID then, so the
// message moved aside goes back at once (before the publish is routed,
// which can take a while).
func (h *sessionHook) OnQosComplete(cl *mochi.Client, pk packets.Packet) {
	h.mu.Lock()
	if id, ok := h.inbound[cl]; ok && id == pk.PacketID && pk.FixedHeader.Type == packets.Puback {
		h.restoreLocked(cl)
		h.mu.Unlock()
		return
	}
	delete(h.seq, inflightID{cl.ID, pk.PacketID})
	h.mu.Unlock()
	h.Hook.OnQosComplete(cl, pk)
}

// OnQosDropped keeps the store when a persistent session is taken over:
// the new connection has inherited the messages mochi drops from the old.
func (h *sessionHook) OnQosDropped(cl *mochi.Client, pk packets.Packet) {
	if cl.IsTakenOver() {
		return
	}
	h.mu.Lock()
	delete(h.seq, inflightID{cl.ID, pk.PacketID})
	h.mu.Unlock()
	h.Hook.OnQosDropped(cl, pk)
}

// OnDisconnect also ends a packet whose processing was cut short, and
// forgets a clean session's numbering.
func (h *sessionHook) OnDisconnect(cl *mochi.Client, err error, expire bool) {
	h.mu.Lock()
	h.restoreLocked(cl)
	if expire && !cl.IsTakenOver() {
		delete(h.rank, cl.ID)
	}
	h.mu.Unlock()
	h.Hook.OnDisconnect(cl, err, expire)
}

// OnClientExpired forgets an expired session's numbering.
func (h *sessionHook) OnClientExpired(cl *mochi.Client) {
	h.mu.Lock()
	delete(h.rank, cl.ID)
	h.mu.Unlock()
	h.Hook.OnClientExpired(cl)
}
