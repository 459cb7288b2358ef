package main

import (
	"context"
	"encoding/json"
	"fmt"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edge-agent/edge-agent/internal/chaos"
	"github.com/edge-agent/edge-agent/internal/rig"
)

// The pair (-ha, docs/testing.md "A standby pair"): two agents with one
// gateway_id, one MQTT client ID and ha.enabled, each with its own data
// directory, admin API and toxiproxy links to etcd. The one holding
// {cp}/gateways/{gw} is active; the campaign watches that key (directly on
// the etcd members) to know which one, and records each change of holder
// to the other agent as a takeover.
//
// A takeover switches the memory that answers the gateway's commands from
// one store to the other, as a wipe does (internal/chaos, lifecycle.go):
// it is recorded as a loss of memory (memory_lost, target "takeover",
// with no list: whatever was not final by then may be held by the other
// store, to come back as the controllers' resends meeting the floor). What
// reached the hardware is checked across it as ever: the journal's fence
// order, at most once, the porcupine model with each agent's floors.

// haSafetyMargin is the pair's ha.safety_margin (session_ttl is 3s).
const haSafetyMargin = time.Second

// registrationKey is {cp}/gateways/{gw} (coordination.etcd.prefix: the
// default, edge).
const registrationKey = "edge/gateways/" + gatewayID

// The pair's faults, on the active or the standby (fault.Agent).
const (
	fHAKill      = "ha_kill"      // SIGKILL of one of the pair, restarted after a while
	fHAPause     = "ha_pause"     // SIGSTOP of one of the pair for a while (shorter or longer than session_ttl), then SIGCONT
	fHAPartition = "ha_partition" // toxiproxy cuts or black-holes the links between one of the pair and every etcd member
)

// haKinds replace the clone in a round with -ha (a clone with ha waits as
// one more standby) and add the pair's faults: pauses and partitions
// twice, as they are what fencing exists for.
var haKinds = []string{fHAKill, fHAKill, fHAPause, fHAPause, fHAPause, fHAPartition, fHAPartition}

// watchRegistration follows {cp}/gateways/{gw} until stopRegWatch.
func (c *campaign) watchRegistration() error {
	var eps []string
	for _, m := range c.w.etcd {
		eps = append(eps, m.client)
	}
	cli, err := etcdClient(eps)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	c.stopRegWatch = func() {
		cancel()
		<-done
		cli.Close()
	}
	go func() {
		defer close(done)
		var last *agentSup // the agent whose memory served last
		rev := int64(0)
		for ctx.Err() == nil {
			opts := []clientv3.OpOption{}
			if rev > 0 {
				opts = append(opts, clientv3.WithRev(rev+1))
			}
			for resp := range cli.Watch(clientv3.WithRequireLeader(ctx), registrationKey, opts...) {
				if resp.Err() != nil {
					break
				}
				for _, ev := range resp.Events {
					rev = ev.Kv.ModRevision
					if ev.Type == clientv3.EventTypeDelete {
						c.w.regMu.Lock()
						c.w.registered = nil
						c.w.regMu.Unlock()
						c.w.record("ha_registration", "gone", "", "the active's session ended")
						continue
					}
					var reg struct {
						PID int `json:"pid"`
					}
					_ = json.Unmarshal(ev.Kv.Value, &reg)
					var a *agentSup
					for _, x := range c.w.agents {
						if x.hadPID(reg.PID) {
							a = x
						}
					}
					if a == nil {
						// Registered before its supervisor recorded the
						// pid: wait for it a moment.
						rig.WaitFor(2*time.Second, func() bool {
							for _, x := range c.w.agents {
								if x.hadPID(reg.PID) {
									a = x
									return true
								}
							}
							return false
						})
					}
					name := "?"
					if a != nil {
						name = a.name
					}
					c.w.regMu.Lock()
					c.w.registered = a
					c.w.regMu.Unlock()
					c.w.record("ha_registration", "observed", fmt.Sprintf("%s:%d", name, reg.PID), "active")
					if last != nil && a != nil && a != last {
						c.takeovers.Add(1)
						c.lostAt.Store(time.Now().UnixNano())
						c.w.record(chaos.KindMemoryLost, "start", "takeover", fmt.Sprintf("agent %s (pid %d) took over from agent %s", a.name, reg.PID, last.name))
					}
					if a != nil {
						last = a
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return nil
}

// agentFor is the agent a fault of the agent hits: the agent itself, or
// with -ha the active one (holding the registration now; the first when
// none does) or the other.
func (c *campaign) agentFor(f fault) *agentSup {
	w := c.w
	if c.o.fleet > 0 {
		return w.agentNamed(f.Agent)
	}
	if !c.o.ha {
		return w.agent
	}
	act := w.serving()
	if act == nil {
		act = w.agents[0]
	}
	if f.Agent == "standby" {
		for _, a := range w.agents {
			if a != act {
				return a
			}
		}
	}
	return act
}

// injectHA carries out one of the pair's faults.
func (c *campaign) injectHA(f fault) {
	w := c.w
	a := c.agentFor(f)
	target := a.name + " (" + f.Agent + ")"
	w.record(f.Kind, "start", target, f.String())
	end := func(detail string) { w.record(f.Kind, "end", target, detail) }
	switch f.Kind {
	case fHAKill:
		a.restart(agentCmd{sig: syscall.SIGKILL, down: f.For, kind: f.Kind})
	case fHAPause:
		// In the supervisor, so no restart of this agent overlaps it.
		done := make(chan string, 1)
		a.restart(agentCmd{kind: f.Kind, during: func(p *rig.Proc) {
			if !p.Running() {
				done <- "not paused: the agent had ended"
				return
			}
			_ = p.Signal(syscall.SIGSTOP)
			time.Sleep(f.For)
			_ = p.Signal(syscall.SIGCONT)
			done <- fmt.Sprintf("pid %d paused %v", p.PID(), f.For.Round(time.Millisecond))
		}})
		select {
		case d := <-done:
			end(d)
		case <-time.After(2 * time.Minute):
			end("not paused: the agent's supervisor was busy for 2 minutes")
		}
	case fHAPartition:
		link := "agent-" + a.name + "-etcd-"
		var err error
		if f.Mode == "cut" {
			err = w.links.cut(link, true)
		} else {
			err = w.links.toxic(link, f.Mode, 0)
		}
		time.Sleep(f.For)
		if herr := w.links.heal(link); err == nil {
			err = herr
		}
		if err != nil {
			end("error: " + err.Error())
			return
		}
		end("")
	}
}
