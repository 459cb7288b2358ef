package policy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// This file rewrites a plugin's binary before it is compiled, so that the
// host can stop a runaway call cheaply. See docs/plugins.md ("How a runaway
// plugin is stopped") and BENCHMARKS.md ("Policy plugins") for the measurements.
//
// Why: wazero's RuntimeConfig.WithCloseOnContextDone compiles a call to a Go
// trampoline (ExitCodeCheckModuleExitCode: a full exit from native code to
// Go and back) at the head of every wasm loop, and starts a goroutine per
// call. The Go toolchain puts a `loop` at the entry of almost every function
// it emits (its resumption points), so a Go guest pays that exit on nearly
// every call it makes: several times slower per policy call. Without that
// option nothing in wazero interrupts native code at all: closing the module
// from another goroutine is only noticed at those trampolines.
//
// There is a second reason guest code must leave native code now and then,
// which a plain "check a flag" would miss: native code has no Go safe
// points. A goroutine spinning in wasm blocks every stop-the-world of the
// Go runtime (GC mark termination waits for it in forEachP), and with the
// world half-stopped the timer that would interrupt the guest never runs:
// the whole process hangs. (Found the hard way: the first version of this
// file only checked a flag.)
//
// What: instrument adds two mutable i32 globals, $interrupt (exported as
// interruptExport, set to 1 by the host's timer) and $fuel, and puts this
// at the head of every loop and at the entry of every function that could
// otherwise call without passing a loop head (see instrumentFunc):
//
//	global.get $fuel  i32.const 1  i32.sub  global.set $fuel
//	global.get $fuel  i32.eqz
//	if
//	  i32.const 0  memory.grow 0  drop      ;; an exit to Go: a safe point
//	  i32.const fuelPerYield  global.set $fuel
//	  global.get $interrupt
//	  if  unreachable  end
//	end
//
// The common path is a decrement and a not-taken branch in native code.
// Every fuelPerYield loop iterations or calls, memory.grow(0) (which wazevo
// always runs in Go: ExitCodeGrowMemory) gives the Go scheduler and GC a
// safe point, and the interrupt flag is tested. Every path that runs for
// long passes loop heads or function entries (straight-line code is bounded
// by the code size), so a guest is stopped within fuelPerYield steps of the
// host setting $interrupt, and never holds up a stop-the-world for longer.
// $interrupt only ever goes 0 -> 1 on an instance (a torn read sees 0 or 1),
// and the instance is thrown away after the trap. Guest code cannot touch
// either global: they did not exist when the guest was validated, so no
// instruction of the original module can name them.
//
// It also:
//   - merges the data segments that lie close together (mergeData), so
//     that wazero keeps a few large ones instead of thousands of small
//     ones;
//   - lowers (or sets) the maximum of the defined memory to the plugin's
//     memory limit, so memory.grow beyond the cap fails inside the guest:
//     one runtime serves every limit;
//   - turns a `start` section into an export (startExport), so the host runs
//     it under the same deadline instead of inside InstantiateModule, where
//     nothing could interrupt it.
//
// The walker knows every instruction of the features wazero compiles (MVP,
// sign extension, saturating truncation, bulk memory, reference types,
// multi-value, SIMD, tail calls, threads, exception handling). An opcode it
// does not know makes the plugin fail to load: it never passes a body it
// could not instrument.

// fuelPerYield is the number of loop iterations and function entries
// between two exits to Go (about 100ns each; a few to a few tens of
// microseconds of guest work apart).
const fuelPerYield = 1 << 13

const (
	// interruptExport names the global the host sets to stop a call.
	interruptExport = "__edge_interrupt"
	// startExport names the former start function, when there was one.
	startExport = "__edge_start"
)

// errInstrument is wrapped by every error of instrument.
var errInstrument = errors.New("policy: cannot instrument module")

const (
	secCustom   = 0
	secType     = 1
	secImport   = 2
	secFunction = 3
	secTable    = 4
	secMemory   = 5
	secGlobal   = 6
	secExport   = 7
	secStart    = 8
	secElement  = 9
	secCode     = 10
	secData     = 11
	secDataCnt  = 12
	secTag      = 13
)

// sectionOrder is the position of each known section in a valid module.
var sectionOrder = map[byte]int{
	secType: 1, secImport: 2, secFunction: 3, secTable: 4, secMemory: 5,
	secTag: 6, secGlobal: 7, secExport: 8, secStart: 9, secElement: 10,
	secDataCnt: 11, secCode: 12, secData: 13,
}

type section struct {
	id   byte
	body []byte
}

// instrumented is what instrument returns.
type instrumented struct {
	binary   []byte
	hasStart bool // the module had a start section, now exported as startExport
	loops    int  // loop heads instrumented
	funcs    int  // function entries instrumented
}

// instrument rewrites bin as described above. memPages is the memory cap
// in 64 KiB pages.
func instrument(bin []byte, memPages uint32) (*instrumented, error) {
	if len(bin) < 8 || string(bin[:4]) != "\x00asm" {
		return nil, fmt.Errorf("%w: not a WebAssembly binary", errInstrument)
	}
	if binary.LittleEndian.Uint32(bin[4:8]) != 1 {
		return nil, fmt.Errorf("%w: not a core module (version %d)", errInstrument, binary.LittleEndian.Uint32(bin[4:8]))
	}
	var secs []section
	r := &reader{b: bin, off: 8}
	for !r.done() {
		id := r.byte()
		size := r.u32()
		body := r.bytes(int(size))
		if r.err != nil {
			return nil, fmt.Errorf("%w: section %d: %v", errInstrument, id, r.err)
		}
		secs = append(secs, section{id: id, body: body})
	}

	var importedGlobals, definedGlobals uint32
	var importedMemory, definedMemory bool
	startIdx := -1
	var startFunc uint32
	for i, s := range secs {
		switch s.id {
		case secImport:
			g, mem, err := scanImports(s.body)
			if err != nil {
				return nil, err
			}
			importedGlobals, importedMemory = g, mem
		case secGlobal:
			sr := &reader{b: s.body}
			definedGlobals = sr.u32()
			if sr.err != nil {
				return nil, fmt.Errorf("%w: global section: %v", errInstrument, sr.err)
			}
		case secStart:
			sr := &reader{b: s.body}
			startFunc = sr.u32()
			if sr.err != nil {
				return nil, fmt.Errorf("%w: start section: %v", errInstrument, sr.err)
			}
			startIdx = i
		case secExport:
			if err := checkExportNames(s.body); err != nil {
				return nil, err
			}
		case secMemory:
			sr := &reader{b: s.body}
			definedMemory = sr.u32() > 0
		}
	}
	if importedMemory {
		return nil, fmt.Errorf("%w: the module imports its memory; a plugin must define and export it", errInstrument)
	}
	if !definedMemory {
		return nil, fmt.Errorf("%w: the module defines no memory", errInstrument)
	}
	gIdx := importedGlobals + definedGlobals // $interrupt; $fuel is gIdx+1
	fIdx := gIdx + 1
	out := &instrumented{hasStart: startIdx >= 0}

	// New globals: $interrupt (mut i32) (i32.const 0), $fuel (mut i32) (i32.const fuelPerYield).
	newGlobal := []byte{0x7F, 0x01, 0x41, 0x00, 0x0B, 0x7F, 0x01, 0x41}
	newGlobal = appendS32(newGlobal, fuelPerYield)
	newGlobal = append(newGlobal, 0x0B)
	// New exports: the interrupt global, and the former start function.
	newExports := appendName(nil, interruptExport)
	newExports = append(newExports, 0x03)
	newExports = appendU32(newExports, gIdx)
	nExports := uint32(1)
	if startIdx >= 0 {
		newExports = appendName(newExports, startExport)
		newExports = append(newExports, 0x00)
		newExports = appendU32(newExports, startFunc)
		nExports++
	}

	var check []byte
	check = append(check, 0x23)
	check = appendU32(check, fIdx) // global.get $fuel
	check = append(check, 0x41, 0x01, 0x6B, 0x24)
	check = appendU32(check, fIdx) // i32.const 1, i32.sub, global.set $fuel
	check = append(check, 0x23)
	check = appendU32(check, fIdx)                      // global.get $fuel
	check = append(check, 0x45, 0x04, 0x40)             // i32.eqz, if
	check = append(check, 0x41, 0x00, 0x40, 0x00, 0x1A) // i32.const 0, memory.grow 0, drop
	check = append(check, 0x41)
	check = appendS32(check, fuelPerYield) // i32.const fuelPerYield
	check = append(check, 0x24)
	check = appendU32(check, fIdx) // global.set $fuel
	check = append(check, 0x23)
	check = appendU32(check, gIdx)                // global.get $interrupt
	check = append(check, 0x04, 0x40, 0x00, 0x0B) // if, unreachable, end
	check = append(check, 0x0B)                   // end

	hasDataCount := false
	for _, s := range secs {
		hasDataCount = hasDataCount || s.id == secDataCnt
	}
	var sawGlobal, sawExport bool
	result := make([]section, 0, len(secs)+2)
	for i, s := range secs {
		switch s.id {
		case secStart:
			continue // dropped: exported instead
		case secMemory:
			body, err := capMemory(s.body, memPages)
			if err != nil {
				return nil, err
			}
			s.body = body
		case secGlobal:
			sawGlobal = true
			s.body = appendVec(s.body, 2, newGlobal)
		case secExport:
			sawExport = true
			s.body = appendVec(s.body, nExports, newExports)
		case secData:
			s.body = mergeData(s.body, hasDataCount)
		case secCode:
			if benchNoDeadline {
				check = nil
			}
			body, err := instrumentCode(s.body, check, out)
			if err != nil {
				return nil, err
			}
			s.body = body
		}
		_ = i
		result = append(result, s)
	}
	if !sawGlobal {
		result = insertSection(result, section{id: secGlobal, body: append([]byte{2}, newGlobal...)})
	}
	if !sawExport {
		result = insertSection(result, section{id: secExport, body: append(appendU32(nil, nExports), newExports...)})
	}

	size := 8
	for _, s := range result {
		size += 1 + 5 + len(s.body)
	}
	b := make([]byte, 0, size)
	b = append(b, bin[:8]...)
	for _, s := range result {
		b = append(b, s.id)
		b = appendU32(b, uint32(len(s.body)))
		b = append(b, s.body...)
	}
	out.binary = b
	return out, nil
}

// insertSection puts s before the first known section that must follow it.
func insertSection(secs []section, s section) []section {
	pos := len(secs)
	for i, x := range secs {
		if x.id != secCustom && sectionOrder[x.id] > sectionOrder[s.id] {
			pos = i
			break
		}
	}
	secs = append(secs, section{})
	copy(secs[pos+1:], secs[pos:])
	secs[pos] = s
	return secs
}

// appendVec adds n entries (already encoded in entries) to a vector section.
func appendVec(body []byte, n uint32, entries []byte) []byte {
	r := &reader{b: body}
	count := r.u32()
	rest := body[r.off:]
	out := appendU32(nil, count+n)
	out = append(out, rest...)
	return append(out, entries...)
}

func scanImports(body []byte) (globals uint32, memory bool, err error) {
	r := &reader{b: body}
	n := r.u32()
	for i := uint32(0); i < n && r.err == nil; i++ {
		r.name()
		r.name()
		switch kind := r.byte(); kind {
		case 0x00: // func
			r.u32()
		case 0x01: // table
			r.valtype()
			r.limits()
		case 0x02: // memory
			r.limits()
			memory = true
		case 0x03: // global
			r.valtype()
			r.byte()
			globals++
		case 0x04: // tag
			r.byte()
			r.u32()
		default:
			return 0, false, fmt.Errorf("%w: import of unknown kind 0x%02x", errInstrument, kind)
		}
	}
	if r.err != nil {
		return 0, false, fmt.Errorf("%w: import section: %v", errInstrument, r.err)
	}
	return globals, memory, nil
}

func checkExportNames(body []byte) error {
	r := &reader{b: body}
	n := r.u32()
	for i := uint32(0); i < n && r.err == nil; i++ {
		name := r.name()
		r.byte()
		r.u32()
		if name == interruptExport || name == startExport {
			return fmt.Errorf("%w: export name %q is reserved for the host", errInstrument, name)
		}
	}
	if r.err != nil {
		return fmt.Errorf("%w: export section: %v", errInstrument, r.err)
	}
	return nil
}

// capMemory sets the maximum of each defined memory to at most pages.
func capMemory(body []byte, pages uint32) ([]byte, error) {
	r := &reader{b: body}
	n := r.u32()
	out := appendU32(nil, n)
	for i := uint32(0); i < n; i++ {
		flags := r.byte()
		if flags&0x04 != 0 {
			return nil, fmt.Errorf("%w: 64-bit memories are not supported", errInstrument)
		}
		min := r.u32()
		max := uint32(math.MaxUint32)
		if flags&0x01 != 0 {
			max = r.u32()
		}
		if r.err != nil {
			return nil, fmt.Errorf("%w: memory section: %v", errInstrument, r.err)
		}
		if min > pages {
			return nil, fmt.Errorf("%w: %w: the module asks for %d pages of memory at start, the limit is %d", errInstrument, ErrMemoryLimit, min, pages)
		}
		if max > pages {
			max = pages
		}
		out = append(out, flags|0x01)
		out = appendU32(out, min)
		out = appendU32(out, max)
	}
	return out, nil
}

func instrumentCode(body []byte, check []byte, st *instrumented) ([]byte, error) {
	r := &reader{b: body}
	n := r.u32()
	out := make([]byte, 0, len(body)+len(body)/8)
	out = appendU32(out, n)
	var fn []byte
	for i := uint32(0); i < n; i++ {
		size := r.u32()
		code := r.bytes(int(size))
		if r.err != nil {
			return nil, fmt.Errorf("%w: code section: %v", errInstrument, r.err)
		}
		var err error
		fn, err = instrumentFunc(fn[:0], code, check, st)
		if err != nil {
			return nil, fmt.Errorf("%w: function body %d: %v", errInstrument, i, err)
		}
		out = appendU32(out, uint32(len(fn)))
		out = append(out, fn...)
	}
	if !r.done() {
		return nil, fmt.Errorf("%w: code section: trailing bytes", errInstrument)
	}
	return out, nil
}

// instrumentFunc copies one function body to out, with check after every
// loop header and, when needed, at its entry.
//
// The entry check exists to bound recursion, so it is left out where it
// cannot matter: in a function that calls nothing (it cannot recurse, and
// its loops have their own checks), and in one whose every path reaches a
// loop head before any call or branch (the Go toolchain begins nearly every
// function so: `global.get 0; local.set 1; block; loop`), where the loop's
// check runs first anyway. That halves the checks a Go guest runs per call.
func instrumentFunc(out, code, check []byte, st *instrumented) ([]byte, error) {
	r := &reader{b: code}
	groups := r.u32()
	for i := uint32(0); i < groups; i++ {
		r.u32()
		r.valtype()
	}
	if r.err != nil {
		return nil, r.err
	}
	bodyStart := r.off
	needEntry, err := entryCheckNeeded(code, bodyStart)
	if err != nil {
		return nil, err
	}
	out = append(out, code[:bodyStart]...)
	if needEntry && len(check) > 0 {
		out = append(out, check...)
		st.funcs++
	}
	last := r.off
	for !r.done() {
		op := r.byte()
		if op == 0x03 { // loop
			r.blocktype()
			if r.err != nil {
				return nil, r.err
			}
			out = append(out, code[last:r.off]...)
			out = append(out, check...)
			last = r.off
			if len(check) > 0 {
				st.loops++
			}
			continue
		}
		r.immediates(op)
		if r.err != nil {
			return nil, r.err
		}
	}
	return append(out, code[last:]...), nil
}

// entryCheckNeeded reports whether the function body at code[start:] can
// make a call without first passing a loop head.
func entryCheckNeeded(code []byte, start int) (bool, error) {
	r := &reader{b: code, off: start}
	straight := true // no branch or call seen yet
	loopFirst := false
	calls := false
	for !r.done() {
		op := r.byte()
		switch {
		case op >= 0x10 && op <= 0x13: // call, call_indirect, return_call, return_call_indirect
			calls = true
			straight = false
		case op == 0x03:
			if straight {
				loopFirst = true
			}
		case op == 0x01, op == 0x02, op == 0x1A, op == 0x1B,
			op >= 0x20 && op <= 0x24, op >= 0x28 && op <= 0xC4:
			// nop, block, drop, select, locals, globals, memory, numeric:
			// straight-line code
		default:
			straight = false
		}
		r.immediates(op)
	}
	if r.err != nil {
		return false, r.err
	}
	return calls && !loopFirst, nil
}

// reader decodes the parts of the binary format the instrumenter needs. The
// first error sticks; callers check r.err.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) done() bool { return r.err != nil || r.off >= len(r.b) }

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format+" at offset %d", append(args, r.off)...)
	}
}

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if r.off >= len(r.b) {
		r.fail("unexpected end")
		return 0
	}
	c := r.b[r.off]
	r.off++
	return c
}

func (r *reader) bytes(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || r.off+n > len(r.b) {
		r.fail("unexpected end")
		return nil
	}
	b := r.b[r.off : r.off+n]
	r.off += n
	return b
}

// leb reads an unsigned or signed LEB128 of at most maxBytes bytes.
func (r *reader) leb(maxBytes int) uint64 {
	var v uint64
	var shift uint
	for i := 0; i < maxBytes; i++ {
		c := r.byte()
		if r.err != nil {
			return 0
		}
		v |= uint64(c&0x7F) << shift
		shift += 7
		if c&0x80 == 0 {
			return v
		}
	}
	r.fail("LEB128 too long")
	return 0
}

func (r *reader) u32() uint32 { return uint32(r.leb(5)) }

func (r *reader) name() string {
	n := r.u32()
	return string(r.bytes(int(n)))
}

func (r *reader) limits() {
	flags := r.byte()
	if flags&0x04 != 0 {
		r.leb(10)
		if flags&0x01 != 0 {
			r.leb(10)
		}
		return
	}
	r.u32()
	if flags&0x01 != 0 {
		r.u32()
	}
}

// valtype reads a value type: a number, vector or reference type.
func (r *reader) valtype() {
	switch c := r.byte(); c {
	case 0x7F, 0x7E, 0x7D, 0x7C, 0x7B, 0x70, 0x6F, 0x69:
	default:
		if r.err == nil {
			r.fail("unsupported value type 0x%02x", c)
		}
	}
}

// blocktype reads a block type: empty, one value type, or a type index.
func (r *reader) blocktype() {
	if r.err != nil {
		return
	}
	if r.off >= len(r.b) {
		r.fail("unexpected end")
		return
	}
	switch r.b[r.off] {
	case 0x40, 0x7F, 0x7E, 0x7D, 0x7C, 0x7B, 0x70, 0x6F, 0x69:
		r.off++
	default:
		r.leb(5) // s33 type index
	}
}

func (r *reader) memarg() {
	align := r.u32()
	if align&0x40 != 0 { // multi-memory: a memory index follows
		r.u32()
	}
	r.leb(10)
}

// immediates skips the immediates of the instruction op.
func (r *reader) immediates(op byte) {
	switch {
	case op <= 0x01, op == 0x05, op == 0x0B, op == 0x0F, op == 0x0A, op == 0x19,
		op == 0x1A, op == 0x1B, op == 0xD1:
		// no immediates
	case op == 0x02, op == 0x03, op == 0x04, op == 0x06: // block, loop, if, try
		r.blocktype()
	case op == 0x07, op == 0x08, op == 0x09, op == 0x0C, op == 0x0D, op == 0x10,
		op == 0x12, op == 0x18, op == 0xD2,
		op >= 0x20 && op <= 0x26, op == 0x3F, op == 0x40:
		r.u32()
	case op == 0x0E: // br_table
		n := r.u32()
		for i := uint32(0); i <= n && r.err == nil; i++ {
			r.u32()
		}
	case op == 0x11, op == 0x13: // call_indirect, return_call_indirect
		r.u32()
		r.u32()
	case op == 0x1C: // select t*
		n := r.u32()
		for i := uint32(0); i < n && r.err == nil; i++ {
			r.valtype()
		}
	case op == 0x1F: // try_table
		r.blocktype()
		n := r.u32()
		for i := uint32(0); i < n && r.err == nil; i++ {
			switch kind := r.byte(); kind {
			case 0x00, 0x01:
				r.u32()
				r.u32()
			case 0x02, 0x03:
				r.u32()
			default:
				r.fail("unknown catch kind 0x%02x", kind)
			}
		}
	case op >= 0x28 && op <= 0x3E:
		r.memarg()
	case op == 0x41:
		r.leb(5)
	case op == 0x42:
		r.leb(10)
	case op == 0x43:
		r.bytes(4)
	case op == 0x44:
		r.bytes(8)
	case op >= 0x45 && op <= 0xC4:
		// numeric instructions, no immediates
	case op == 0xD0: // ref.null heaptype
		r.blocktype()
	case op == 0xFC:
		switch sub := r.u32(); {
		case sub <= 7:
		case sub == 8: // memory.init
			r.u32()
			r.u32()
		case sub == 9, sub == 11, sub == 13, sub >= 15 && sub <= 17:
			r.u32()
		case sub == 10, sub == 12, sub == 14:
			r.u32()
			r.u32()
		default:
			r.fail("unknown instruction 0xFC %d", sub)
		}
	case op == 0xFD:
		switch sub := r.u32(); {
		case sub <= 11, sub == 92, sub == 93:
			r.memarg()
		case sub == 12, sub == 13:
			r.bytes(16)
		case sub >= 21 && sub <= 34:
			r.byte()
		case sub >= 84 && sub <= 91:
			r.memarg()
			r.byte()
		case sub <= 0x113:
		default:
			r.fail("unknown instruction 0xFD %d", sub)
		}
	case op == 0xFE:
		if sub := r.u32(); sub == 0x03 {
			r.byte()
		} else {
			r.memarg()
		}
	default:
		r.fail("unknown instruction 0x%02x", op)
	}
}

func appendU32(b []byte, v uint32) []byte {
	for {
		c := byte(v & 0x7F)
		v >>= 7
		if v != 0 {
			b = append(b, c|0x80)
			continue
		}
		return append(b, c)
	}
}

// appendS32 appends a signed LEB128 (for i32.const).
func appendS32(b []byte, v int32) []byte {
	for {
		c := byte(v & 0x7F)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

func appendName(b []byte, s string) []byte {
	b = appendU32(b, uint32(len(s)))
	return append(b, s...)
}
