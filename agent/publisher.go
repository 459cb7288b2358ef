package agent

import (
	"context"
	"hash/fnv"
	"sync"
	"time"

	"github.com/edge-agent/edge-agent/store"
)

// pubItem is one message to publish: a Result from the outbox (seq > 0:
// deleted from the outbox once the broker acknowledged it), or a retained
// DeviceState (seq 0: not durable, the next state supersedes it).
type pubItem struct {
	seq      uint64
	topic    string
	payload  []byte
	retained bool
	dev      string
}

func outboxItem(e store.Outbox) pubItem {
	return pubItem{seq: e.Seq, topic: e.Topic, payload: e.Payload, dev: e.Device}
}

// publisher publishes Results and states from a few shards; a device always
// maps to the same shard, so its Results (an unknown one, then the final
// one) reach the broker in the order they were recorded.
type publisher struct {
	a      *Agent
	shards []*pubShard
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type pubShard struct {
	mu   sync.Mutex
	q    []pubItem
	busy bool
	wake chan struct{}
	idle chan struct{} // signalled when the shard empties
}

const pubShards = 16

func newPublisher(a *Agent) *publisher {
	p := &publisher{a: a}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	for i := 0; i < pubShards; i++ {
		p.shards = append(p.shards, &pubShard{wake: make(chan struct{}, 1), idle: make(chan struct{}, 1)})
	}
	return p
}

func (p *publisher) start() {
	for _, s := range p.shards {
		p.wg.Add(1)
		go p.run(s)
	}
}

func (p *publisher) stop() {
	p.cancel()
	p.wg.Wait()
}

func (p *publisher) push(it pubItem) {
	h := fnv.New32a()
	h.Write([]byte(it.dev))
	s := p.shards[h.Sum32()%pubShards]
	s.mu.Lock()
	s.q = append(s.q, it)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (p *publisher) run(s *pubShard) {
	defer p.wg.Done()
	for {
		s.mu.Lock()
		if len(s.q) == 0 {
			s.busy = false
			s.mu.Unlock()
			select {
			case s.idle <- struct{}{}:
			default:
			}
			select {
			case <-p.ctx.Done():
				return
			case <-s.wake:
				continue
			}
		}
		it := s.q[0]
		s.busy = true
		s.mu.Unlock()
		if !p.publish(it) {
			return
		}
		s.mu.Lock()
		s.q[0] = pubItem{}
		s.q = s.q[1:]
		s.mu.Unlock()
	}
}

// publish sends one item, retrying until the broker takes it or the
// publisher stops (then the outbox keeps it for the next start).
func (p *publisher) publish(it pubItem) bool {
	a := p.a
	wait := 100 * time.Millisecond
	for {
		select {
		case <-a.failed: // invariant 5: nothing more is published after a store failure
			return false
		default:
		}
		ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
		err := a.o.Publisher.Publish(ctx, it.topic, it.payload, it.retained)
		cancel()
		if err == nil {
			break
		}
		if p.ctx.Err() != nil {
			return false
		}
		a.log.Warn("publish failed; retrying", "topic", it.topic, "err", err)
		select {
		case <-p.ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait = min(wait*2, 2*time.Second)
	}
	if it.seq > 0 {
		a.m.published.Inc()
		// Not waited for: losing this delete in a crash only republishes
		// the Result (at least once).
		a.st.Submit(p.ctx, func(tx *store.Tx) error { return tx.OutboxDelete(it.seq) })
	}
	return true
}

// flush waits until every shard is empty, or ctx ends.
func (p *publisher) flush(ctx context.Context) {
	for _, s := range p.shards {
		for {
			s.mu.Lock()
			empty := len(s.q) == 0 && !s.busy
			s.mu.Unlock()
			if empty {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-s.idle:
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}
