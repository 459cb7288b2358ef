package policy

import (
	"cmp"
	"slices"
)

// mergeGap is the largest run of bytes between two data segments that
// mergeData fills with zeros to join them: less than a page, so a merged
// segment never writes a page of memory that the original segments leave
// untouched (both neighbours of such a gap write to the pages it spans).
const mergeGap = 4095

// mergeData rewrites a data section so that its segments, sorted by
// offset, become one segment per run of segments less than mergeGap bytes
// apart, the bytes between them zero: what the fresh memory they land in
// holds anyway. Go's linker emits tens of thousands of small segments
// (26,780 holding 650 KB for range-limit), and wazero keeps every decoded
// segment, with about 90 bytes of bookkeeping each, for as long as the
// module is loaded: merged, one Go plugin's decoded data takes about
// 1.1 MiB of the agent's heap instead of 2.6 (BENCHMARKS.md, "footprint").
//
// Only the plain shape is merged: every segment active, in memory 0, at an
// i32.const offset, with at least one byte, none overlapping another, and
// no data count section (so no instruction names a segment). Anything else
// is returned unchanged, as is a section whose merge would not make fewer
// segments. Instantiation then writes the same bytes and fails the same
// way (a merged segment ends where the last of its segments ended).
func mergeData(body []byte, hasDataCount bool) []byte {
	if hasDataCount {
		return body
	}
	type seg struct {
		off  uint32
		data []byte
	}
	r := &reader{b: body}
	n := r.u32()
	if r.err != nil || n < 2 || uint64(n) > uint64(len(body)) {
		return body
	}
	segs := make([]seg, 0, n)
	for i := uint32(0); i < n; i++ {
		if r.u32() != 0 || r.byte() != 0x41 { // active, memory 0; i32.const
			return body
		}
		off, ok := r.s32()
		if !ok || r.byte() != 0x0B { // end
			return body
		}
		data := r.bytes(int(r.u32()))
		if r.err != nil || len(data) == 0 {
			return body
		}
		segs = append(segs, seg{uint32(off), data})
	}
	if !r.done() || r.off != len(body) {
		return body
	}
	slices.SortStableFunc(segs, func(a, b seg) int { return cmp.Compare(a.off, b.off) })
	end := func(s seg) uint64 { return uint64(s.off) + uint64(len(s.data)) }
	runs := 1
	for i := 1; i < len(segs); i++ {
		switch prev := end(segs[i-1]); {
		case uint64(segs[i].off) < prev:
			return body // overlapping: the order of writes matters
		case uint64(segs[i].off)-prev > mergeGap:
			runs++
		}
	}
	if runs == len(segs) {
		return body
	}
	out := appendU32(make([]byte, 0, len(body)), uint32(runs))
	for i := 0; i < len(segs); {
		j := i + 1
		for j < len(segs) && uint64(segs[j].off)-end(segs[j-1]) <= mergeGap {
			j++
		}
		size := end(segs[j-1]) - uint64(segs[i].off)
		out = append(out, 0x00, 0x41)
		out = appendS32(out, int32(segs[i].off))
		out = append(out, 0x0B)
		out = appendU32(out, uint32(size))
		start := len(out)
		out = append(out, make([]byte, size)...)
		for _, s := range segs[i:j] {
			copy(out[start+int(s.off-segs[i].off):], s.data)
		}
		i = j
	}
	return out
}

// s32 reads a signed LEB128 of at most 5 bytes.
func (r *reader) s32() (int32, bool) {
	var v int64
	var shift uint
	for i := 0; i < 5; i++ {
		c := r.byte()
		if r.err != nil {
			return 0, false
		}
		v |= int64(c&0x7F) << shift
		shift += 7
		if c&0x80 == 0 {
			if c&0x40 != 0 {
				v |= -1 << shift
			}
			return int32(v), v >= -1<<31 && v < 1<<31
		}
	}
	return 0, false
}
