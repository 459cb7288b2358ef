package agent

import (
	"sync"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/auth"
)

// Verification lanes (docs/operations.md, "A flood of forged commands").
// Reading a delivery as a command (a.open: a JWS signature check over up
// to 64 KiB, or JSON parsing) is the costly part of its arrival. Done in
// one queue in arrival order, a backlog of forged commands for one device
// (queued by the broker while the agent was offline) delayed every other
// device's commands by as long as it took to verify it all. So each worker
// (a device, or a device group) has a lane of its own that reads its
// deliveries in their arrival order, and the lanes run in parallel on
// the cores there are; deliveries for no configured device share one
// lane. The intake admits what a lane has read in that lane's order: a
// worker's commands keep their arrival order (invariant 1's "in arrival
// order"), and PUBACKs still go out in arrival order (internal/mqtt holds
// a later one back until every earlier one is sent). Deliveries a lane
// holds are not acknowledged, so the broker's in-flight window bounds
// them.

// opened is a delivery as read by its lane.
type opened struct {
	d      Delivery
	cmd    wire.Command
	unauth *auth.Error
	pe     *wire.ParseError
}

// lane is one worker's queue of deliveries to read.
type lane struct {
	mu   sync.Mutex
	q    []Delivery
	wake chan struct{} // capacity 1: q is not empty
}

// toLane queues d on its worker's lane, starting the lane on first use.
// Only the intake loop calls it.
func (a *Agent) toLane(lanes map[string]*lane, d Delivery) {
	id := ""
	if dev, ok := wire.DeviceFromCmdTopic(a.cfg.TopicPrefix, a.cfg.GatewayID, d.Topic); ok {
		if rt := a.devs[dev]; rt != nil {
			id = rt.w.id
		}
	}
	l := lanes[id]
	if l == nil {
		l = &lane{wake: make(chan struct{}, 1)}
		lanes[id] = l
		a.wg.Add(1)
		go a.readLane(l)
	}
	l.mu.Lock()
	l.q = append(l.q, d)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// readLane reads l's deliveries in order and hands them to the intake
// loop, until the agent stops (what is left stays unacknowledged: the
// broker redelivers it).
func (a *Agent) readLane(l *lane) {
	defer a.wg.Done()
	for {
		l.mu.Lock()
		if len(l.q) == 0 {
			l.mu.Unlock()
			select {
			case <-a.stopping:
				return
			case <-l.wake:
			}
			continue
		}
		d := l.q[0]
		l.q[0] = Delivery{}
		l.q = l.q[1:]
		l.mu.Unlock()
		o := opened{d: d}
		if dev, isCmd := wire.DeviceFromCmdTopic(a.cfg.TopicPrefix, a.cfg.GatewayID, d.Topic); isCmd && !d.Retained && len(d.Payload) > 0 {
			o.cmd, o.unauth, o.pe = a.open(dev, d.Payload)
		}
		select {
		case <-a.stopping:
			return
		case a.opened <- o:
		}
	}
}
