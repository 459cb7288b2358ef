package controller

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// eventually polls f until it returns true or the deadline passes.
func eventually(t *testing.T, d time.Duration, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stateLog records a holder's transitions.
type stateLog struct {
	mu sync.Mutex
	tr []State
}

func (l *stateLog) on(_, to State) {
	l.mu.Lock()
	l.tr = append(l.tr, to)
	l.mu.Unlock()
}

func (l *stateLog) states() []State {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]State(nil), l.tr...)
}

func keysUnder(t *testing.T, cli *clientv3.Client, prefix string) []*struct {
	Key   string
	Rev   int64
	Lease int64
} {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("get %s: %v", prefix, err)
	}
	var out []*struct {
		Key   string
		Rev   int64
		Lease int64
	}
	for _, kv := range resp.Kvs {
		out = append(out, &struct {
			Key   string
			Rev   int64
			Lease int64
		}{string(kv.Key), kv.CreateRevision, kv.Lease})
	}
	return out
}

func newClient(t *testing.T, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := etcdtest.NewClient(endpoints)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
