package main

import (
	"fmt"
	"syscall"
	"time"

	"github.com/edge-agent/edge-agent/internal/rig"
)

// inject carries out one scheduled fault, from its start to its end, and
// records both (faults.jsonl). Faults run concurrently: several may be in
// force at once.
func (c *campaign) inject(f fault) {
	w := c.w
	c.count(f.Kind)
	target := f.Device
	agent := c.agentFor(f) // the agent, or one of the pair (-ha)
	if c.o.ha && agentKinds[f.Kind] {
		target = agent.name + " (" + f.Agent + ")"
	}
	if c.o.fleet > 0 && agentKinds[f.Kind] {
		target = agent.name
	}
	end := func(detail string) { w.record(f.Kind, "end", target, detail) }
	start := func(detail string) { w.record(f.Kind, "start", target, detail) }
	switch f.Kind {
	case fCtlStale:
		s := w.ctl(f.Slot)
		target = s.id
		start(f.String())
		_ = s.p.Signal(syscall.SIGUSR1)
		if !rig.WaitFor(8*time.Second, s.p.Stopped) {
			_ = s.p.Signal(syscall.SIGUSR2)
			end("not reached: the controller made no ownership check within 8s")
			return
		}
		// Paused right after an ownership check, before its publish.
		// Resume it once its lease ran out and a newer holder raised the
		// device's fence (or after 15s): it then publishes with its old
		// fence, which only the agent's fence check can stop.
		ev, _ := w.lastPaused(s)
		dev := lockDevice(ev.Lock)
		time.Sleep(c.o.ttl + 500*time.Millisecond)
		raised := rig.WaitFor(15*time.Second, func() bool {
			info, ok := w.device(dev)
			return ok && info.LastFence > ev.Fence
		})
		_ = s.p.Signal(syscall.SIGCONT)
		end(fmt.Sprintf("paused holder of %s at fence %d resumed; newer fence on the device: %v", dev, ev.Fence, raised))
	case fCtlPause:
		s := w.ctl(f.Slot)
		target = s.id
		start(f.String())
		_ = s.p.Signal(syscall.SIGSTOP)
		time.Sleep(f.For)
		_ = s.p.Signal(syscall.SIGCONT)
		end("")
	case fCtlKill:
		s := w.ctl(f.Slot)
		target = s.id
		start(f.String())
		s.p.Kill()
		time.Sleep(f.For)
		if err := w.replaceController(f.Slot); err != nil {
			end("replacement failed: " + err.Error())
			return
		}
		end("replaced by " + w.ctl(f.Slot).id)
	case fAgentKill:
		start(f.String())
		agent.restart(agentCmd{sig: syscall.SIGKILL, down: f.For, kind: f.Kind})
	case fAgentTerm:
		start(f.String())
		agent.restart(agentCmd{sig: syscall.SIGTERM, down: f.For, kind: f.Kind})
	case fAgentCrashPoint:
		target = f.Mode
		if c.o.ha || c.o.fleet > 0 {
			target = agent.name + " " + f.Mode
		}
		start(f.String())
		agent.restart(agentCmd{sig: syscall.SIGKILL, down: f.For, spec: fmt.Sprintf("%s=crash@%d", f.Mode, f.N), kind: f.Kind})
	case fAgentSlowFsync:
		start(f.String())
		// A disk that is slow, then the power goes: SIGKILL while
		// commits are slow, so acknowledgements and Results that raced
		// ahead of their commits (they must not) would be exposed.
		// Three times: slow commits, and once the agent is ready and
		// has been busy with them a while, SIGKILL.
		spec := fmt.Sprintf("commit=sleep(%dms)%%%.2f", f.N, f.Rate)
		for i := 0; i < 3; i++ {
			up := make(chan struct{})
			agent.restart(agentCmd{sig: syscall.SIGKILL, down: 300 * time.Millisecond, spec: spec, kind: f.Kind, up: up})
			select {
			case <-up:
				rig.WaitFor(10*time.Second, agent.up)
			case <-time.After(20 * time.Second):
			}
			time.Sleep(f.For / 3)
		}
		agent.restart(agentCmd{sig: syscall.SIGKILL, down: 300 * time.Millisecond, kind: f.Kind})
		end("")
	case fAgentFailFsync:
		start(f.String())
		agent.restart(agentCmd{sig: syscall.SIGKILL, down: 300 * time.Millisecond, spec: fmt.Sprintf("commit=error@%d", f.N), kind: f.Kind})
	case fBrokerRestart:
		start(f.String())
		w.mosqMu.Lock()
		p := w.mosq
		w.mosqMu.Unlock()
		p.Stop(syscall.SIGTERM, 15*time.Second)
		time.Sleep(f.For)
		if err := w.runMosquitto(); err != nil {
			end("restart failed: " + err.Error())
			return
		}
		end("")
	case fEtcdLeaderKill:
		i := w.etcdLeader()
		if i < 0 {
			start(f.String())
			end("no leader found")
			return
		}
		target = w.etcd[i].name
		start(f.String())
		w.etcdMemberProc(i).Kill()
		time.Sleep(f.For)
		if err := w.runEtcd(w.etcd[i], w.etcdInitial(), "existing"); err != nil {
			end("restart failed: " + err.Error())
			return
		}
		end("")
	case fNetBroker, fNetFirmware, fNetEtcd:
		link := map[string]string{fNetBroker: "broker", fNetFirmware: "firmware", fNetEtcd: "etcd-"}[f.Kind]
		if c.o.fleet > 0 && f.Kind != fNetEtcd {
			// The gateway's own links: to every node, or to the firmware.
			link = map[string]string{fNetBroker: f.Agent + "-broker-", fNetFirmware: f.Agent + "-firmware"}[f.Kind]
		}
		target = link
		start(f.String())
		delays := f.Kind == fNetFirmware && f.Mode != "cut" && f.Mode != "reset_peer"
		if delays {
			c.slow(true, 0)
		}
		var err error
		if f.Mode == "cut" {
			err = w.links.cut(link, true)
		} else {
			err = w.links.toxic(link, f.Mode, f.N)
		}
		time.Sleep(f.For)
		if herr := w.links.heal(link); err == nil {
			err = herr
		}
		if delays {
			c.slow(false, time.Duration(f.N)*time.Millisecond)
		}
		if err != nil {
			end("error: " + err.Error())
			return
		}
		end("")
	case fFwLatency, fFw503, fFwDrop, fFwHang:
		start(f.String())
		body := map[string]string{
			fFwLatency: fmt.Sprintf(`"latency_ms":%d`, f.N),
			fFw503:     fmt.Sprintf(`"error_rate":%.2f`, f.Rate),
			fFwDrop:    fmt.Sprintf(`"drop_response_rate":%.2f`, f.Rate),
			fFwHang:    `"hang":true`,
		}[f.Kind]
		dev := ""
		if f.Device != "" {
			dev = fmt.Sprintf(`"device":%q,`, f.Device)
		}
		if f.Kind == fFwLatency {
			c.slow(true, 0)
		}
		err := w.setFirmwareFaults("{" + dev + body + "}")
		time.Sleep(f.For)
		if clr := w.setFirmwareFaults("{" + trimComma(dev) + "}"); err == nil {
			err = clr
		}
		if f.Kind == fFwLatency {
			c.slow(false, time.Duration(f.N)*time.Millisecond)
		}
		if err != nil {
			end("error: " + err.Error())
			return
		}
		end("")
	case fAgentWipe:
		c.wipe(f)
	case fAgentRestore:
		c.restore(f)
	case fAgentClone:
		c.clone(f)
	case fHAKill, fHAPause, fHAPartition:
		c.injectHA(f)
	case fNATSKill:
		c.natsKill(f)
	case fEtcdMemberKill:
		c.etcdMemberKill(f)
	case fDeviceMove:
		c.moveDevice(f)
	case fFwKill:
		start(f.String())
		w.firmwareProc().Kill()
		time.Sleep(f.For)
		if err := w.startFirmware(); err != nil {
			end("restart failed: " + err.Error())
			return
		}
		end("")
	}
}

func trimComma(s string) string {
	if len(s) > 0 && s[len(s)-1] == ',' {
		return s[:len(s)-1]
	}
	return s
}

// lockDevice is the device a lock name binds (locks/device/ID).
func lockDevice(lock string) string {
	const p = "locks/device/"
	if len(lock) > len(p) {
		return lock[len(p):]
	}
	return lock
}
