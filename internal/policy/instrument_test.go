package policy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstrumentEveryLoop: after instrument, every loop head is followed
// by the fuel check, and every function that calls starts with it unless
// it reaches a loop head first through straight-line code; in every test
// plugin (Go, C and WAT). wasm2wat checks the result is a valid module.
func TestInstrumentEveryLoop(t *testing.T) {
	for _, name := range []string{"range-limit", "range-limit-c", "goloop", "loop", "recurse", "start_loop", "echo"} {
		t.Run(name, func(t *testing.T) {
			bin, err := os.ReadFile(pluginPath(t, name))
			if err != nil {
				t.Fatal(err)
			}
			ins, err := instrument(bin, 1024)
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "out.wasm")
			os.WriteFile(out, ins.binary, 0o644)
			wat, err := exec.Command("wasm2wat", out).CombinedOutput()
			if err != nil {
				t.Fatalf("wasm2wat: %v: %s", err, wat)
			}
			lines := strings.Split(string(wat), "\n")
			// The two new globals are the last two.
			var nGlobals int
			for _, l := range lines {
				if strings.HasPrefix(strings.TrimSpace(l), "(global ") {
					nGlobals++
				}
			}
			fuel := fmt.Sprintf("global.get %d", nGlobals-1)
			loops, funcs := 0, 0
			for i, l := range lines {
				tl := strings.TrimSpace(l)
				isLoop := tl == "loop" || strings.HasPrefix(tl, "loop ") || strings.HasPrefix(tl, "loop;")
				isFunc := strings.HasPrefix(tl, "(func ") && !strings.Contains(tl, "(import")
				if !isLoop && !isFunc {
					continue
				}
				j := i + 1
				for isFunc && j < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[j]), "(local") {
					j++
				}
				checked := j < len(lines) && strings.TrimSpace(lines[j]) == fuel
				if isLoop {
					if !checked {
						t.Fatalf("line %d %q is not followed by %q but %q", i+1, tl, fuel, strings.TrimSpace(lines[j]))
					}
					loops++
					continue
				}
				if checked {
					funcs++
					continue
				}
				// No entry check: the function must call nothing, or reach
				// a loop through straight-line code first.
				calls, loopFirst, straight := false, false, true
				for k := j; k < len(lines); k++ {
					tk := strings.TrimSpace(lines[k])
					if strings.HasPrefix(tk, "(func ") || strings.HasPrefix(tk, "(export") || strings.HasPrefix(tk, "(table") ||
						strings.HasPrefix(tk, "(memory") || strings.HasPrefix(tk, "(global") || strings.HasPrefix(tk, "(data") || strings.HasPrefix(tk, "(elem") {
						break
					}
					op := strings.Fields(tk + " x")[0]
					switch {
					case strings.HasPrefix(op, "call") || strings.HasPrefix(op, "return_call"):
						calls, straight = true, false
					case op == "loop":
						if straight {
							loopFirst = true
						}
					case op == "block" || op == "nop" || op == "drop" || op == "select" || strings.HasPrefix(op, "local.") ||
						strings.HasPrefix(op, "global.") || strings.Contains(op, ".load") || strings.Contains(op, ".store") ||
						strings.Contains(op, ".const") || (strings.Contains(op, ".") && !strings.HasPrefix(op, "memory.") && !strings.HasPrefix(op, "table.") && !strings.HasPrefix(op, "ref.")):
					default:
						straight = false
					}
				}
				if calls && !loopFirst {
					t.Fatalf("line %d: function %q calls, without a check at its entry", i+1, tl)
				}
			}
			if loops != ins.loops || funcs != ins.funcs {
				t.Fatalf("wasm2wat shows %d loops and %d functions instrumented, instrument says %d and %d", loops, funcs, ins.loops, ins.funcs)
			}
			if !bytes.Contains(wat, []byte(`(export "`+interruptExport+`" (global`)) {
				t.Fatal("interrupt global not exported")
			}
			if strings.Contains(string(wat), "(start ") {
				t.Fatal("start section left in")
			}
			if ins.hasStart != (name == "start_loop") {
				t.Fatalf("hasStart = %v", ins.hasStart)
			}
			t.Logf("%d functions, %d loops; %d -> %d bytes", funcs, loops, len(bin), len(ins.binary))
		})
	}
}

func TestInstrumentRejects(t *testing.T) {
	for _, c := range []struct {
		name string
		bin  []byte
		want string
	}{
		{"empty", nil, "not a WebAssembly binary"},
		{"component", []byte("\x00asm\x0d\x00\x01\x00"), "not a core module"},
		{"truncated section", []byte("\x00asm\x01\x00\x00\x00\x01\x10\x00"), "unexpected end"},
		{"no memory", []byte("\x00asm\x01\x00\x00\x00"), "defines no memory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := instrument(c.bin, 16)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("instrument = %v, want %q", err, c.want)
			}
		})
	}
}
