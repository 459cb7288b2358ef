package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Every mutant's patch still applies to the current sources, changes
// them, and the patched packages compile: a patch cannot rot unnoticed
// while the code around its bug moves.
func TestMutantPatchesApply(t *testing.T) {
	ms := mutants()
	if len(ms) != 8 {
		t.Errorf("%d mutants, want 8", len(ms))
	}
	for _, m := range ms {
		t.Run(m.name, func(t *testing.T) {
			if m.what == "" || strings.HasPrefix(m.what, "---") {
				t.Errorf("the patch does not begin with a line saying what the bug breaks")
			}
			dir := t.TempDir()
			ov, pkgs, err := m.overlay("../..", dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range m.files() {
				orig, err := os.ReadFile(filepath.Join("../..", f))
				if err != nil {
					t.Fatal(err)
				}
				patched, err := os.ReadFile(filepath.Join(dir, "src", f))
				if err != nil {
					t.Fatal(err)
				}
				if string(orig) == string(patched) {
					t.Errorf("%s: the patch changed nothing", f)
				}
				if strings.Contains(string(orig), "mutant "+m.name) {
					t.Errorf("%s already has the mutant %s", f, m.name)
				}
			}
			cmd := exec.Command("go", append([]string{"build", "-tags", "failpoints", "-overlay", ov}, pkgs...)...)
			cmd.Dir = "../.."
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("the patched %v do not compile: %v\n%s", pkgs, err, out)
			}
		})
	}
}
