package main

import (
	"bytes"
	"embed"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/edge-agent/edge-agent/internal/chaos"
)

// The deliberate bugs that prove the campaign catches a broken agent are
// patches (mutants/NAME.patch: a line saying what the bug breaks, then a
// unified diff against the repository): no normal source refers to them.
// A mutant agent is built with go build -overlay, its patched files in a
// temporary directory standing in for the originals; the tree itself is
// never changed. TestMutantPatchesApply (make test) shows that every patch
// still applies to the current sources and that they still compile.
//
//go:embed mutants/*.patch
var mutantPatches embed.FS

// mutant is one deliberate bug.
type mutant struct {
	name  string // the patch's file name without .patch
	what  string // its first line
	patch []byte
}

// ha reports whether the mutant's bug is the pair's (its name begins with
// ha_): it is run with the standby pair's campaign (-ha).
func (m mutant) ha() bool { return strings.HasPrefix(m.name, "ha_") }

// mutants lists every mutant, by name.
func mutants() []mutant {
	entries, err := mutantPatches.ReadDir("mutants")
	if err != nil {
		panic(err) // embedded: cannot fail
	}
	var out []mutant
	for _, e := range entries {
		b, err := mutantPatches.ReadFile(path.Join("mutants", e.Name()))
		if err != nil {
			panic(err)
		}
		what, _, _ := bytes.Cut(b, []byte("\n"))
		out = append(out, mutant{name: strings.TrimSuffix(e.Name(), ".patch"), what: string(what), patch: b})
	}
	return out
}

// files are the repository paths the patch changes.
func (m mutant) files() []string {
	var out []string
	for _, l := range strings.Split(string(m.patch), "\n") {
		if p, ok := strings.CutPrefix(l, "+++ b/"); ok {
			out = append(out, strings.TrimSpace(p))
		}
	}
	return out
}

// overlay applies the mutant's patch to copies of the files it changes
// (from the repository at root) in dir, and writes a go build -overlay
// file that puts them in place of the originals. It returns the overlay
// file's path and the packages (./dir) the patch changes.
func (m mutant) overlay(root, dir string) (string, []string, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return "", nil, err
	}
	src := filepath.Join(dir, "src")
	files := m.files()
	if len(files) == 0 {
		return "", nil, fmt.Errorf("mutant %s: the patch changes no file", m.name)
	}
	replace := map[string]string{}
	var pkgs []string
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return "", nil, fmt.Errorf("mutant %s: %w", m.name, err)
		}
		dst := filepath.Join(src, f)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return "", nil, err
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			return "", nil, err
		}
		replace[filepath.Join(root, f)] = dst
		if p := "./" + path.Dir(f); !slices.Contains(pkgs, p) {
			pkgs = append(pkgs, p)
		}
	}
	// git apply outside a repository is a plain patch(1): it changes the
	// copies in src, and fails when a hunk's context is not found.
	cmd := exec.Command("git", "apply", "-p1", "-")
	cmd.Dir, cmd.Stdin = src, bytes.NewReader(m.patch)
	cmd.Env = append(os.Environ(), "GIT_CEILING_DIRECTORIES="+filepath.Dir(src))
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("mutant %s: the patch no longer applies to %s (regenerate it: docs/testing.md, \"Mutants\"): %v\n%s", m.name, strings.Join(files, ", "), err, out)
	}
	b, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		return "", nil, err
	}
	ov := filepath.Join(dir, "overlay.json")
	return ov, pkgs, os.WriteFile(ov, b, 0o644)
}

// mutantsCmd builds the agent with each mutant and runs the campaign
// against it with a fixed seed (a mutant of the pair, ha_*, with -ha):
// each must end with violations. It prints a
// line per mutant and `caught K/N`; exit 0 only when every mutant was
// caught.
func mutantsCmd(args []string) int {
	fs := flag.NewFlagSet("edge-chaos mutants", flag.ContinueOnError)
	var o options
	finish := campaignFlags(fs, &o)
	only := fs.String("only", "", "comma-separated mutant names to run (default: all)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := finish(); err != nil {
		fmt.Fprintf(os.Stderr, "edge-chaos: %v\n", err)
		return 2
	}
	if o.agentBin != "" {
		fmt.Fprintln(os.Stderr, "edge-chaos mutants: -agent is not for mutants (each mutant is built)")
		return 2
	}
	all := mutants()
	ms := all
	if *only != "" {
		ms = nil
		for _, n := range strings.Split(*only, ",") {
			i := slices.IndexFunc(all, func(m mutant) bool { return m.name == n })
			if i < 0 {
				fmt.Fprintf(os.Stderr, "edge-chaos mutants: -only: no mutant %q (cmd/edge-chaos/mutants/)\n", n)
				return 2
			}
			ms = append(ms, all[i])
		}
	}
	base := o.out
	if base == "" {
		d, err := os.MkdirTemp("", "edge-chaos-mutants-")
		if err != nil {
			fmt.Fprintf(os.Stderr, "edge-chaos: %v\n", err)
			return 3
		}
		base = d
	}
	caught := 0
	for _, m := range ms {
		mo := o
		mo.mutant, mo.out = m.name, filepath.Join(base, m.name)
		mo.ha = o.ha || m.ha()
		logPath := filepath.Join(base, m.name+".log")
		if err := os.MkdirAll(filepath.Join(base, m.name+"-src"), 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "edge-chaos: %v\n", err)
			return 3
		}
		ov, _, err := m.overlay(".", filepath.Join(base, m.name+"-src"))
		if err != nil {
			fmt.Printf("%-16s could not build: %v\n", m.name, err)
			continue
		}
		mo.overlay = ov
		lf, err := os.Create(logPath)
		if err != nil {
			fmt.Fprintf(os.Stderr, "edge-chaos: %v\n", err)
			return 3
		}
		mo.log = lf
		pair := ""
		if mo.ha {
			pair = ", the standby pair"
		}
		fmt.Printf("%-16s running (%s; seed %d, %v of faults%s; progress in %s)\n", m.name, m.what, o.seed, o.duration, pair, logPath)
		start := time.Now()
		res, dir, err := runCampaign(mo)
		took := time.Since(start).Round(time.Second)
		if err != nil {
			lf.Close()
			fmt.Printf("%-16s could not run: %v\n", m.name, err)
			continue
		}
		if h, herr := chaos.LoadHistory(dir); herr == nil {
			report(lf, h, res, dir)
		}
		lf.Close()
		if len(res.Violations) == 0 {
			fmt.Printf("%-16s NOT caught in %v: violations: 0 (history in %s)\n", m.name, took, dir)
			continue
		}
		caught++
		by := map[string]int{}
		for _, v := range res.Violations {
			by[v.Check]++
		}
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(by)) {
			parts = append(parts, fmt.Sprintf("%s %d", k, by[k]))
		}
		sort.Strings(parts)
		fmt.Printf("%-16s caught in %v: violations: %d (%s); first: %s\n", m.name, took, len(res.Violations), strings.Join(parts, ", "), res.Violations[0].Msg)
	}
	fmt.Printf("caught %d/%d\n", caught, len(ms))
	if caught != len(ms) {
		return 1
	}
	if o.out == "" && !o.keep {
		os.RemoveAll(base)
	}
	return 0
}
