package controllertest

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/etcdtest"
)

// register is a fenced resource for the etcd-only tests: it accepts a
// write whose fence is not below the highest it has seen, and records
// every write in order. (The end-to-end tests use the real agent.)
type register struct {
	mu     sync.Mutex
	max    int64
	writes []regWrite
}

type regWrite struct {
	who      string
	fence    int64
	accepted bool
	at       time.Time
}

func (r *register) write(who string, fence int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ok := fence >= r.max
	if ok {
		r.max = fence
	}
	r.writes = append(r.writes, regWrite{who, fence, ok, time.Now()})
	return ok
}

func (r *register) all() []regWrite {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]regWrite(nil), r.writes...)
}

// work writes under h every few milliseconds while h passes its check,
// until h's context ends or stop closes. It returns how many writes it made.
func work(h *controller.Holder, who string, reg *register, stop <-chan struct{}) int {
	n := 0
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-h.Context().Done():
			return n
		case <-stop:
			return n
		case <-t.C:
		}
		if h.Check() != nil {
			return n
		}
		reg.write(who, h.Fence())
		n++
	}
}

func TestLeaderKilledWhileHeld(t *testing.T) {
	c := etcdtest.Start(t, 3)
	const ttl = 2 * time.Second
	cliA := newClient(t, c.Endpoints()...)
	cliB := newClient(t, c.Endpoints()...)
	var la stateLog
	a, err := controller.Acquire(context.Background(), cliA, []string{"locks/leader"}, &controller.LockOptions{TTL: ttl, OnState: la.on, RequestTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	reg := &register{}
	stopA := make(chan struct{})
	aDone := make(chan int, 1)
	go func() { aDone <- work(a, "A", reg, stopA) }()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Kill(leader)
	killed := time.Now()
	testkit.Eventually(t, 10*time.Second, "a new leader", func() bool {
		l, err := c.Leader(ctx)
		return err == nil && l != leader
	})
	t.Logf("killed leader m%d; new leader elected after %v; A is %s", leader, time.Since(killed), a.State())

	bDone := make(chan error, 1)
	var b *controller.Holder
	go func() {
		var err error
		b, err = controller.Acquire(ctx, cliB, []string{"locks/leader"}, &controller.LockOptions{TTL: ttl, AcquireTimeout: 8 * time.Second, RequestTimeout: 500 * time.Millisecond})
		bDone <- err
	}()
	// A works a little longer (if it still can), then releases.
	select {
	case <-a.Context().Done():
	case <-time.After(1500 * time.Millisecond):
	}
	close(stopA)
	aWrites := <-aDone
	aEnd := a.State()
	relErr := a.Release(context.Background())
	if err := <-bDone; err != nil {
		t.Fatalf("B acquire: %v", err)
	}
	bWrites := work(b, "B", reg, timeAfter(300*time.Millisecond))
	if err := b.Release(context.Background()); err != nil {
		t.Fatal(err)
	}

	switch aEnd {
	case controller.StateActive:
		if relErr != nil {
			t.Fatalf("A kept ownership but its release failed: %v", relErr)
		}
		t.Logf("A kept ownership through the failover (%d writes), then released", aWrites)
	case controller.StateLost:
		if a.Context().Err() == nil {
			t.Fatal("A is LOST but its context is not cancelled")
		}
		t.Logf("A went LOST (%v) and stopped after %d writes", context.Cause(a.Context()), aWrites)
	default:
		t.Fatalf("A ended %s, want ACTIVE or LOST", aEnd)
	}
	if b.Fence() <= a.Fence() {
		t.Fatalf("B fence %d <= A fence %d", b.Fence(), a.Fence())
	}
	ws := reg.all()
	seenB := false
	for _, w := range ws {
		if !w.accepted {
			t.Fatalf("a write was rejected (%+v): a holder wrote after losing ownership", w)
		}
		if w.who == "B" {
			seenB = true
		} else if seenB {
			t.Fatalf("A wrote at %v after B had started writing", w.at)
		}
	}
	if aWrites == 0 || bWrites == 0 {
		t.Fatalf("writes A=%d B=%d: both should have worked in turn", aWrites, bWrites)
	}
}

func timeAfter(d time.Duration) <-chan struct{} {
	ch := make(chan struct{})
	time.AfterFunc(d, func() { close(ch) })
	return ch
}

func TestTwentyContenders(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t)
	const (
		n       = 20
		bound   = 6 * time.Second
		hold    = 40 * time.Millisecond
		attempt = 250 * time.Millisecond
	)
	start := time.Now()
	var active, maxActive atomic.Int32
	type outcome struct {
		err      error
		took     time.Duration
		attempts []time.Time
	}
	outs := make([]outcome, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := controller.NewHolder(cli, []string{"locks/herd"}, &controller.LockOptions{
				TTL: 5 * time.Second, AcquireTimeout: bound, AttemptWait: attempt,
				BackoffBase: 200 * time.Millisecond, BackoffMax: time.Second,
			})
			t0 := time.Now()
			err := h.Acquire(context.Background())
			outs[i] = outcome{err: err, took: time.Since(t0), attempts: h.Attempts()}
			if err != nil {
				return
			}
			a := active.Add(1)
			for m := maxActive.Load(); a > m && !maxActive.CompareAndSwap(m, a); m = maxActive.Load() {
			}
			time.Sleep(hold) // the work done while holding
			active.Add(-1)
			if err := h.Release(context.Background()); err != nil {
				t.Errorf("release: %v", err)
			}
		}()
	}
	wg.Wait()
	if m := maxActive.Load(); m != 1 {
		t.Fatalf("%d holders were ACTIVE at once", m)
	}
	var ok, timedOut int
	var firstRetries []time.Duration
	var all []time.Duration
	for i, o := range outs {
		if o.took > bound+time.Second {
			t.Fatalf("contender %d: acquire took %v, beyond its bound %v", i, o.took, bound)
		}
		switch {
		case o.err == nil:
			ok++
		case errors.Is(o.err, controller.ErrAcquireTimeout):
			timedOut++
		default:
			t.Fatalf("contender %d: %v", i, o.err)
		}
		for j, at := range o.attempts[1:] {
			if j == 0 {
				firstRetries = append(firstRetries, at.Sub(start))
			}
			all = append(all, at.Sub(start))
		}
	}
	t.Logf("%d acquired, %d timed out within %v; %d retries", ok, timedOut, bound, len(all))
	if ok == 0 {
		t.Fatal("nobody acquired")
	}
	if len(firstRetries) < 5 {
		t.Fatalf("only %d contenders retried: the test did not create contention", len(firstRetries))
	}
	sort.Slice(firstRetries, func(i, j int) bool { return firstRetries[i] < firstRetries[j] })
	t.Logf("first retry times: %s", histogram(firstRetries, 25*time.Millisecond))
	t.Logf("all retry times:   %s", histogram(all, 100*time.Millisecond))
	// A synchronised herd would retry within a few ms of each other.
	spread := firstRetries[len(firstRetries)-1] - firstRetries[0]
	if spread < 60*time.Millisecond {
		t.Fatalf("first retries spread over only %v: %v", spread, firstRetries)
	}
	for i := range firstRetries {
		k := 0
		for j := i; j < len(firstRetries) && firstRetries[j]-firstRetries[i] < 10*time.Millisecond; j++ {
			k++
		}
		if k > len(firstRetries)/3+1 {
			t.Fatalf("%d of %d first retries within 10ms of %v: a herd", k, len(firstRetries), firstRetries[i])
		}
	}
}

func histogram(ds []time.Duration, bucket time.Duration) string {
	counts := map[int]int{}
	maxB := 0
	for _, d := range ds {
		b := int(d / bucket)
		counts[b]++
		if b > maxB {
			maxB = b
		}
	}
	var sb strings.Builder
	for b := 0; b <= maxB; b++ {
		if counts[b] > 0 {
			fmt.Fprintf(&sb, "[%v:%d] ", time.Duration(b)*bucket, counts[b])
		}
	}
	return sb.String()
}
