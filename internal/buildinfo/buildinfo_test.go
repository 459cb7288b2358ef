package buildinfo

import (
	"runtime"
	"strings"
	"testing"
)

func TestLine(t *testing.T) {
	cases := []struct {
		name, version, commit, date string
		want                        string
	}{
		{"given", "1.2.0", "13c51ed", "2026-12-01T14:14:00Z", "edge-agent 1.2.0 (commit 13c51ed, built 2026-12-01T14:14:00Z) "},
		{"empty date", "1.2.0", "13c51ed", "", "edge-agent 1.2.0 (commit 13c51ed, built unknown) "},
		{"empty version", "", "13c51ed", "d", "edge-agent unknown (commit 13c51ed, built d) "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Line("edge-agent", tc.version, tc.commit, tc.date)
			want := tc.want + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
			if got != want {
				t.Fatalf("got  %q\nwant %q", got, want)
			}
		})
	}
	// Without an injected commit the test binary (built with
	// -buildvcs=false or not) says something, never an empty field.
	if got := Line("x", "v", "", "d"); strings.Contains(got, "commit ,") {
		t.Fatalf("empty commit field: %q", got)
	}
}
