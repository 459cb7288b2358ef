package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/chaos"
)

// observer records every Result the agent publishes, to any controller's
// reply topic or a device's result topic, from a persistent session of its
// own (clean session false, QoS 1), so a Result whose controller has died
// is recorded too. It connects to the broker directly, not through the
// campaign's network faults.
type observer struct {
	rec *chaos.LineWriter
	cli paho.Client

	fleet   bool // every gateway's topics: record each Result's gateway
	mu      sync.Mutex
	ops     map[string]*opSeen // by op_id
	results int
}

// opSeen is what the observer has seen of one operation.
type opSeen struct {
	dev       string
	final     bool
	heldNow   bool  // the last Result (not a replay) was unknown
	unknownAt int64 // first unknown Result, 0: none
	codes     map[wire.Code]int
}

// newObserver subscribes to gateway's topics (gateway "+": every
// gateway's, each Result recorded with the gateway of its topic), on the
// first of brokers that answers (the nodes of a cluster: the next when
// its node is lost).
func newObserver(rec *chaos.LineWriter, brokers []string, prefix, gateway string) *observer {
	o := &observer{rec: rec, ops: map[string]*opSeen{}, fleet: gateway == "+"}
	topics := map[string]byte{
		prefix + "/" + gateway + "/controllers/+/reply": 1,
		prefix + "/" + gateway + "/devices/+/result":    1,
	}
	po := paho.NewClientOptions()
	for _, b := range brokers {
		po.AddBroker(b)
	}
	po.SetClientID("edge-chaos-observer").
		SetCleanSession(false).SetOrderMatters(true).SetAutoReconnect(true).SetConnectRetry(true).
		SetConnectRetryInterval(200 * time.Millisecond).SetMaxReconnectInterval(time.Second).
		SetDefaultPublishHandler(o.onMessage).
		SetOnConnectHandler(func(c paho.Client) { go subscribeUntilGranted(c, topics) })
	o.cli = paho.NewClient(po)
	return o
}

// subscribeUntilGranted subscribes to topics, again while the broker
// refuses (a NATS node that has just lost a peer refuses SUBSCRIBE for a
// few seconds: docs/operations.md) or the connection is up, for a minute.
func subscribeUntilGranted(c paho.Client, topics map[string]byte) {
	for i := 0; i < 300 && c.IsConnectionOpen(); i++ {
		tok := c.SubscribeMultiple(topics, nil)
		if tok.WaitTimeout(5*time.Second) && tok.Error() == nil {
			granted := true
			for _, q := range tok.(*paho.SubscribeToken).Result() {
				if q > 2 {
					granted = false
				}
			}
			if granted {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// start connects (retrying in the background until the broker is there).
func (o *observer) start() { o.cli.Connect() }

func (o *observer) close() { o.cli.Disconnect(250) }

func (o *observer) onMessage(_ paho.Client, m paho.Message) {
	if m.Retained() || len(m.Payload()) == 0 {
		return
	}
	var r wire.Result
	if err := json.Unmarshal(m.Payload(), &r); err != nil {
		o.rec.Write(chaos.Event{T: time.Now().UnixNano(), Src: "observer", Ev: chaos.EvNote, Err: fmt.Sprintf("%s: not a Result: %v", m.Topic(), err)})
		return
	}
	now := time.Now().UnixNano()
	ev := chaos.Event{T: now, Src: "observer", Ev: chaos.EvResult, Dev: r.Device, Op: r.OpID, Fence: r.Fence, Result: &r}
	if o.fleet {
		if parts := strings.Split(m.Topic(), "/"); len(parts) > 1 {
			ev.Gw = parts[1]
		}
	}
	o.rec.Write(ev)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.results++
	s := o.ops[r.OpID]
	if s == nil {
		s = &opSeen{dev: r.Device, codes: map[wire.Code]int{}}
		o.ops[r.OpID] = s
	}
	s.codes[r.Code]++
	switch {
	case r.Final():
		s.final, s.heldNow = true, false
	case r.Code == wire.CodeOutcomeUnknown && !r.Duplicate:
		// An unknown that is not a replay: the write is held now (even
		// after a final, which an honest agent never does, but a broken
		// one must not be left holding its device for it). busy and
		// fence_unconfirmed are not final either, but hold nothing.
		s.heldNow = true
		if s.unknownAt == 0 {
			s.unknownAt = now
		}
	}
}

// held returns the operations of dev whose last Result was unknown.
func (o *observer) held(dev string) map[string]int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]int64{}
	for id, s := range o.ops {
		if s.dev == dev && s.heldNow {
			out[id] = s.unknownAt
		}
	}
	return out
}

// finalSeen reports whether op has a final Result.
func (o *observer) finalSeen(op string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.ops[op]
	return s != nil && s.final
}

// counts returns how many Results arrived and how many operations have a
// final one.
func (o *observer) counts() (results, final int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, s := range o.ops {
		if s.final {
			final++
		}
	}
	return o.results, final
}
