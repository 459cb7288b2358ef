//go:build wasip1

//lint:file-ignore U1000 the ABI's functions are exported to the host with go:wasmexport, which staticcheck does not count as a use

package sdk

import "unsafe"

// buf is the buffer policy_buffer hands to the host. Keeping it in a
// package variable keeps it referenced: the GC must not free it while the
// host may still write into it (until the next policy_buffer call).
var buf []byte

// out holds the last output, valid until the next call.
var out []byte

// input is the Input of the current call.
var input Input

//go:wasmexport policy_abi_version
func policyABIVersion() int32 { return 1 }

//go:wasmexport policy_buffer
func policyBuffer(size int32) int32 {
	if size < 0 {
		return 0
	}
	if cap(buf) < int(size) || cap(buf) == 0 {
		n := int(size)
		if n == 0 {
			n = 1
		}
		buf = make([]byte, n)
	}
	buf = buf[:cap(buf)]
	return int32(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
}

//go:wasmexport policy_init
func policyInit(n int32) (rc int32) {
	if n < 0 || int(n) > len(buf) {
		return 1
	}
	defer func() {
		if r := recover(); r != nil {
			Log(Error, "policy_init panicked: "+panicString(r))
			rc = 2
		}
	}()
	cfg, err := parseObject(buf[:n])
	if err != nil {
		Log(Error, "policy.config: "+err.Error())
		return 1
	}
	if registered.Init == nil {
		if cfg.Len() != 0 {
			Log(Error, "policy.config: this plugin takes no configuration")
			return 1
		}
		return 0
	}
	if err := registered.Init(cfg); err != nil {
		Log(Error, "policy.config: "+err.Error())
		return 1
	}
	return 0
}

//go:wasmexport policy_eval
func policyEval(n int32) (res int64) {
	if n < 0 || int(n) > len(buf) {
		return -1
	}
	if registered.Decide == nil {
		Log(Error, "no plugin registered: call sdk.Register from an init function")
		return -3
	}
	defer func() {
		if r := recover(); r != nil {
			Log(Error, "Decide panicked: "+panicString(r))
			res = -2
		}
	}()
	zeroCopy = true
	defer func() { zeroCopy = false }()
	var err error
	// A package variable: a local whose address goes to Decide would be
	// moved to the heap, one allocation per call.
	if input, err = ParseInput(buf[:n]); err != nil {
		Log(Error, "input: "+err.Error())
		return -1
	}
	d := registered.Decide(&input)
	out = d.AppendJSON(out[:0])
	if len(out) == 0 {
		return -1
	}
	ptr := uintptr(unsafe.Pointer(unsafe.SliceData(out)))
	return int64(ptr)<<32 | int64(len(out))
}

func panicString(r any) string {
	switch v := r.(type) {
	case string:
		return v
	case error:
		return v.Error()
	}
	return "(non-string panic value)"
}

//go:wasmimport edge log
func edgeLog(level int32, ptr unsafe.Pointer, n int32)

func hostLog(level Level, msg string) {
	if len(msg) == 0 {
		return
	}
	edgeLog(int32(level), unsafe.Pointer(unsafe.StringData(msg)), int32(len(msg)))
}
