package policy

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

// TestPoolGrowsOnDemandWithGuestMemoryOutsideTheHeap: a pool starts with
// one warm instance and grows only when calls need more, up to
// limits.instances (then a call waits); and a Go guest's linear memory
// (2.25 MiB at instantiation) is mapped outside the Go heap
// (memory_unix.go), so each further instance adds far less than that to
// the agent's heap. With wazero's own allocator (a Go []byte per memory)
// each adds more than its memory.
func TestPoolGrowsOnDemandWithGuestMemoryOutsideTheHeap(t *testing.T) {
	h := newTestHost(t, HostOptions{CacheDir: sharedCache(t), Defaults: Limits{Instances: 8}})
	h.bind(t, "pump-1", "range-limit", `{"param":"rpm","max":3000}`)
	h.start(t)
	p := h.table.Load().pools["pump-1"]
	if n := len(p.sem); n != 1 {
		t.Fatalf("%d instances after Start, want 1", n)
	}
	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	if !p.enter() {
		t.Fatal("pool retired")
	}
	defer p.exit()
	ctx := context.Background()
	first, err := p.get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := heap()
	insts := []*instance{first}
	for len(insts) < 8 {
		inst, err := p.get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		insts = append(insts, inst)
	}
	after := heap()
	if n := len(p.sem); n != 8 {
		t.Fatalf("%d instances with 8 calls in hand, want 8", n)
	}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := p.get(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a ninth call did not wait for an instance: %v", err)
	}
	for _, inst := range insts {
		p.put(inst)
	}
	per := int64(after-before) / 7
	t.Logf("Go heap per further instance: %d KiB (its linear memory: %d KiB)", per>>10, insts[1].mem.Size()>>10)
	if memoryAllocator() != nil && per > 1<<20 {
		t.Fatalf("each instance adds %d KiB to the Go heap: its memory is in the heap", per>>10)
	}
}
