//go:build linux || darwin || freebsd || netbsd || openbsd

package policy

import (
	"strconv"
	"syscall"

	"github.com/tetratelabs/wazero/experimental"
)

// mmapMemory backs a guest's linear memory with its own anonymous
// mapping, reserved at the memory's maximum (the binding's memory limit)
// and never moved, instead of a Go []byte:
//
//   - only the pages the guest writes are resident: a Go guest's 2.25 MiB
//     initial memory is mostly zero pages it never touches, which a Go
//     []byte (copied at every memory.grow) would have made resident;
//   - it is outside the Go heap, so the agent's GC neither scans it nor
//     lets the heap grow to twice it (GOGC): with six Go instances that was
//     about 40 MiB of the agent's RSS (BENCHMARKS.md, "footprint");
//   - memory.grow never copies.
//
// The reservation is address space only (MAP_NORESERVE): 64 MiB per
// instance by default. Free unmaps it; wazero calls it when the instance
// is closed, after which nothing may read the memory (the host copies
// everything it keeps out of guest memory: decodeOutput, hostLog).
type mmapMemory struct {
	buf []byte // the whole reservation
}

// memoryAllocator returns the allocator for guest memories; nil means
// wazero's own (a Go []byte). On a 32-bit system the reservations (64 MiB
// per instance) could exhaust the address space: wazero's own there.
func memoryAllocator() experimental.MemoryAllocator {
	if strconv.IntSize == 32 {
		return nil
	}
	return experimental.MemoryAllocatorFunc(func(_, max uint64) experimental.LinearMemory {
		if max == 0 || max > 4<<30 { // no room to reserve (a memory of 0 pages), or not wasm32
			return &heapMemory{max: max}
		}
		b, err := syscall.Mmap(-1, 0, int(max), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON|mapNoReserve)
		if err != nil {
			return &heapMemory{max: max}
		}
		return &mmapMemory{buf: b}
	})
}

// Reallocate returns the first size bytes; nil (memory.grow fails in the
// guest) beyond the reservation.
func (m *mmapMemory) Reallocate(size uint64) []byte {
	if m.buf == nil || size > uint64(len(m.buf)) {
		return nil
	}
	return m.buf[:size:size]
}

// Free unmaps the memory.
func (m *mmapMemory) Free() {
	if m.buf != nil {
		_ = syscall.Munmap(m.buf)
		m.buf = nil
	}
}

// heapMemory is the fallback when a mapping fails (address space
// exhausted): a Go []byte, as wazero's own.
type heapMemory struct {
	buf []byte
	max uint64
}

func (m *heapMemory) Reallocate(size uint64) []byte {
	if size > m.max {
		return nil
	}
	if size > uint64(cap(m.buf)) {
		m.buf = append(m.buf[:cap(m.buf)], make([]byte, size-uint64(cap(m.buf)))...)
	}
	m.buf = m.buf[:size]
	return m.buf
}

func (m *heapMemory) Free() { m.buf = nil }
