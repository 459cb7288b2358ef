package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/edge-agent/edge-agent/internal/chaos"
	"github.com/edge-agent/edge-agent/internal/rig"
	"github.com/edge-agent/edge-agent/internal/store"
)

// The lifecycle faults (docs/testing.md, "Chaos campaign"): the agent's
// memory lost (its data directory wiped, or an older online backup put
// back in its place) and a clone (a second agent with the same gateway_id)
// started beside it. The agent runs with coordination.etcd pointing at the
// campaign's etcd, so each loss is recognised and the fence floor taken
// (invariant 7); the floors the agent takes are recorded as it reports
// them, for the checker's model.

// sessionTTL is the agent's coordination.etcd.session_ttl: a restart after
// a SIGKILL waits up to this (and a second) for its old registration to go.
const sessionTTL = 3 * time.Second

// backup is one online backup of an agent's store, taken during the run.
type backup struct {
	path  string
	at    time.Time
	agent *agentSup
}

// takeBackup takes an online backup of a's store through its admin API
// (edge-agent backup --admin, GET /v1/backup) into dir/backups.
func (w *world) takeBackup(a *agentSup) (backup, error) {
	w.bakMu.Lock()
	n := len(w.backups)
	w.bakMu.Unlock()
	name := fmt.Sprintf("agent-%03d.db", n)
	if a.name != "" {
		name = fmt.Sprintf("agent-%s-%03d.db", a.name, n)
	}
	b := backup{path: filepath.Join(w.dir, "backups", name), at: time.Now(), agent: a}
	if err := os.MkdirAll(filepath.Dir(b.path), 0o755); err != nil {
		return b, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, w.o.agentBin, "backup", "--admin", a.admin, "--out", b.path).CombinedOutput()
	if err != nil {
		return b, fmt.Errorf("edge-agent backup --admin: %v: %s", err, strings.TrimSpace(string(out)))
	}
	w.bakMu.Lock()
	w.backups = append(w.backups, b)
	w.bakMu.Unlock()
	w.record("agent_backup", "start", filepath.Base(b.path), "edge-agent backup --admin (GET /v1/backup)")
	return b, nil
}

// backupLoop takes a backup every 10 s of the agent that is ready (-ha:
// the active one), until stop is closed.
func (c *campaign) backupLoop(stop <-chan struct{}) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		for _, a := range c.w.agents {
			if a.ready() {
				if _, err := c.w.takeBackup(a); err != nil {
					c.w.record("agent_backup", "error", a.name, err.Error())
				}
			}
		}
	}
}

// olderBackup picks one of a's backups taken at least 5 s ago (n chooses
// which), false when there is none.
func (w *world) olderBackup(a *agentSup, n int) (backup, bool) {
	w.bakMu.Lock()
	defer w.bakMu.Unlock()
	var old []backup
	for _, b := range w.backups {
		// In a fleet, none from before the gateway's last move: its
		// store could hold a write of a device it no longer fronts,
		// which refuses the start (docs/operations.md).
		if b.agent == a && time.Since(b.at) >= 5*time.Second && (a.gw == nil || b.at.After(a.gw.changedAt())) {
			old = append(old, b)
		}
	}
	if len(old) == 0 {
		return backup{}, false
	}
	return old[n%len(old)], true
}

// memoryLost records the moment the agent's store lost what it knew (the
// old process stopped, the new one not yet started: the checker's epochs),
// and what it loses: the operations the stopped agent had accepted and
// not yet answered (its inbox and its outbox, read from its store). With
// the embedded broker, whose queues live in the data directory too, no
// list: every operation not final by then may be lost.
func (c *campaign) memoryLost(a *agentSup, how string) {
	c.lostAt.Store(time.Now().UnixNano())
	detail := ""
	if !c.o.embedded {
		ops, err := unanswered(filepath.Join(a.data, "agent.db"))
		if err != nil {
			detail = "unreadable: " + err.Error()
		} else {
			detail = chaos.LostDetail(ops)
		}
	}
	if a.gw != nil {
		// A fleet's gateway forgets its own devices only.
		detail = chaos.LostDevicesDetail(a.gw.devices(), detail)
	}
	c.w.record(chaos.KindMemoryLost, "start", how, detail)
}

// unanswered lists the op_ids in a stopped agent's inbox and outbox.
func unanswered(path string) ([]string, error) {
	st, err := store.Open(path, &store.Options{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	var ops []string
	err = st.View(func(tx *store.Tx) error {
		if err := tx.Inbox(func(e store.InboxEntry) error {
			ops = append(ops, e.OpID)
			return nil
		}); err != nil {
			return err
		}
		return tx.Outbox(func(e store.Outbox) error {
			ops = append(ops, e.OpID)
			return nil
		})
	})
	return ops, err
}

// wipe stops the agent with SIGKILL, removes its data directory and
// starts it again on an empty one (a new disk).
func (c *campaign) wipe(f fault) {
	w := c.w
	a := c.agentFor(f)
	w.record(f.Kind, "start", a.name, f.String())
	up := make(chan struct{})
	a.restart(agentCmd{sig: syscall.SIGKILL, down: f.For, kind: f.Kind, up: up, prepare: func() {
		c.memoryLost(a, "wipe")
		if err := os.RemoveAll(a.data); err != nil {
			w.record(f.Kind, "error", a.name, err.Error())
		}
	}})
	c.waitUp(f, a, up)
}

// restore stops the agent with SIGKILL and puts an older online backup in
// place of its store.
func (c *campaign) restore(f fault) {
	w := c.w
	a := c.agentFor(f)
	b, ok := w.olderBackup(a, f.N)
	if !ok {
		w.record(f.Kind, "start", a.name, f.String())
		w.record(f.Kind, "end", a.name, "not done: no backup 5s old yet")
		return
	}
	w.record(f.Kind, "start", filepath.Base(b.path), fmt.Sprintf("%s, backup taken %.1fs ago", f, time.Since(b.at).Seconds()))
	up := make(chan struct{})
	a.restart(agentCmd{sig: syscall.SIGKILL, down: f.For, kind: f.Kind, up: up, prepare: func() {
		c.memoryLost(a, "restore")
		err := os.RemoveAll(a.data)
		if err == nil {
			err = os.MkdirAll(a.data, 0o750)
		}
		if err == nil {
			err = copyFile(b.path, filepath.Join(a.data, "agent.db"))
		}
		if err != nil {
			w.record(f.Kind, "error", a.name, err.Error())
		}
	}})
	c.waitUp(f, a, up)
}

// waitUp waits for the restarted agent to be ready (-ha: up, as the
// active or the standby) and records the end.
func (c *campaign) waitUp(f fault, a *agentSup, up chan struct{}) {
	select {
	case <-up:
	case <-time.After(30 * time.Second):
		c.w.record(f.Kind, "end", a.name, "the agent did not start within 30s")
		return
	}
	t0 := time.Now()
	ready := rig.WaitFor(30*time.Second, a.up)
	c.w.record(f.Kind, "end", a.name, fmt.Sprintf("ready %v after %.1fs", ready, time.Since(t0).Seconds()))
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// clone starts a second agent with the agent's gateway_id, another data
// directory (a copy of a backup: a copied gateway image) and another admin
// address, once the agent is ready and runs with no failpoint armed (it is
// restarted plain first if it has one), and while nothing restarts it. It must exit 1 within
// session_ttl + 5 s (PROTOCOL §7, one agent per gateway) while the agent
// keeps serving: the end record says "refused" or "NOT refused", which
// the checker reads.
func (c *campaign) clone(f fault) {
	w := c.w
	a := c.agentFor(f) // the agent; in a fleet, the gateway's
	w.record(f.Kind, "start", a.name, f.String())
	if !a.plain() {
		// A failpoint armed by an earlier fault could end the agent
		// while the clone waits for its registration: a plain restart
		// first (SIGTERM: its session ends at once).
		up := make(chan struct{})
		a.restart(agentCmd{sig: syscall.SIGTERM, down: 200 * time.Millisecond, kind: f.Kind, up: up})
		select {
		case <-up:
		case <-time.After(30 * time.Second):
		}
	}
	done := make(chan string, 1)
	a.restart(agentCmd{kind: f.Kind, during: func(p *rig.Proc) {
		// A failpoint armed earlier may still end the agent: then no
		// clone (its supervisor restarts it first).
		ok := func() bool { return a.plain() && a.ready() }
		if !rig.WaitFor(20*time.Second, func() bool { return !p.Running() || ok() }) || !ok() {
			done <- "not started: the agent was not ready with no failpoint armed within 20s"
			return
		}
		done <- c.runClone(f, a, p)
	}})
	select {
	case d := <-done:
		w.record(f.Kind, "end", a.name, d)
	case <-time.After(2 * time.Minute):
		w.record(f.Kind, "end", a.name, "not started: the agent's supervisor was busy for 2 minutes")
	}
}

func (c *campaign) runClone(f fault, a *agentSup, real *rig.Proc) string {
	w := c.w
	dir := filepath.Join(w.dir, fmt.Sprintf("clone-%d", f.N))
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o750); err != nil {
		return "not started: " + err.Error()
	}
	if b, ok := w.olderBackup(a, 0); ok {
		if err := copyFile(b.path, filepath.Join(data, "agent.db")); err != nil {
			return "not started: " + err.Error()
		}
	}
	admin, err := rig.FreeAddr()
	if err != nil {
		return "not started: " + err.Error()
	}
	cfg := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfg, []byte(w.agentConfigGW(a.gw, admin, data, nil)), 0o644); err != nil {
		return "not started: " + err.Error()
	}
	var log bytes.Buffer // read once the clone ended
	t0 := time.Now()
	p, err := rig.Start(rig.Options{Out: io.MultiWriter(w.out, &log)}, w.o.agentBin, "run", "--config", cfg, "--log-level", "warn")
	if err != nil {
		return "not started: " + err.Error()
	}
	code, ended := p.Wait(sessionTTL + 15*time.Second)
	took := time.Since(t0)
	if !ended {
		p.Kill()
	}
	msg := strings.TrimSpace(log.String())
	if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
		msg = msg[i+1:]
	}
	realOK := real.Running() && rig.WaitFor(5*time.Second, a.ready)
	switch {
	case !ended:
		return fmt.Sprintf("NOT refused: the clone still ran after %.1fs (killed); the agent serving: %v", took.Seconds(), realOK)
	case code != 1 || !strings.Contains(msg, "is registered"):
		return fmt.Sprintf("NOT refused: the clone ended %s after %.1fs without naming the registration: %s", p.Ended(), took.Seconds(), msg)
	case !realOK:
		return fmt.Sprintf("NOT refused: the clone exited 1 after %.1fs, but the agent (pid %d) no longer serves", took.Seconds(), real.PID())
	}
	return fmt.Sprintf("refused: exit 1 after %.1fs; the agent (pid %d) still serving; %s", took.Seconds(), real.PID(), msg)
}

// floorWatch records every fence floor the agents take. It polls each
// agent's view of each device (GET /v1/devices/{dev} fence_floor); when
// the floor there changed, it reads the device's history for every floor
// audit entry taken since the last one it recorded (an agent may take a
// floor and be killed before the next poll: with -ha the next process on
// that store, or the other agent, then reports a later floor, and the
// earlier one is only in the history), each with the time it was taken.
// Without the history it records the view's floor with the last time the
// old value was seen: the floor was taken between the two. With -ha,
// each agent's, as it serves (a standby does not answer): its floors
// raise the device's last_fence in the checker's model as the single
// agent's do.
//
// Each agent is polled on its own goroutine: a paused agent (ha_pause)
// makes every request to it wait for its timeout, which must not keep the
// other agent's floors from being seen.
func (c *campaign) floorWatch(stop <-chan struct{}) {
	var wg sync.WaitGroup
	for _, a := range c.w.agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.floorWatchOf(a, stop)
		}()
	}
	wg.Wait()
}

// floorWatchOf is floorWatch for one agent.
func (c *campaign) floorWatchOf(a *agentSup, stop <-chan struct{}) {
	w := c.w
	last := map[string]int64{}
	seen := map[string]int64{}
	recorded := map[string]bool{} // dev/op_id of each floor recorded
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		for _, d := range c.o.devices {
			if a.gw != nil && !a.gw.has(d.ID) {
				continue // a fleet's gateway: its devices now
			}
			info, ok := a.device(d.ID)
			floor := info.FenceFloor
			now := time.Now().UnixNano()
			if !ok {
				continue
			}
			k := d.ID
			if floor != last[k] {
				if fl, ok := a.floorsInHistory(d.ID); ok {
					for _, f := range fl {
						if rk := k + "/" + f.op; !recorded[rk] {
							recorded[rk] = true
							w.record(chaos.KindFenceFloor, "observed", d.ID, chaos.FloorDetail(f.floor, f.at))
						}
					}
				} else {
					w.record(chaos.KindFenceFloor, "observed", d.ID, chaos.FloorDetail(floor, seen[k]))
				}
				last[k] = floor
			}
			seen[k] = now
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// floorEntry is a fence floor audit entry of a device's history.
type floorEntry struct {
	op    string
	floor int64
	at    int64 // when it was taken (unix nanoseconds)
}

// floorsInHistory returns the fence floors in the agent's history of dev
// (its newest 5 pages of GET /v1/devices/{dev}/ops), oldest first; false
// when the history cannot be read.
func (a *agentSup) floorsInHistory(dev string) ([]floorEntry, bool) {
	c := http.Client{Timeout: 2 * time.Second}
	var out []floorEntry
	cursor := ""
	for range 5 {
		u := a.admin + "/v1/devices/" + dev + "/ops?limit=1000"
		if cursor != "" {
			u += "&before=" + cursor
		}
		resp, err := c.Get(u)
		if err != nil {
			return nil, false
		}
		var page struct {
			Ops []struct {
				OpID       string    `json:"op_id"`
				Fence      int64     `json:"fence"`
				Action     string    `json:"action"`
				ReceivedAt time.Time `json:"received_at"`
			} `json:"ops"`
			Next string `json:"next"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || err != nil {
			return nil, false
		}
		for _, o := range page.Ops {
			if o.Action == store.ActionFenceFloor {
				out = append(out, floorEntry{op: o.OpID, floor: o.Fence, at: o.ReceivedAt.UnixNano()})
			}
		}
		if page.Next == "" {
			break
		}
		cursor = page.Next
	}
	slices.Reverse(out)
	return out, true
}

// heldUnknown is the agent's list of held writes (GET
// /v1/ops?status=unknown) as "dev/op" (empty when it cannot be asked).
func (w *world) heldUnknown() map[string]bool {
	out := map[string]bool{}
	resp, err := w.adminDo(http.MethodGet, "/v1/ops?status=unknown", "", time.Second)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	var page struct {
		Ops []struct {
			Device string `json:"device"`
			OpID   string `json:"op_id"`
		} `json:"ops"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&page) != nil {
		return out
	}
	for _, o := range page.Ops {
		out[o.Device+"/"+o.OpID] = true
	}
	return out
}
