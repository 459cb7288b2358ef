//go:build linux || darwin || freebsd || netbsd || openbsd

package policy

import (
	"bytes"
	"testing"
)

// The two LinearMemory kinds keep their contents as they grow, never move
// (mmapMemory) and refuse to grow past the maximum (memory.grow fails in
// the guest).
func TestLinearMemories(t *testing.T) {
	mm := memoryAllocator().Allocate(0, 4*pageSize)
	if _, ok := mm.(*mmapMemory); !ok {
		t.Fatalf("allocator returned %T, want *mmapMemory", mm)
	}
	for name, m := range map[string]interface {
		Reallocate(uint64) []byte
		Free()
	}{"mmap": mm, "heap fallback": &heapMemory{max: 4 * pageSize}} {
		t.Run(name, func(t *testing.T) {
			defer m.Free()
			a := m.Reallocate(pageSize)
			if len(a) != pageSize {
				t.Fatalf("len %d", len(a))
			}
			copy(a[pageSize-3:], "abc")
			b := m.Reallocate(3 * pageSize)
			if len(b) != 3*pageSize || !bytes.Equal(b[pageSize-3:pageSize], []byte("abc")) || b[2*pageSize] != 0 {
				t.Fatalf("grown memory lost its contents or is not zero")
			}
			if _, ok := m.(*mmapMemory); ok && &a[0] != &b[0] {
				t.Fatal("mmap memory moved")
			}
			if c := m.Reallocate(4*pageSize + 1); c != nil {
				t.Fatalf("grew past the maximum: %d bytes", len(c))
			}
		})
	}
	if m := memoryAllocator().Allocate(0, 0); m.Reallocate(1) != nil {
		t.Fatal("a memory of 0 pages grew")
	}
}
