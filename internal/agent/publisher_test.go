package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// scriptedPublisher stands in for the MQTT session where the real broker
// cannot produce the fault on demand: PublishAsync fails for the topics
// listed in fail (transient: once each; permanent: always, wrapping
// ErrUnpublishable), a publish of a topic in nackOnce is taken but its
// acknowledgement fails (the session dropped in flight; once each), and
// every other accepted publish is acknowledged at once.
type scriptedPublisher struct {
	mu        sync.Mutex
	accepted  []string
	failOnce  map[string]bool
	permanent map[string]bool
	nackOnce  map[string]bool
}

type donePending struct {
	ch  chan struct{}
	err error
}

func (p donePending) Done() <-chan struct{} { return p.ch }
func (p donePending) Err() error            { return p.err }

func (s *scriptedPublisher) PublishAsync(_ context.Context, topic string, _ []byte, _ bool) (Pending, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.permanent[topic] {
		return nil, fmt.Errorf("%w: topic too long", ErrUnpublishable)
	}
	if s.failOnce[topic] {
		delete(s.failOnce, topic)
		return nil, errors.New("connection lost")
	}
	s.accepted = append(s.accepted, topic)
	ch := make(chan struct{})
	close(ch)
	if s.nackOnce[topic] {
		delete(s.nackOnce, topic)
		return donePending{ch, errors.New("connection lost before PUBACK")}, nil
	}
	return donePending{ch: ch}, nil
}

func (s *scriptedPublisher) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.accepted)
}

func testPublisher(t *testing.T, fake *scriptedPublisher) (*Agent, *publisher) {
	t.Helper()
	a := &Agent{o: Options{Publisher: fake}, log: slog.New(slog.DiscardHandler), m: newMetrics(nil), failed: make(chan struct{})}
	p := newPublisher(a)
	a.pub = p
	t.Cleanup(p.stop)
	return a, p
}

// queue pushes answers t1..tn (each with a done channel, like answerNow's)
// before the publisher runs, so they are all in the queue at its first
// pass.
func queue(p *publisher, topics ...string) []chan struct{} {
	var dones []chan struct{}
	for _, tp := range topics {
		d := make(chan struct{})
		dones = append(dones, d)
		p.push(pubItem{topic: tp, payload: []byte(`{}`), done: d})
	}
	return dones
}

func waitAll(t *testing.T, dones []chan struct{}) {
	t.Helper()
	for i, d := range dones {
		select {
		case <-d:
		case <-time.After(10 * time.Second):
			t.Fatalf("item %d never completed", i+1)
		}
	}
}

// A past defect: a publish that failed was put back ahead of the
// older items still in flight, reversing publish order. After a transient
// failure of t3, what the broker takes again starts with the oldest
// (t1, t2) and goes on in order.
func TestPublisherRequeuesInOrder(t *testing.T) {
	fake := &scriptedPublisher{failOnce: map[string]bool{"t3": true}}
	_, p := testPublisher(t, fake)
	dones := queue(p, "t1", "t2", "t3", "t4", "t5")
	p.run()
	waitAll(t, dones)
	want := []string{"t1", "t2", "t1", "t2", "t3", "t4", "t5"}
	if got := fake.seen(); !slices.Equal(got, want) {
		t.Fatalf("publishes %v, want %v (the failure must not reorder)", got, want)
	}
}

// A past defect: a message that can never be published was retried at
// the head of the queue for ever, and every later Result waited behind it.
// It is dropped, counted, and the rest goes out in order.
func TestPublisherDropsTheUnpublishable(t *testing.T) {
	fake := &scriptedPublisher{permanent: map[string]bool{"t2": true}}
	a, p := testPublisher(t, fake)
	dones := queue(p, "t1", "t2", "t3", "t4")
	p.run()
	waitAll(t, dones) // t2's waiter is released too
	if got, want := fake.seen(), []string{"t1", "t3", "t4"}; !slices.Equal(got, want) {
		t.Fatalf("publishes %v, want %v", got, want)
	}
	if n := testutil.ToFloat64(a.m.unpublishable); n != 1 {
		t.Fatalf("unpublishable counted %v times, want 1", n)
	}
}

// A publish the broker took but never acknowledged (the session dropped
// in flight) is sent again, with everything sent after it, in order; what
// was acknowledged before it is not sent twice.
func TestPublisherRequeuesAnUnacknowledgedPublishInOrder(t *testing.T) {
	fake := &scriptedPublisher{nackOnce: map[string]bool{"t2": true}}
	_, p := testPublisher(t, fake)
	dones := queue(p, "t1", "t2", "t3")
	p.run()
	waitAll(t, dones)
	want := []string{"t1", "t2", "t3", "t2", "t3"}
	if got := fake.seen(); !slices.Equal(got, want) {
		t.Fatalf("publishes %v, want %v", got, want)
	}
}
