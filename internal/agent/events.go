package agent

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// The live feed of GET /v1/events: every Result and DeviceState handed to
// the publisher is offered to each subscriber without waiting. A
// subscriber whose buffer is full is dropped (its stream ends; the page
// reconnects), so a slow or stalled client never slows the command path,
// and memory is bounded by MaxEventClients * EventBuffer events.
const (
	// MaxEventClients is the most /v1/events streams at once; more get 503.
	MaxEventClients = 16
	// EventBuffer is how many events a subscriber may fall behind before
	// it is dropped (a stream gathers up to 50 ms of them per write).
	EventBuffer = 4096
)

// subscriber is one /v1/events stream.
type subscriber struct {
	ch   chan Event
	gone chan struct{} // closed when dropped or unsubscribed
	once sync.Once
}

func (s *subscriber) end() { s.once.Do(func() { close(s.gone) }) }

// hub fans events out to subscribers.
type hub struct {
	n       atomic.Int32 // subscribers, read without the lock on every publish
	mu      sync.Mutex
	subs    map[*subscriber]struct{}
	dropped atomic.Uint64
}

// subscribe adds a subscriber; nil when MaxEventClients are connected.
func (h *hub) subscribe() *subscriber {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.subs) >= MaxEventClients {
		return nil
	}
	if h.subs == nil {
		h.subs = map[*subscriber]struct{}{}
	}
	s := &subscriber{ch: make(chan Event, EventBuffer), gone: make(chan struct{})}
	h.subs[s] = struct{}{}
	h.n.Store(int32(len(h.subs)))
	return s
}

func (h *hub) unsubscribe(s *subscriber) {
	h.mu.Lock()
	delete(h.subs, s)
	h.n.Store(int32(len(h.subs)))
	h.mu.Unlock()
	s.end()
}

// publish offers e to every subscriber and never blocks: called on the
// commit goroutine (after a commit) and by the intake. Without
// subscribers it costs one atomic load.
func (h *hub) publish(kind string, data []byte) {
	if h.n.Load() == 0 {
		return
	}
	e := Event{Kind: kind, Data: data}
	h.mu.Lock()
	for s := range h.subs {
		select {
		case s.ch <- e:
		default: // fell behind: dropped, never waited for
			delete(h.subs, s)
			h.dropped.Add(1)
			s.end()
		}
	}
	h.n.Store(int32(len(h.subs)))
	h.mu.Unlock()
}

// Event is one event of the live feed: Kind "result" or "state", Data the
// JSON document published.
type Event struct {
	Kind string
	Data []byte
}

// Subscription is one reader of the live feed (GET /v1/events).
type Subscription struct {
	h *hub
	s *subscriber
}

// Subscribe adds a reader of the live feed; ErrTooMany when
// MaxEventClients are reading. Close it when done.
func (a *Agent) Subscribe() (*Subscription, error) {
	s := a.ev.subscribe()
	if s == nil {
		return nil, fmt.Errorf("%w: %d event streams are open already", ErrTooMany, MaxEventClients)
	}
	return &Subscription{h: &a.ev, s: s}, nil
}

// Events delivers the feed's events in order.
func (s *Subscription) Events() <-chan Event { return s.s.ch }

// Gone is closed when the reader fell EventBuffer events behind and was
// dropped, or was closed.
func (s *Subscription) Gone() <-chan struct{} { return s.s.gone }

// Close ends the subscription.
func (s *Subscription) Close() { s.h.unsubscribe(s.s) }
