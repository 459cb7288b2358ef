package policy

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/tetratelabs/wazero"
)

// dataSection encodes active segments of memory 0 at i32.const offsets.
func dataSection(segs ...any) []byte {
	b := appendU32(nil, uint32(len(segs)/2))
	for i := 0; i < len(segs); i += 2 {
		b = append(b, 0x00, 0x41)
		b = appendS32(b, int32(segs[i].(int)))
		b = append(b, 0x0B)
		b = appendName(b, segs[i+1].(string))
	}
	return b
}

func TestMergeData(t *testing.T) {
	zeros := func(n int) string { return string(make([]byte, n)) }
	passive := append(appendU32(nil, 2), 0x01, 0x01, 'a', 0x00, 0x41, 0x08, 0x0B, 0x01, 'b')
	cases := []struct {
		name      string
		in        []byte
		dataCount bool
		want      []byte // nil: unchanged
	}{
		{"out of order, close together: one segment", dataSection(16, "cd", 8, "ab", 100, "z"), false,
			dataSection(8, "ab"+zeros(6)+"cd"+zeros(82)+"z")},
		{"adjacent", dataSection(0, "ab", 2, "cd"), false, dataSection(0, "abcd")},
		{"a page apart: two runs", dataSection(0, "a", 1, "b", 2+4096, "c"), false, dataSection(0, "ab", 4098, "c")},
		{"just under a page apart: one", dataSection(0, "a", 1+4095, "b"), false, dataSection(0, "a"+zeros(4095)+"b")},
		{"every one far apart: unchanged", dataSection(0, "a", 10000, "b"), false, nil},
		{"overlapping: unchanged", dataSection(0, "abc", 2, "x"), false, nil},
		{"empty segment: unchanged", dataSection(0, "a", 4, ""), false, nil},
		{"passive segment: unchanged", passive, false, nil},
		{"data count section: unchanged", dataSection(0, "a", 1, "b"), true, nil},
		{"negative offset (a huge u32), far apart: unchanged", dataSection(-8, "a", 0, "b"), false, nil},
		{"truncated: unchanged", dataSection(0, "a", 1, "b")[:5], false, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := mergeData(tc.in, tc.dataCount)
			want := tc.want
			if want == nil {
				want = tc.in
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("got  %x\nwant %x", got, want)
			}
		})
	}
}

// TestMergedDataInstantiatesTheSame: a real Go plugin (26,780 data
// segments) and its instrumented binary (merged into a few) leave the same
// bytes in memory when instantiated.
func TestMergedDataInstantiatesTheSame(t *testing.T) {
	bin, err := os.ReadFile(pluginPath(t, "range-limit"))
	if err != nil {
		t.Fatal(err)
	}
	ins, err := instrument(bin, DefaultLimits().pages())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	e, err := newEngine(ctx, "", quiet, false)
	if err != nil {
		t.Fatal(err)
	}
	defer e.close(ctx)
	memory := func(b []byte) []byte {
		cm, err := e.rt.CompileModule(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		mod, err := e.rt.InstantiateModule(ctx, cm, wazero.NewModuleConfig().WithName("").WithStartFunctions())
		if err != nil {
			t.Fatal(err)
		}
		defer mod.Close(ctx)
		m, _ := mod.Memory().Read(0, mod.Memory().Size())
		return bytes.Clone(m)
	}
	raw, merged := memory(bin), memory(ins.binary)
	if len(raw) < 1<<20 || !bytes.Equal(raw, merged) {
		t.Fatalf("memory after instantiation differs (%d and %d bytes)", len(raw), len(merged))
	}
	before, after := dataSegments(t, bin), dataSegments(t, ins.binary)
	if before < 1000 || after > 10 {
		t.Fatalf("%d data segments before, %d after: not merged", before, after)
	}
	t.Logf("%d data segments merged into %d", before, after)
}

// dataSegments counts the segments of a module's data section.
func dataSegments(t *testing.T, bin []byte) uint32 {
	r := &reader{b: bin, off: 8}
	for !r.done() {
		id := r.byte()
		body := r.bytes(int(r.u32()))
		if id == secData {
			return (&reader{b: body}).u32()
		}
	}
	t.Fatalf("no data section (%v)", r.err)
	return 0
}
