// gorawnop: the ABI by hand in Go, answering {"allow":true} without
// looking at the input: the cost of entering a Go guest at all.
package main

import "unsafe"

var buf = make([]byte, 4096)
var out = []byte(`{"allow":true}`)

//go:wasmexport policy_abi_version
func version() int32 { return 1 }

//go:wasmexport policy_buffer
func buffer(n int32) int32 {
	if int(n) > len(buf) {
		buf = make([]byte, n)
	}
	return int32(uintptr(unsafe.Pointer(&buf[0])))
}

//go:wasmexport policy_init
func initp(n int32) int32 { return 0 }

//go:wasmexport policy_eval
func eval(n int32) int64 {
	return int64(uintptr(unsafe.Pointer(&out[0])))<<32 | int64(len(out))
}

func main() {}
