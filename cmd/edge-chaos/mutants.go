package main

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/edge-agent/edge-agent/internal/mutant"
)

// mutantsCmd builds the agent with each deliberate bug of internal/mutant
// and runs the campaign against it with a fixed seed: each must end with
// violations. It prints a line per mutant and `caught K/N`; exit 0 only
// when every mutant was caught.
func mutantsCmd(args []string) int {
	fs := flag.NewFlagSet("edge-chaos mutants", flag.ContinueOnError)
	var o options
	finish := campaignFlags(fs, &o)
	only := fs.String("only", "", "comma-separated mutant tags to run (default: all)")
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
	tags := mutant.Tags
	if *only != "" {
		tags = strings.Split(*only, ",")
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
	for _, tag := range tags {
		mo := o
		mo.tags, mo.out = tag, filepath.Join(base, tag)
		logPath := filepath.Join(base, tag+".log")
		if err := os.MkdirAll(base, 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "edge-chaos: %v\n", err)
			return 3
		}
		lf, err := os.Create(logPath)
		if err != nil {
			fmt.Fprintf(os.Stderr, "edge-chaos: %v\n", err)
			return 3
		}
		mo.log = lf
		fmt.Printf("%-24s running (seed %d, %v of faults; progress in %s)\n", tag, o.seed, o.duration, logPath)
		start := time.Now()
		res, dir, err := runCampaign(mo)
		took := time.Since(start).Round(time.Second)
		if err != nil {
			lf.Close()
			fmt.Printf("%-24s could not run: %v\n", tag, err)
			continue
		}
		if h, herr := loadHistory(dir); herr == nil {
			report(lf, h, res, dir)
		}
		lf.Close()
		if len(res.Violations) == 0 {
			fmt.Printf("%-24s NOT caught in %v: violations: 0 (history in %s)\n", tag, took, dir)
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
		fmt.Printf("%-24s caught in %v: violations: %d (%s); first: %s\n", tag, took, len(res.Violations), strings.Join(parts, ", "), res.Violations[0].Msg)
	}
	fmt.Printf("caught %d/%d\n", caught, len(tags))
	if caught != len(tags) {
		return 1
	}
	if o.out == "" && !o.keep {
		os.RemoveAll(base)
	}
	return 0
}
