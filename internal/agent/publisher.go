package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire/jws"
	"github.com/edge-agent/edge-agent/internal/clip"
	"github.com/edge-agent/edge-agent/internal/failpoint"
	"github.com/edge-agent/edge-agent/internal/store"
)

// pubItem is one message to publish: a Result from the outbox (seq > 0:
// deleted from the outbox once the broker acknowledged it), a retained
// DeviceState or an answer on arrival (seq 0: not durable). done, when set,
// is closed once the broker acknowledged it (or the publisher stopped).
type pubItem struct {
	seq      uint64
	topic    string
	payload  []byte
	retained bool
	dev      string
	done     chan struct{}
	signed   bool // payload is already signed (publisher.sign)
}

func outboxItem(e store.Outbox) pubItem {
	return pubItem{seq: e.Seq, topic: e.Topic, payload: e.Payload, dev: e.Device}
}

// publisher sends Results, states and answers in the order they were
// recorded, pipelined: up to window publishes are in flight at once and
// are confirmed in order; a confirmed Result is deleted from the outbox. A
// publish that fails (the broker is unreachable, the session dropped) is
// sent again, with everything sent after it, in the same order, after a
// backoff: nothing leaves the queue unconfirmed, so an unknown Result
// always reaches the broker before its operation's final one (a Result
// may be delivered more than once: controllers take the first final one).
type publisher struct {
	a      *Agent
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	q      []pubItem
	busy   int // in flight
	wake   chan struct{}
	idle   chan struct{}
	start  sync.Once
	states map[string]*stateSlot // by topic
}

const pubWindow = 256

// StateInterval is the least time between two retained DeviceStates of one
// device. A state that changes faster is held and only the latest is
// published when the interval is up: under load a device's state would
// otherwise cost one more publish (and one more PUBACK) per command. The
// first change after a quiet interval is published at once.
const StateInterval = 100 * time.Millisecond

type stateSlot struct {
	last time.Time // when the last state of this topic was queued
	held *pubItem  // the latest state, waiting for the interval
}

type inflight struct {
	it pubItem
	p  Pending
}

func newPublisher(a *Agent) *publisher {
	p := &publisher{a: a, wake: make(chan struct{}, 1), idle: make(chan struct{}, 1), done: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p
}

func (p *publisher) run() {
	p.start.Do(func() { go p.loop() })
}

func (p *publisher) stop() {
	p.cancel()
	p.run() // so done closes even if never started
	<-p.done
}

// isState reports whether it is a retained DeviceState (not a Result, an
// answer, or the clearing of a retained command).
func (it *pubItem) isState() bool {
	return it.retained && it.seq == 0 && it.done == nil && len(it.payload) > 0
}

func (p *publisher) push(it pubItem) {
	// The live feed (GET /v1/events) sees every Result and DeviceState
	// handed over here, without waiting for anyone.
	if p.a.ev.n.Load() > 0 {
		switch {
		case it.isState():
			p.a.ev.publish("state", it.payload)
		case !it.retained && len(it.payload) > 0:
			p.a.ev.publish("result", it.payload)
		}
	}
	p.mu.Lock()
	if it.isState() {
		if p.states == nil {
			p.states = map[string]*stateSlot{}
		}
		sl := p.states[it.topic]
		if sl == nil {
			sl = &stateSlot{}
			p.states[it.topic] = sl
		}
		now := time.Now()
		switch {
		case sl.held != nil:
			sl.held = &it // the timer publishes the latest
			p.mu.Unlock()
			return
		case now.Sub(sl.last) < StateInterval:
			sl.held = &it
			time.AfterFunc(sl.last.Add(StateInterval).Sub(now), func() { p.release(it.topic) })
			p.mu.Unlock()
			return
		}
		sl.last = now
		// A retained state supersedes one for the same topic that is
		// still waiting to be sent: only the latest matters.
		for i := len(p.q) - 1; i >= 0 && i >= len(p.q)-64; i-- {
			if q := &p.q[i]; q.retained && q.seq == 0 && q.done == nil && q.topic == it.topic && len(q.payload) > 0 {
				q.payload, q.signed = it.payload, false
				p.mu.Unlock()
				return
			}
		}
	}
	p.q = append(p.q, it)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// release queues the held state of topic ("" : every held state, at stop).
func (p *publisher) release(topic string) {
	p.mu.Lock()
	for t, sl := range p.states {
		if sl.held == nil || (topic != "" && t != topic) {
			continue
		}
		p.q = append(p.q, *sl.held)
		sl.held, sl.last = nil, time.Now()
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *publisher) loop() {
	defer close(p.done)
	a := p.a
	var fly []inflight
	defer func() {
		for _, f := range fly {
			if f.it.done != nil {
				close(f.it.done)
			}
		}
	}()
	backoff := 100 * time.Millisecond
	for {
		select {
		case <-a.failed: // invariant 5: nothing more is published after a store failure
			return
		case <-p.ctx.Done():
			return
		default:
		}
		// Fill the window.
		p.mu.Lock()
		var next *pubItem
		if len(p.q) > 0 && len(fly) < pubWindow {
			it := p.q[0]
			p.q[0] = pubItem{}
			p.q = p.q[1:]
			next = &it
		}
		p.busy = len(fly)
		if next != nil {
			p.busy++
		}
		qEmpty := len(p.q) == 0
		idle := qEmpty && p.busy == 0
		p.mu.Unlock()
		if idle {
			select {
			case p.idle <- struct{}{}:
			default:
			}
		}
		if next != nil {
			if next.seq > 0 {
				failpoint.Hit(failpoint.BeforePublish, "")
			}
			if err := p.sign(next); err != nil {
				p.drop(*next, err)
				continue
			}
			pend, err := a.o.Publisher.PublishAsync(p.ctx, next.topic, next.payload, next.retained)
			if err == nil {
				fly = append(fly, inflight{*next, pend})
				continue
			}
			if errors.Is(err, ErrUnpublishable) {
				// It never will be: drop it, logged and counted, rather
				// than block everything behind it.
				p.drop(*next, err)
				continue
			}
			// Everything in flight is older than next: it goes back
			// first, so the order holds.
			p.requeue(append(fly, inflight{it: *next})...)
			fly = fly[:0]
			if !p.pause(&backoff, err) {
				return
			}
			continue
		}
		if len(fly) == 0 {
			select {
			case <-p.ctx.Done():
				return
			case <-a.failed:
				return
			case <-p.wake:
			}
			continue
		}
		// Window full or queue empty: confirm the oldest.
		var waitCh <-chan struct{}
		if qEmpty {
			waitCh = p.wake // a new item may be sent while this one is confirmed
		}
		ok, err := p.confirm(fly[0], waitCh)
		if !ok {
			continue // woken by a new item
		}
		if err != nil {
			if p.ctx.Err() != nil {
				return // the outbox keeps it for the next start
			}
			p.requeue(fly...)
			fly = fly[:0]
			if !p.pause(&backoff, err) {
				return
			}
			continue
		}
		backoff = 100 * time.Millisecond
		f := fly[0]
		fly[0] = inflight{}
		fly = fly[1:]
		if f.it.done != nil {
			close(f.it.done)
		}
		if f.it.seq > 0 {
			failpoint.Hit(failpoint.AfterPublish, "")
			a.m.published.Inc()
			// Not waited for, and no commit of its own: it rides along
			// with the next one. Losing it in a crash only republishes
			// the Result (at least once).
			seq := f.it.seq
			a.st.Later(func(tx *store.Tx) error { return tx.OutboxDelete(seq) })
		}
	}
}

// sign makes it a JWS signed with the gateway's key (Options.ResultKey,
// kid = gateway_id), once: an item sent again after a failed publish
// keeps its signed payload. The clearing of a retained command (an empty
// payload) stays empty. Signing here, off the commit path, keeps the
// outbox in plain JSON: a key changed across a restart signs what is
// published from then on.
func (p *publisher) sign(it *pubItem) error {
	if p.a.o.ResultKey == nil || it.signed || len(it.payload) == 0 {
		return nil
	}
	b, err := jws.Sign(p.a.o.ResultKey, p.a.cfg.GatewayID, it.payload)
	if err != nil {
		return fmt.Errorf("signing: %w", err)
	}
	it.payload, it.signed = b, true
	return nil
}

// drop gives up an item that can never be published: a Result leaves the
// outbox (nothing would ever take it out), a waiter is released.
func (p *publisher) drop(it pubItem, err error) {
	p.a.m.unpublishable.Inc()
	p.a.log.Error("a message can never be published; dropped", "topic", clip.String(it.topic, 120), "topic_bytes", len(it.topic),
		"device", clip.String(it.dev, 80), "outbox_seq", it.seq, "err", err)
	if it.seq > 0 {
		seq := it.seq
		p.a.st.Later(func(tx *store.Tx) error { return tx.OutboxDelete(seq) })
	}
	if it.done != nil {
		close(it.done)
	}
}

// confirm waits for f's PUBACK; ok is false when wake fired first (or the
// publisher stopped).
func (p *publisher) confirm(f inflight, wake <-chan struct{}) (bool, error) {
	select {
	case <-f.p.Done():
		return true, f.p.Err()
	case <-wake:
		return false, nil
	case <-p.ctx.Done():
		return true, p.ctx.Err()
	}
}

// requeue puts items back at the head of the queue, in order.
func (p *publisher) requeue(items ...inflight) {
	p.mu.Lock()
	head := make([]pubItem, 0, len(items)+len(p.q))
	for _, f := range items {
		head = append(head, f.it)
	}
	p.q = append(head, p.q...)
	p.mu.Unlock()
}

func (p *publisher) pause(backoff *time.Duration, err error) bool {
	p.a.log.Warn("publish failed; will publish again in order", "err", err, "retry_in", backoff.String())
	select {
	case <-p.ctx.Done():
		return false
	case <-p.a.failed:
		return false
	case <-time.After(*backoff):
	}
	*backoff = min(*backoff*2, 2*time.Second)
	return true
}

// flush waits until everything queued (held states included) is
// confirmed, or ctx ends.
func (p *publisher) flush(ctx context.Context) {
	p.release("")
	for {
		p.mu.Lock()
		empty := len(p.q) == 0 && p.busy == 0
		p.mu.Unlock()
		if empty {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-p.idle:
		case <-time.After(50 * time.Millisecond):
		}
	}
}
