package controllertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestTwoContendersOneActive(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t)
	ctx := context.Background()
	opts := func(l *stateLog) *controller.LockOptions {
		return &controller.LockOptions{TTL: 2 * time.Second, AcquireTimeout: 1500 * time.Millisecond, OnState: l.on}
	}
	var la, lb stateLog
	a := controller.NewHolder(cli, []string{"locks/two"}, opts(&la))
	b := controller.NewHolder(cli, []string{"locks/two"}, opts(&lb))
	type res struct {
		h   *controller.Holder
		err error
		dur time.Duration
	}
	out := make(chan res, 2)
	for _, h := range []*controller.Holder{a, b} {
		go func() {
			start := time.Now()
			err := h.Acquire(ctx)
			out <- res{h, err, time.Since(start)}
		}()
	}
	first := <-out
	if first.err != nil {
		t.Fatalf("first acquire: %v", first.err)
	}
	other := a
	if first.h == a {
		other = b
	}
	// While the winner holds, the other is ACQUIRING, not ACTIVE.
	if s := other.State(); s != controller.StateAcquiring {
		t.Fatalf("other holder is %s while the first is ACTIVE", s)
	}
	if s := first.h.State(); s != controller.StateActive {
		t.Fatalf("winner is %s", s)
	}
	second := <-out
	if !errors.Is(second.err, controller.ErrAcquireTimeout) {
		t.Fatalf("second acquire: got %v, want ErrAcquireTimeout", second.err)
	}
	if second.dur < 1400*time.Millisecond || second.dur > 3500*time.Millisecond {
		t.Fatalf("second acquire ended after %v, want about its 1.5s bound", second.dur)
	}
	if s := other.State(); s != controller.StateReleased {
		t.Fatalf("loser state %s, want RELEASED", s)
	}
	if got := keysUnder(t, cli, "locks/two"); len(got) != 1 || got[0].Rev != first.h.Fence() {
		t.Fatalf("keys under lock: %+v, want only the winner's (fence %d)", got, first.h.Fence())
	}
	if err := first.h.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	if got := keysUnder(t, cli, "locks/two"); len(got) != 0 {
		t.Fatalf("keys after release: %+v", got)
	}
	wantW := []controller.State{controller.StateAcquiring, controller.StateActive, controller.StateReleasing, controller.StateReleased}
	wl := &la
	if first.h == b {
		wl = &lb
	}
	if got := wl.states(); !slices.Equal(got, wantW) {
		t.Fatalf("winner transitions %v, want %v", got, wantW)
	}
	// A used holder never acquires again.
	if err := first.h.Acquire(ctx); !errors.Is(err, controller.ErrUsed) {
		t.Fatalf("re-acquire: %v, want ErrUsed", err)
	}
}

func TestKilledHolderExpires(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t)
	const ttl = 2 * time.Second
	p := startHolderProc(t, c.Endpoints(), "locks/kill", ttl)
	fa := p.fence()

	b := controller.NewHolder(cli, []string{"locks/kill"}, &controller.LockOptions{TTL: ttl, AcquireTimeout: 10 * time.Second})
	done := make(chan error, 1)
	go func() { done <- b.Acquire(context.Background()) }()
	testkit.Eventually(t, 5*time.Second, "B queued behind A", func() bool { return len(keysUnder(t, cli, "locks/kill")) == 2 })
	if s := b.State(); s != controller.StateAcquiring {
		t.Fatalf("B is %s while A holds", s)
	}
	killed := time.Now()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.done
	if err := <-done; err != nil {
		t.Fatalf("B acquire after A was killed: %v", err)
	}
	waited := time.Since(killed)
	t.Logf("B became ACTIVE %v after A was killed (TTL %v), fences A=%d B=%d", waited, ttl, fa, b.Fence())
	// A never released: B got the lock only once A's lease ran out.
	if waited < ttl/2 || waited > ttl+2*time.Second {
		t.Fatalf("B waited %v after the kill, want about the TTL %v", waited, ttl)
	}
	if b.Fence() <= fa {
		t.Fatalf("B's fence %d not above the killed holder's %d", b.Fence(), fa)
	}
	if err := b.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestStoppedHolderReportsLost(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t)
	const ttl = 2 * time.Second
	p := startHolderProc(t, c.Endpoints(), "locks/stop", ttl)
	fa := p.fence()
	p.stop()
	stopped := time.Now()
	b, err := controller.Acquire(context.Background(), cli, []string{"locks/stop"}, &controller.LockOptions{TTL: ttl, AcquireTimeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("B acquire while A is stopped: %v", err)
	}
	t.Logf("B ACTIVE %v after SIGSTOP of A; fences A=%d B=%d", time.Since(stopped), fa, b.Fence())
	if b.Fence() <= fa {
		t.Fatalf("B fence %d <= A fence %d", b.Fence(), fa)
	}
	// B writes under its ownership while A is frozen.
	if _, err := cli.Txn(context.Background()).If(clientv3.Compare(clientv3.CreateRevision(b.Key("locks/stop")), "=", b.Fence())).
		Then(clientv3.OpPut("data/stop", "B")).Commit(); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.Join(p.output(), "\n"), "LOST") {
		t.Fatal("A reported LOST while stopped: it was not frozen")
	}
	p.send("check")
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	line := p.waitLine(5*time.Second, "CHECK ")
	if !strings.HasPrefix(line, "CHECK LOST") || !strings.Contains(line, controller.ErrLost.Error()) {
		t.Fatalf("A after resuming: %q, want LOST", line)
	}
	p.waitLine(5*time.Second, "STATE LOST")
	// And A's late release removes nothing of B's.
	p.send("release")
	rl := p.waitLine(5*time.Second, "RELEASE ")
	if !strings.Contains(rl, controller.ErrNotOwner.Error()) {
		t.Fatalf("A's release: %q", rl)
	}
	if b.Check() != nil || len(keysUnder(t, cli, "locks/stop")) != 1 {
		t.Fatalf("B after A's late release: %v, keys %+v", b.Check(), keysUnder(t, cli, "locks/stop"))
	}
}

func TestLateReleaseKeepsNewHolder(t *testing.T) {
	c := etcdtest.Start(t, 1)
	direct := c.Client(t)
	proxy := testkit.NewProxy(t, strings.TrimPrefix(c.Members[0].ClientURL, "http://"))
	viaProxy := newClient(t, "http://"+proxy.Addr())
	const ttl = 2 * time.Second
	var la stateLog
	a, err := controller.Acquire(context.Background(), viaProxy, []string{"locks/late"}, &controller.LockOptions{TTL: ttl, OnState: la.on, ReleaseTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// A's keepalives stop reaching etcd.
	proxy.Pause()
	paused := time.Now()
	testkit.Eventually(t, 5*time.Second, "A LOST", func() bool { return a.State() == controller.StateLost })
	lostAfter := time.Since(paused)
	if a.Context().Err() == nil || !errors.Is(context.Cause(a.Context()), controller.ErrRenewalOverdue) {
		t.Fatalf("A's context after LOST: %v (cause %v)", a.Context().Err(), context.Cause(a.Context()))
	}
	if lostAfter > ttl {
		t.Fatalf("A noticed the loss %v after the pause, later than the TTL %v", lostAfter, ttl)
	}
	b, err := controller.Acquire(context.Background(), direct, []string{"locks/late"}, &controller.LockOptions{TTL: ttl, AcquireTimeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("B: %v", err)
	}
	if proxy.Held() == 0 {
		t.Fatal("the proxy held no traffic: the pause did not happen")
	}
	t.Logf("A LOST %v after the pause; B ACTIVE %v after it; fences A=%d B=%d", lostAfter, time.Since(paused), a.Fence(), b.Fence())
	proxy.Resume()
	err = a.Release(context.Background())
	if !errors.Is(err, controller.ErrNotOwner) {
		t.Fatalf("late release: %v, want ErrNotOwner", err)
	}
	keys := keysUnder(t, direct, "locks/late")
	if len(keys) != 1 || keys[0].Rev != b.Fence() || b.Check() != nil {
		t.Fatalf("after the late release: keys %+v, B check %v; want B's key (rev %d)", keys, b.Check(), b.Fence())
	}
	if got, want := la.states(), []controller.State{controller.StateAcquiring, controller.StateActive, controller.StateLost}; !slices.Equal(got, want) {
		t.Fatalf("A transitions %v, want %v", got, want)
	}
	if err := b.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// lossyKV executes transactions for real but loses the first n answers,
// as when the response to a lock request is lost on the network.
type lossyKV struct {
	clientv3.KV
	drop atomic.Int32
}

func (l *lossyKV) Txn(ctx context.Context) clientv3.Txn {
	return &lossyTxn{Txn: l.KV.Txn(ctx), kv: l}
}

type lossyTxn struct {
	clientv3.Txn
	kv *lossyKV
}

func (t *lossyTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *lossyTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *lossyTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }
func (t *lossyTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if err == nil && t.kv.drop.Add(-1) >= 0 {
		return nil, context.DeadlineExceeded
	}
	return resp, err
}

func TestLostAcquireResponse(t *testing.T) {
	c := etcdtest.Start(t, 1)
	direct := c.Client(t)
	lossy := newClient(t, c.Endpoints()...)
	kv := &lossyKV{KV: lossy.KV}
	kv.drop.Store(1)
	lossy.KV = kv
	a, err := controller.Acquire(context.Background(), lossy, []string{"locks/lostresp"}, &controller.LockOptions{TTL: 5 * time.Second, AcquireTimeout: 5 * time.Second, BackoffBase: 20 * time.Millisecond})
	if err != nil {
		t.Fatalf("acquire with a lost response: %v", err)
	}
	if kv.drop.Load() >= 0 || len(a.Attempts()) < 2 {
		t.Fatalf("the lost response did not happen (drop %d, attempts %d)", kv.drop.Load(), len(a.Attempts()))
	}
	keys := keysUnder(t, direct, "locks/lostresp")
	if len(keys) != 1 || keys[0].Rev != a.Fence() || keys[0].Lease != int64(a.Lease()) {
		t.Fatalf("keys %+v; want exactly one, A's (rev %d, lease %x)", keys, a.Fence(), a.Lease())
	}
	leases, err := direct.Leases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Leases) != 1 {
		t.Fatalf("%d live leases, want 1 (no second session of the same controller)", len(leases.Leases))
	}
	// A second workflow cannot become ACTIVE while A is.
	_, err = controller.Acquire(context.Background(), direct, []string{"locks/lostresp"}, &controller.LockOptions{TTL: 5 * time.Second, AcquireTimeout: 700 * time.Millisecond})
	if !errors.Is(err, controller.ErrAcquireTimeout) {
		t.Fatalf("second acquire while A is ACTIVE: %v", err)
	}
	if err := a.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestMaxHoldReleases(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t)
	var l stateLog
	h, err := controller.Acquire(context.Background(), cli, []string{"locks/maxhold"}, &controller.LockOptions{TTL: 5 * time.Second, MaxHold: 400 * time.Millisecond, OnState: l.on})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	<-h.Context().Done()
	if held := time.Since(start); held > 1500*time.Millisecond {
		t.Fatalf("context ended after %v, MaxHold is 400ms", held)
	}
	if !errors.Is(context.Cause(h.Context()), controller.ErrMaxHold) {
		t.Fatalf("cause %v, want ErrMaxHold", context.Cause(h.Context()))
	}
	if err := h.Release(context.Background()); err != nil {
		t.Fatalf("release after MaxHold: %v", err)
	}
	if s := h.State(); s != controller.StateReleased {
		t.Fatalf("state %s", s)
	}
	if k := keysUnder(t, cli, "locks/maxhold"); len(k) != 0 {
		t.Fatalf("keys left: %+v", k)
	}
	if got, want := l.states(), []controller.State{controller.StateAcquiring, controller.StateActive, controller.StateReleasing, controller.StateReleased}; !slices.Equal(got, want) {
		t.Fatalf("transitions %v, want %v", got, want)
	}
}

func TestOverlappingSetsNoDeadlock(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t)
	sets := [][]string{{"locks/set/b", "locks/set/a"}, {"locks/set/a", "locks/set/b"}, {"locks/set/c", "locks/set/b"}}
	var active atomic.Int32
	errs := make(chan error, 3*5)
	var wg sync.WaitGroup
	for _, set := range sets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				h, err := controller.Acquire(context.Background(), cli, set, &controller.LockOptions{TTL: 5 * time.Second, AcquireTimeout: 10 * time.Second})
				if err != nil {
					errs <- err
					return
				}
				if !slices.IsSorted(h.Locks()) {
					errs <- fmt.Errorf("locks %v not in sorted order", h.Locks())
				}
				// Sets 0 and 1 are the same set; set 2 shares "b".
				if n := active.Add(1); n > 1 {
					errs <- fmt.Errorf("%d overlapping holders ACTIVE at once", n)
				}
				time.Sleep(10 * time.Millisecond) // work while holding
				active.Add(-1)
				if err := h.Release(context.Background()); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestUnconfirmedReleaseWaitsOutTTL(t *testing.T) {
	c := etcdtest.Start(t, 1)
	direct := c.Client(t)
	proxy := testkit.NewProxy(t, strings.TrimPrefix(c.Members[0].ClientURL, "http://"))
	viaProxy := newClient(t, "http://"+proxy.Addr())
	const ttl = 2 * time.Second
	a, err := controller.Acquire(context.Background(), viaProxy, []string{"locks/unconf"}, &controller.LockOptions{
		TTL: ttl, ReleaseTimeout: 300 * time.Millisecond, RequestTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	proxy.Pause()
	start := time.Now()
	relDone := make(chan error, 1)
	go func() { relDone <- a.Release(context.Background()) }()
	testkit.Eventually(t, 3*time.Second, "release attempts to be held by the pause", func() bool { return proxy.Held() > 0 })
	// Another holder in this process must not get the lock before the TTL
	// is waited out.
	b, err := controller.Acquire(context.Background(), direct, []string{"locks/unconf"}, &controller.LockOptions{TTL: ttl, AcquireTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	gotB := time.Since(start)
	if s := a.State(); s != controller.StateReleasing && s != controller.StateReleased {
		t.Fatalf("A is %s", s)
	}
	err = <-relDone
	took := time.Since(start)
	t.Logf("unconfirmed release returned after %v (%v); B acquired after %v", took, err, gotB)
	if err != nil {
		t.Fatalf("release: %v", err)
	}
	if took < ttl || gotB < ttl {
		t.Fatalf("release returned after %v, B acquired after %v: before the TTL %v ran out", took, gotB, ttl)
	}
	if a.State() != controller.StateReleased || b.Check() != nil {
		t.Fatalf("A %s, B %v", a.State(), b.Check())
	}
	proxy.Resume()
	if err := b.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestRevokedLeaseIsLost(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t)
	h, err := controller.Acquire(context.Background(), cli, []string{"locks/revoked"}, &controller.LockOptions{TTL: 10 * time.Second, RenewInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Someone else (an operator, a compaction of leases) ends the session.
	if _, err := c.Client(t).Revoke(context.Background(), h.Lease()); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	testkit.Eventually(t, 5*time.Second, "holder LOST", func() bool { return h.State() == controller.StateLost })
	if d := time.Since(revoked); d > 2*time.Second {
		t.Fatalf("LOST %v after the revoke; the TTL (10s) should not be waited for", d)
	}
	if !errors.Is(h.Check(), controller.ErrSessionEnded) || !errors.Is(context.Cause(h.Context()), controller.ErrSessionEnded) {
		t.Fatalf("check %v, cause %v; want ErrSessionEnded", h.Check(), context.Cause(h.Context()))
	}
	if err := h.Release(context.Background()); !errors.Is(err, controller.ErrNotOwner) {
		t.Fatalf("release after the revoke: %v, want ErrNotOwner", err)
	}
}
