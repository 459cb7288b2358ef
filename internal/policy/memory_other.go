//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package policy

import "github.com/tetratelabs/wazero/experimental"

// memoryAllocator is wazero's own (a Go []byte) where there is no mmap.
func memoryAllocator() experimental.MemoryAllocator { return nil }
