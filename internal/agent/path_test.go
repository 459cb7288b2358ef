package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/device"
	"github.com/edge-agent/edge-agent/internal/fencemem"
	"github.com/edge-agent/edge-agent/internal/store"
)

// The command path in its own package: a real bbolt store in t.TempDir(),
// a fake driver (a device whose faults come on demand) and a fake
// publisher (the MQTT session; it acknowledges every publish at once).

const testGW = "gw-t"

// fakeDriver is a device that applies what it is sent, unless told to
// hang (the write then ends with its context, unknown, having taken
// effect: the worst case) or to refuse queries.
type fakeDriver struct {
	queryable bool
	bound     time.Duration // one Apply's and one Query's bound (device.Bounded)

	mu       sync.Mutex
	log      []string          // "apply <op>", "query <op> ok|err", in order
	applied  map[string]string // key -> op_id of every write that took effect
	hang     map[string]bool   // op_id -> Apply waits for its context
	lose     map[string]bool   // op_id -> its next Apply is lost on the way (no effect) and waits for its context
	queryErr error             // non-nil: Query fails with it
	entered  chan string       // op_id of each Apply, as it starts
}

func newFakeDriver(queryable bool) *fakeDriver {
	return &fakeDriver{queryable: queryable, bound: 200 * time.Millisecond, applied: map[string]string{},
		hang: map[string]bool{}, lose: map[string]bool{}, entered: make(chan string, 64)}
}

func (d *fakeDriver) Apply(ctx context.Context, w device.Write) device.WriteResult {
	d.mu.Lock()
	d.log = append(d.log, "apply "+w.OpID)
	lost := d.lose[w.OpID]
	delete(d.lose, w.OpID)
	if !lost {
		d.applied[w.Key] = w.OpID
	}
	hang := d.hang[w.OpID] || lost
	d.mu.Unlock()
	d.entered <- w.OpID
	if hang {
		<-ctx.Done()
		return device.WriteResult{Outcome: device.Unknown, Reason: "timeout", Tries: 1}
	}
	return device.WriteResult{Outcome: device.Applied, State: w.Params, Tries: 1}
}

func (d *fakeDriver) Query(ctx context.Context, _, key string) (device.QueryResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	op, ok := d.applied[key]
	err := d.queryErr
	if err == nil {
		err = ctx.Err() // a stopped agent asks nothing
	}
	if err != nil {
		d.log = append(d.log, "query "+op+" err")
		return device.QueryResult{}, err
	}
	d.log = append(d.log, "query "+op+" ok")
	return device.QueryResult{Applied: ok}, nil
}

func (d *fakeDriver) Queryable(string) bool { return d.queryable }

func (d *fakeDriver) Bounds(string) (time.Duration, time.Duration) { return d.bound, d.bound }

func (d *fakeDriver) events() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.log)
}

// applies counts the Apply calls for op.
func (d *fakeDriver) applies(op string) int {
	return count1(d.events(), "apply "+op)
}

func count1(log []string, s string) int {
	n := 0
	for _, l := range log {
		if l == s {
			n++
		}
	}
	return n
}

func (d *fakeDriver) setQueryErr(err error) {
	d.mu.Lock()
	d.queryErr = err
	d.mu.Unlock()
}

// recPublisher records every publish and acknowledges it at once. With
// st set, it checks that each Result of a recorded operation is published
// only once its outcome is durable (invariant 4: recorded before
// published), and keeps what it found otherwise in early.
type recPublisher struct {
	mu    sync.Mutex
	msgs  []pubMsg
	st    *store.Store
	early []string
}

func (p *recPublisher) checkRecorded(payload []byte) {
	var r wire.Result
	if p.st == nil || json.Unmarshal(payload, &r) != nil || r.OpID == "" || !wire.Recorded(r.Code) {
		return
	}
	var o store.Op
	var ok bool
	p.st.View(func(tx *store.Tx) error {
		o, ok, _ = tx.Op(r.Device, r.OpID)
		return nil
	})
	if !ok || (o.Status != store.OpUnknown && o.Status != store.OpFinal) {
		p.early = append(p.early, fmt.Sprintf("%s/%s %s published with the record %q", r.Device, r.OpID, r.Code, o.Status))
	}
}

type pubMsg struct {
	topic    string
	payload  []byte
	retained bool
}

func (p *recPublisher) PublishAsync(_ context.Context, topic string, payload []byte, retained bool) (Pending, error) {
	p.mu.Lock()
	p.msgs = append(p.msgs, pubMsg{topic, slices.Clone(payload), retained})
	if strings.HasSuffix(topic, "/result") {
		p.checkRecorded(payload)
	}
	p.mu.Unlock()
	ch := make(chan struct{})
	close(ch)
	return donePending{ch: ch}, nil
}

// results returns the Results published for op, in publish order.
func (p *recPublisher) results(t *testing.T, op string) []wire.Result {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []wire.Result
	for _, m := range p.msgs {
		if !strings.HasSuffix(m.topic, "/result") {
			continue
		}
		var r wire.Result
		if err := json.Unmarshal(m.payload, &r); err != nil {
			t.Fatalf("result on %s: %v: %s", m.topic, err, m.payload)
		}
		if r.OpID == op {
			out = append(out, r)
		}
	}
	return out
}

// waitFor polls cond until it holds or 10 s have passed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// waitResults waits until op has n Results and returns them.
func (p *recPublisher) waitResults(t *testing.T, op string, n int) []wire.Result {
	t.Helper()
	var rs []wire.Result
	waitFor(t, fmt.Sprintf("%d results of %s", n, op), func() bool {
		rs = p.results(t, op)
		return len(rs) >= n
	})
	return rs
}

const testConfig = `gateway_id: gw-t
data_dir: %s
mqtt: {broker: "tcp://127.0.0.1:1"}
devices:
  - {id: pump-1, type: pump, driver: {url: "http://127.0.0.1:9", idempotent: true, queryable: true}}
  - {id: pump-2, type: pump, driver: {url: "http://127.0.0.1:9", idempotent: true, queryable: true}}
`

// rig is one agent over a store file, with its fakes.
type rig struct {
	t    *testing.T
	cfg  *config.Config
	path string
	drv  *fakeDriver
	pub  *recPublisher
	st   *store.Store
	a    *Agent
	acks atomic.Int64
	// coord, when set, is the coordination the next start checks the
	// store's fence memory with (a real internal/fencemem.Memory).
	coord *config.Etcd
	fm    *fencemem.Memory
	// proven, when set, is the agent's Options.Proven (the ha gate).
	proven *atomic.Bool
}

func newRig(t *testing.T, drv *fakeDriver) *rig {
	t.Helper()
	return newCoordRig(t, drv, nil)
}

// newCoordRig is newRig with coordination (nil: none).
func newCoordRig(t *testing.T, drv *fakeDriver, coord *config.Etcd) *rig {
	t.Helper()
	dir := t.TempDir()
	cfg, err := config.Parse([]byte(fmt.Sprintf(testConfig, dir)))
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, cfg: cfg, path: filepath.Join(dir, "agent.db"), drv: drv, pub: &recPublisher{}, coord: coord}
	r.start(r.path)
	t.Cleanup(func() {
		r.pub.mu.Lock()
		defer r.pub.mu.Unlock()
		for _, e := range r.pub.early {
			t.Errorf("a Result before its record was durable: %s", e)
		}
	})
	return r
}

// start opens the store at path and starts an agent over it.
func (r *rig) start(path string) {
	r.t.Helper()
	st, err := store.Open(path, &store.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		r.t.Fatal(err)
	}
	st.Start()
	r.pub.st = st
	drivers := map[string]device.Driver{}
	for _, d := range r.cfg.Devices {
		drivers[d.ID] = r.drv
	}
	var fences FenceMemory
	if r.coord != nil {
		var ids []string
		for _, d := range r.cfg.Devices {
			ids = append(ids, d.ID)
		}
		r.fm = fencemem.New(fencemem.Options{Etcd: r.coord, Gateway: testGW, Devices: ids, Store: st,
			Logger: slog.New(slog.DiscardHandler), Retry: 50 * time.Millisecond})
		if err := r.fm.Start(context.Background()); err != nil {
			r.t.Fatal(err)
		}
		fences = r.fm
	}
	a, err := New(Options{Gateway: resolvedGateway(r.cfg), Devices: resolvedDevices(r.cfg), Store: st, Publisher: r.pub, Drivers: drivers,
		Logger: slog.New(slog.DiscardHandler), QueryWait: func(int) time.Duration { return time.Millisecond },
		ResendWait: func(int) time.Duration { return time.Millisecond }, Fences: fences,
		Proven: func() bool { return r.proven == nil || r.proven.Load() }})
	if err != nil {
		r.t.Fatal(err)
	}
	if r.fm != nil {
		r.fm.OnFloor(a.FloorTaken)
	}
	if err := a.Start(context.Background()); err != nil {
		r.t.Fatal(err)
	}
	r.st, r.a = st, a
	r.t.Cleanup(func() { r.stop(time.Second) })
}

// stop drains the agent for at most within (then stops it hard) and closes
// the store; a second call does nothing.
func (r *rig) stop(within time.Duration) {
	if r.a == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := r.a.Stop(ctx); err != nil {
		r.t.Errorf("stop: %v", err)
	}
	if r.fm != nil {
		r.fm.Close()
		r.fm = nil
	}
	if err := r.st.Close(); err != nil {
		r.t.Errorf("store close: %v", err)
	}
	r.a, r.st = nil, nil
}

// send delivers a command for dev and returns its ack channel.
func (r *rig) send(dev string, cmd wire.Command) <-chan struct{} {
	r.t.Helper()
	b, err := json.Marshal(cmd)
	if err != nil {
		r.t.Fatal(err)
	}
	return r.sendRaw(dev, b)
}

func (r *rig) sendRaw(dev string, payload []byte) <-chan struct{} {
	acked := make(chan struct{})
	var once sync.Once
	r.a.Deliver(Delivery{Topic: wire.CmdTopic(r.cfg.MQTT.TopicPrefix, testGW, dev), Payload: payload,
		Ack: func() {
			r.acks.Add(1)
			once.Do(func() { close(acked) })
		}})
	return acked
}

func waitAck(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s was never acknowledged", what)
	}
}

func set(op string, fence int64, rpm int) wire.Command {
	return wire.Command{OpID: op, Fence: fence, Action: "set", Params: json.RawMessage(fmt.Sprintf(`{"rpm":%d}`, rpm))}
}

func wantCode(t *testing.T, r wire.Result, code wire.Code, lastFence int64) {
	t.Helper()
	if r.Code != code || r.LastFence != lastFence {
		t.Fatalf("result of %s: %s/%s last_fence %d (%q), want %s, last_fence %d", r.OpID, r.Status, r.Code, r.LastFence, r.Reason, code, lastFence)
	}
}

// Invariant 2: a redelivered command is answered from its record
// (duplicate, the same outcome) and never reaches the device again; the
// same op_id with other parameters is op_conflict, answered and not
// recorded. Every delivery is acknowledged.
func TestDedupReplaysTheRecordedResult(t *testing.T) {
	r := newRig(t, newFakeDriver(true))
	waitAck(t, r.send("pump-1", set("op-1", 5, 100)), "op-1")
	first := r.pub.waitResults(t, "op-1", 1)[0]
	wantCode(t, first, wire.CodeOK, 5)
	waitAck(t, r.send("pump-1", set("op-1", 5, 100)), "op-1 again")
	rs := r.pub.waitResults(t, "op-1", 2)
	if !rs[1].Duplicate || rs[1].Code != wire.CodeOK || rs[1].Status != wire.StatusApplied || rs[0].Duplicate {
		t.Fatalf("replay %+v after %+v: want the recorded outcome marked duplicate", rs[1], rs[0])
	}
	waitAck(t, r.send("pump-1", set("op-1", 5, 999)), "op-1 with other params")
	rs = r.pub.waitResults(t, "op-1", 3)
	if rs[2].Code != wire.CodeOpConflict {
		t.Fatalf("same op_id, other params: %s, want op_conflict", rs[2].Code)
	}
	if n := r.drv.applies("op-1"); n != 1 {
		t.Fatalf("op-1 reached the device %d times, want 1", n)
	}
	if got, err := r.a.OpResult("pump-1", "op-1"); err != nil || got.Code != wire.CodeOK {
		t.Fatalf("recorded outcome %+v, %v: the conflict must not overwrite it", got, err)
	}
	if n := r.acks.Load(); n != 3 {
		t.Fatalf("%d acks, want 3", n)
	}
}

// Invariant 1: a fence below last_fence never reaches the device, and a
// barrier raises last_fence without a write, fencing off everything
// below it.
func TestStaleFenceAndBarrier(t *testing.T) {
	r := newRig(t, newFakeDriver(true))
	r.send("pump-1", set("a", 5, 100))
	wantCode(t, r.pub.waitResults(t, "a", 1)[0], wire.CodeOK, 5)
	r.send("pump-1", set("b", 4, 200))
	wantCode(t, r.pub.waitResults(t, "b", 1)[0], wire.CodeStaleFence, 5)
	r.send("pump-1", wire.Command{OpID: "bar", Fence: 9, Action: wire.ActionFence})
	wantCode(t, r.pub.waitResults(t, "bar", 1)[0], wire.CodeOK, 9)
	r.send("pump-1", set("c", 7, 300))
	wantCode(t, r.pub.waitResults(t, "c", 1)[0], wire.CodeStaleFence, 9)
	r.send("pump-1", set("d", 9, 400))
	wantCode(t, r.pub.waitResults(t, "d", 1)[0], wire.CodeOK, 9)
	if got, want := r.drv.events(), []string{"apply a", "apply d"}; !slices.Equal(got, want) {
		t.Fatalf("the device saw %v, want %v", got, want)
	}
	info, err := r.a.Device("pump-1")
	if err != nil || info.LastFence != 9 || info.LastOpID != "d" {
		t.Fatalf("device view %+v, %v: want last_fence 9 by d", info, err)
	}
	// The other device's fence is its own.
	r.send("pump-2", set("e", 1, 100))
	wantCode(t, r.pub.waitResults(t, "e", 1)[0], wire.CodeOK, 1)
}

// Commands answered on arrival are answered once, acknowledged and not
// recorded (invariant 4): unparseable, and for a device not configured.
func TestAnsweredOnArrival(t *testing.T) {
	r := newRig(t, newFakeDriver(true))
	waitAck(t, r.sendRaw("pump-1", []byte(`{"op_id":"bad","fence":"x"}`)), "invalid")
	waitAck(t, r.send("pump-9", set("nodev", 1, 1)), "unknown device")
	var codes []wire.Code
	waitFor(t, "two answers", func() bool {
		r.pub.mu.Lock()
		defer r.pub.mu.Unlock()
		codes = codes[:0]
		for _, m := range r.pub.msgs {
			var res wire.Result
			if json.Unmarshal(m.payload, &res) == nil && strings.HasSuffix(m.topic, "/result") {
				codes = append(codes, res.Code)
			}
		}
		return len(codes) >= 2
	})
	slices.Sort(codes)
	if want := []wire.Code{wire.CodeInvalid, wire.CodeUnknownDevice}; !slices.Equal(codes, want) {
		t.Fatalf("answers %v, want %v", codes, want)
	}
	if _, err := r.a.OpResult("pump-9", "nodev"); !errors.Is(err, ErrUnknownDevice) {
		t.Fatalf("OpResult of an unconfigured device: %v", err)
	}
	if ev := r.drv.events(); len(ev) != 0 {
		t.Fatalf("the device saw %v", ev)
	}
}

// Invariant 6: a write that times out is unknown (recorded, then
// published), is never resent, and holds its device until the device
// answers; the next command of the device waits behind it.
func TestTimeoutIsUnknownAndHoldsTheDevice(t *testing.T) {
	drv := newFakeDriver(true)
	drv.hang["x"] = true
	drv.setQueryErr(errors.New("device offline"))
	r := newRig(t, drv)
	r.send("pump-1", set("x", 3, 100))
	un := r.pub.waitResults(t, "x", 1)[0]
	if un.Status != wire.StatusUnknown || un.Code != wire.CodeOutcomeUnknown || un.Final() {
		t.Fatalf("first result of x: %+v, want unknown", un)
	}
	if rec, err := r.a.OpResult("pump-1", "x"); err != nil || rec.Status != wire.StatusUnknown {
		t.Fatalf("record of x when its unknown Result is out: %+v, %v", rec, err)
	}
	waitAck(t, r.send("pump-1", set("y", 3, 200)), "y")
	waitFor(t, "two failed queries", func() bool { return count1(drv.events(), "query x err") >= 2 })
	if n := drv.applies("y"); n != 0 {
		t.Fatal("y was sent while x was unknown")
	}
	held, err := r.a.HeldUnknown()
	if err != nil || len(held) != 1 || held[0].OpID != "x" || held[0].Queryable == nil || !*held[0].Queryable {
		t.Fatalf("held unknown: %+v, %v", held, err)
	}
	if s := r.a.Summary(); s.HeldUnknown != 1 || !s.StoreOK || s.Gateway != testGW {
		t.Fatalf("summary %+v", s)
	}
	drv.setQueryErr(nil)
	rs := r.pub.waitResults(t, "x", 2)
	wantCode(t, rs[1], wire.CodeOK, 3)
	wantCode(t, r.pub.waitResults(t, "y", 1)[0], wire.CodeOK, 3)
	ev := drv.events()
	if drv.applies("x") != 1 {
		t.Fatalf("x was resent: %v", ev)
	}
	if i, j := slices.Index(ev, "query x ok"), slices.Index(ev, "apply y"); i < 0 || j < i {
		t.Fatalf("y went out before x was resolved: %v", ev)
	}
	if r.a.Summary().HeldUnknown != 0 {
		t.Fatal("x still counted held")
	}
}

// Invariants 3, 4 and 6 across a restart: a write whose pending record is
// durable when the process dies is resolved with the device on restart,
// never resent; a write recorded unknown at a hard stop is resolved by the
// next agent over the same store file; each ends with a final Result.
func TestRecoveryOfPendingAndUnknown(t *testing.T) {
	drv := newFakeDriver(true)
	drv.bound = time.Minute // the write hangs until the hard stop
	drv.hang["p"] = true
	r := newRig(t, drv)
	r.send("pump-1", set("p", 4, 100))
	select {
	case <-drv.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("p never reached the device")
	}
	// The process dies here: the copy is the file as a crash leaves it,
	// p's pending record and last_fence durable, the write in flight.
	crashed := filepath.Join(t.TempDir(), "agent.db")
	if _, err := r.st.CompactTo(crashed, 0o600); err != nil {
		t.Fatal(err)
	}
	r.stop(0) // hard stop: the write is cancelled and recorded unknown
	for _, res := range r.pub.results(t, "p") {
		if res.Final() {
			t.Fatalf("p ended %s at the hard stop, with its outcome unknown", res.Code)
		}
	}

	// The same store file again: p is unknown (its unknown Result, if the
	// hard stop left it in the outbox, goes out now); the device says
	// applied.
	r.start(r.path)
	var rs []wire.Result
	waitFor(t, "p's final result", func() bool {
		rs = r.pub.results(t, "p")
		return len(rs) > 0 && rs[len(rs)-1].Final()
	})
	wantCode(t, rs[len(rs)-1], wire.CodeOK, 4)
	// A Result may be published more than once (the outbox is at least
	// once: one published just before the hard stop is published again),
	// but the unknown one comes first and only the last is final.
	for i, res := range rs[:len(rs)-1] {
		if res.Status != wire.StatusUnknown {
			t.Fatalf("result %d of p: %s before its final ok: %+v", i, res.Code, rs)
		}
	}
	if len(rs) < 2 {
		t.Fatalf("results of p: %+v, want unknown, then ok", rs)
	}

	// The crash image: p is pending; recovery asks the device first.
	r.stop(time.Second)
	r.pub = &recPublisher{}
	r.start(crashed)
	rs = r.pub.waitResults(t, "p", 1)
	wantCode(t, rs[len(rs)-1], wire.CodeOK, 4)
	if n := drv.applies("p"); n != 1 {
		t.Fatalf("p reached the device %d times, want 1 (never resent)", n)
	}
	if q := count1(drv.events(), "query p ok"); q != 2 {
		t.Fatalf("p was resolved by %d queries, want one per restart: %v", q, drv.events())
	}
	// The recovered device takes new commands, fenced by the recovered
	// last_fence.
	r.send("pump-1", set("q", 3, 100))
	wantCode(t, r.pub.waitResults(t, "q", 1)[0], wire.CodeStaleFence, 4)
}

// Invariant 6 for a device that cannot be asked: an unknown write holds
// it until an operator resolves it; "not applied" ends it without a
// resend, and the device takes the next command.
func TestOperatorResolvesAHeldWrite(t *testing.T) {
	drv := newFakeDriver(false)
	drv.hang["h"] = true
	r := newRig(t, drv)
	r.send("pump-1", set("h", 2, 100))
	if un := r.pub.waitResults(t, "h", 1)[0]; un.Status != wire.StatusUnknown {
		t.Fatalf("h: %+v, want unknown", un)
	}
	waitAck(t, r.send("pump-1", set("i", 2, 200)), "i")
	if _, err := r.a.Resolve(context.Background(), "pump-1", "nope", true, nil); !errors.Is(err, ErrNoSuchOp) {
		t.Fatalf("resolve of a missing op: %v", err)
	}
	res, err := r.a.Resolve(context.Background(), "pump-1", "h", false, nil)
	if err != nil || res.Code != wire.CodeNotApplied {
		t.Fatalf("resolve: %+v, %v", res, err)
	}
	if _, err := r.a.Resolve(context.Background(), "pump-1", "h", true, nil); !errors.Is(err, ErrNotUnknown) {
		t.Fatalf("second resolve: %v, want ErrNotUnknown", err)
	}
	wantCode(t, r.pub.waitResults(t, "h", 2)[1], wire.CodeNotApplied, 2)
	wantCode(t, r.pub.waitResults(t, "i", 1)[0], wire.CodeOK, 2)
	if n := drv.applies("h"); n != 1 {
		t.Fatalf("h was resent (%d applies)", n)
	}
	page, err := r.a.History("pump-1", "", 1)
	if err != nil || len(page.Ops) != 1 || page.Ops[0].OpID != "i" || page.Next == "" {
		t.Fatalf("history page 1: %+v, %v", page, err)
	}
	page, err = r.a.History("pump-1", page.Next, 10)
	if err != nil || len(page.Ops) != 1 || page.Ops[0].OpID != "h" || page.Ops[0].Code != wire.CodeNotApplied {
		t.Fatalf("history page 2: %+v, %v", page, err)
	}
	if _, err := r.a.History("pump-1", "x", 10); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("bad cursor: %v", err)
	}
}

// Invariant 3: a command is acknowledged only once its admission is
// durable: at every ack the store already holds its record.
func TestAckAfterTheInboxCommit(t *testing.T) {
	r := newRig(t, newFakeDriver(true))
	const n = 50
	var missing atomic.Int32
	acked := make(chan struct{}, n)
	for i := range n {
		op := fmt.Sprintf("op-%d", i)
		b, _ := json.Marshal(set(op, 1, i))
		r.a.Deliver(Delivery{Topic: wire.CmdTopic(r.cfg.MQTT.TopicPrefix, testGW, "pump-1"), Payload: b, Ack: func() {
			var ok bool
			r.st.View(func(tx *store.Tx) error {
				_, ok, _ = tx.Op("pump-1", op)
				return nil
			})
			if !ok {
				missing.Add(1)
			}
			acked <- struct{}{}
		}})
	}
	for i := range n {
		select {
		case <-acked:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d commands acknowledged", i, n)
		}
	}
	if m := missing.Load(); m > 0 {
		t.Fatalf("%d of %d commands were acknowledged before their record was durable", m, n)
	}
}

// resolvedGateway and resolvedDevices are what internal/app makes of a
// configuration, for the fakes here (every device's driver is the fake).
func resolvedGateway(c *config.Config) Gateway {
	return Gateway{GatewayID: c.GatewayID, TopicPrefix: c.MQTT.TopicPrefix,
		Retention: c.Dedup.Retention.D(), KeepLast: c.Dedup.KeepLast}
}

func resolvedDevices(c *config.Config) []Device {
	var ds []Device
	for _, d := range c.Devices {
		ds = append(ds, Device{ID: d.ID, Type: d.Type, Group: d.Group, Lock: d.Lock, Worker: d.WorkerID(),
			Queue: d.Queue, Resends: d.Driver.Resends, Timeout: time.Second})
	}
	return ds
}
