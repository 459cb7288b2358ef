package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/edge-agent/edge-agent/internal/chaos"
)

// The fault kinds, in the report's order.
const (
	fCtlStale        = "ctl_stale"          // a holder stops itself between its ownership check and a publish, past its lease; resumed once a newer holder raised the fence
	fCtlPause        = "ctl_pause"          // SIGSTOP of a controller past its lease TTL, then SIGCONT
	fCtlKill         = "ctl_kill"           // SIGKILL of a controller (holding a lock), replaced by a new one
	fAgentKill       = "agent_kill"         // SIGKILL of the agent, restarted
	fAgentTerm       = "agent_term"         // SIGTERM of the agent (graceful stop), restarted
	fAgentCrashPoint = "agent_crashpoint"   // the agent restarted with a crash point armed (failpoints build)
	fAgentSlowFsync  = "agent_slow_fsync"   // the agent restarted with slow commits, then SIGKILLed during them
	fAgentFailFsync  = "agent_fail_fsync"   // the agent restarted with a commit that fails: it must stop (invariant 5)
	fBrokerRestart   = "broker_restart"     // mosquitto stopped (SIGTERM, it saves its state) and started again
	fEtcdLeaderKill  = "etcd_leader_kill"   // SIGKILL of the etcd leader, restarted
	fNetBroker       = "net_agent_broker"   // toxiproxy between the agent and mosquitto
	fNetFirmware     = "net_agent_firmware" // toxiproxy between the agent and the firmware
	fNetEtcd         = "net_ctl_etcd"       // toxiproxy between the controllers and etcd
	fFwLatency       = "fw_latency"         // firmware latency beyond the agent's timeout
	fFw503           = "fw_503"             // firmware answers 503 without applying
	fFwDrop          = "fw_drop"            // firmware applies, then drops the connection unanswered
	fFwHang          = "fw_hang"            // firmware holds applies unapplied
	fFwKill          = "fw_kill"            // SIGKILL of the firmware, restarted (journal kept)
	fAgentWipe       = "agent_wipe"         // SIGKILL of the agent, its data directory removed, restarted on an empty one
	fAgentRestore    = "agent_restore"      // SIGKILL of the agent, an older online backup put in place of its store, restarted
	fAgentClone      = chaos.KindClone      // a second agent with the same gateway_id and another data directory: refused
)

// faultKinds is one round of the schedule: every kind once (stale holders
// and crash points twice), shuffled. Rounds repeat until the duration is
// used up, so every kind is injected in every round of about a minute.
var faultKinds = []string{fCtlStale, fCtlStale, fCtlPause, fCtlKill, fAgentKill, fAgentTerm, fAgentCrashPoint, fAgentCrashPoint,
	fAgentSlowFsync, fAgentFailFsync, fBrokerRestart, fEtcdLeaderKill, fNetBroker, fNetFirmware, fNetEtcd,
	fFwLatency, fFw503, fFwDrop, fFwHang, fFwKill, fAgentWipe, fAgentRestore, fAgentClone}

// crashPoints are the agent's failpoints the schedule crashes at, cycled
// in this order (the write path first: that is where at-most-once is at
// stake).
var crashPoints = []string{"during_write", "after_write", "after_pending", "after_outcome", "before_ack", "after_inbox",
	"before_publish", "after_publish", "recovery", "commit"}

// fault is one scheduled fault: what, when (after the start), on what,
// for how long, with what setting.
type fault struct {
	At     time.Duration
	Kind   string
	Slot   int           // controller slot, device index, etcd member...
	For    time.Duration // how long it lasts (or the pause before a restart)
	Mode   string        // latency, cut, ... for network faults; the crash point
	N      int           // latency ms, the Nth hit, ...
	Rate   float64
	Device string // "" : every device
	Agent  string // -ha: which of the pair a fault of the agent hits, "active" or "standby"
}

func (f fault) String() string {
	s := f.Kind
	if f.Mode != "" {
		s += " " + f.Mode
	}
	if f.Device != "" {
		s += " " + f.Device
	}
	if f.N != 0 {
		s += fmt.Sprintf(" n=%d", f.N)
	}
	if f.Rate != 0 {
		s += fmt.Sprintf(" rate=%.2f", f.Rate)
	}
	if f.For != 0 {
		s += fmt.Sprintf(" for=%v", f.For.Round(time.Millisecond))
	}
	switch {
	case strings.HasPrefix(f.Agent, "gw"):
		s += " on " + f.Agent
	case f.Agent != "":
		s += " on the " + f.Agent
	}
	return s
}

// agentKinds are the faults of the agent: with -ha each hits the active or
// the standby.
var agentKinds = map[string]bool{fAgentKill: true, fAgentTerm: true, fAgentCrashPoint: true, fAgentSlowFsync: true, fAgentFailFsync: true,
	fAgentWipe: true, fAgentRestore: true, fHAKill: true, fHAPause: true, fHAPartition: true}

// roundKinds is one round's kinds: with ha, the pair's kinds instead of the
// clone; in a fleet, broker node kills, etcd member kills and device
// moves instead of the mosquitto restart.
func roundKinds(ha bool, fleet int) []string {
	if fleet > 0 {
		var out []string
		for _, k := range faultKinds {
			if k != fBrokerRestart {
				out = append(out, k)
			}
		}
		return append(out, fleetKinds...)
	}
	if !ha {
		return faultKinds
	}
	var out []string
	for _, k := range faultKinds {
		if k != fAgentClone {
			out = append(out, k)
		}
	}
	return append(out, haKinds...)
}

// schedule is the campaign's faults for a seed: the same seed gives the
// same list (kinds, times, targets, settings). What the faults hit (which
// command is in flight when the agent dies) depends on process
// scheduling and is not reproducible. Without ha the list is the single
// agent's as before ha was added (the same draws).
//
// With fleet (N gateways) each fault of an agent, and each network fault
// between an agent and the broker or the firmware, hits one gateway
// (fault.Agent, drawn after the fault's own settings).
func schedule(seed uint64, dur time.Duration, ctls int, devices []chaos.DeviceSpec, ttl time.Duration, embedded, ha bool, fleet int) []fault {
	rng := rand.New(rand.NewPCG(seed, seed^0xc4a05))
	ms := func(lo, hi int) time.Duration { return time.Duration(lo+rng.IntN(hi-lo+1)) * time.Millisecond }
	var out []fault
	t := ms(1500, 2500)
	point, clones := 0, 0
	for t < dur {
		round := append([]string(nil), roundKinds(ha, fleet)...)
		rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		for _, k := range round {
			if t >= dur {
				break
			}
			f := fault{At: t, Kind: k}
			dev := func() string {
				if rng.IntN(3) == 0 {
					return ""
				}
				return devices[rng.IntN(len(devices))].ID
			}
			switch k {
			case fCtlStale:
				f.Slot = rng.IntN(ctls)
			case fCtlPause:
				f.Slot, f.For = rng.IntN(ctls), ttl+ms(1000, 3000)
			case fCtlKill:
				f.Slot, f.For = rng.IntN(ctls), ms(200, 1500)
			case fAgentKill:
				f.For = ms(200, 2000)
			case fAgentTerm:
				f.For = ms(200, 1000)
			case fAgentCrashPoint:
				f.Mode, f.N, f.For = crashPoints[point%len(crashPoints)], 1+rng.IntN(8), ms(200, 1000)
				if f.Mode == "recovery" {
					f.N = 1
				}
				point++
			case fAgentSlowFsync:
				f.N, f.Rate, f.For = 10+rng.IntN(50), 0.5+0.5*rng.Float64(), ms(3000, 8000)
			case fAgentFailFsync:
				f.N = 5 + rng.IntN(40)
			case fBrokerRestart:
				f.For = ms(300, 2000)
				if embedded {
					f.Kind = fAgentTerm // the embedded broker is the agent's
				}
			case fEtcdLeaderKill:
				f.For = ms(1000, 4000)
			case fNetBroker:
				f.Mode = []string{"latency", "cut", "slow_close", "timeout"}[rng.IntN(4)]
				f.N, f.For = 100+rng.IntN(700), ms(1000, 5000)
				if embedded {
					f.Kind = fNetFirmware // the agent reaches the embedded broker in-process
				}
			case fNetEtcd:
				f.Mode = []string{"latency", "cut", "slow_close"}[rng.IntN(3)]
				f.N, f.For = 200+rng.IntN(1300), ms(1000, 5000)
			case fFwLatency:
				f.Device, f.N, f.For = dev(), 600+rng.IntN(1900), ms(2000, 6000)
			case fFw503, fFwDrop:
				f.Device, f.Rate, f.For = dev(), 0.2+0.6*rng.Float64(), ms(2000, 5000)
			case fFwHang:
				f.Device, f.For = dev(), ms(1000, 4000)
			case fFwKill:
				f.For = ms(200, 1500)
			case fAgentWipe:
				f.For = ms(200, 1000)
			case fAgentRestore:
				f.N, f.For = rng.IntN(64), ms(200, 1000)
			case fAgentClone:
				f.N = clones
				clones++
			case fHAKill:
				f.For = ms(200, 2000)
			case fHAPause:
				// Shorter than session_ttl (the active wakes with its
				// proof run out) and longer (the standby took over).
				f.For = ms(1000, 8000)
			case fHAPartition:
				f.Mode = []string{"cut", "timeout"}[rng.IntN(2)]
				f.For = ms(2000, 8000)
			case fNATSKill:
				f.Slot, f.For = rng.IntN(3), ms(1000, 5000)
			case fEtcdMemberKill:
				f.Slot, f.For = rng.IntN(3), ms(1000, 4000)
			case fDeviceMove:
				f.Device, f.N = movers[rng.IntN(len(movers))].spec.ID, rng.IntN(64)
			}
			if ha && agentKinds[k] {
				// Mostly the active: that is where a takeover comes from.
				f.Agent = "active"
				if rng.IntN(3) == 0 {
					f.Agent = "standby"
				}
			}
			if f.Kind == fNetFirmware && f.Mode == "" || k == fNetBroker && embedded {
				f.Mode = []string{"latency", "cut", "reset_peer", "slow_close", "timeout"}[rng.IntN(5)]
				f.N, f.For = 300+rng.IntN(1700), ms(1000, 5000)
			}
			if fleet > 0 && (agentKinds[k] || k == fAgentClone || k == fNetBroker || k == fNetFirmware) {
				f.Agent = gatewayName(rng.IntN(fleet))
			}
			out = append(out, f)
			t += ms(1200, 3200)
		}
	}
	return out
}
