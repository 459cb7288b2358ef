package main

import (
	"strings"
	"testing"
)

// The fleet's usage errors: send without --gateway needs --etcd to look
// the device up, and --etcd alone is no fence source; fleet needs --etcd.
// (The look-up and the fleet listing against real agents: e2e
// TestFleetDirectory.)
func TestFleetUsageErrors(t *testing.T) {
	base := []string{"send", "--broker", "tcp://127.0.0.1:1", "--device", "pump-7", "--action", "set"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no gateway and no etcd", append(base, "--fence", "3"), "--gateway is required (or --etcd, to look the device's gateway up)"},
		{"etcd for the look-up is no fence", append(base, "--etcd", "http://127.0.0.1:1"), "give --fence N"},
		{"look-up with fence and lock", append(base, "--etcd", "http://127.0.0.1:1", "--fence", "3", "--lock", "l"), "not both"},
		{"empty directory prefix", append(base, "--etcd", "http://127.0.0.1:1", "--fence", "3", "--directory-prefix", ""), "--directory-prefix must not be empty"},
		{"empty broker node", []string{"send", "--broker", "tcp://n1:1,", "--gateway", "g", "--device", "d", "--action", "set", "--fence", "1"}, "an empty URL in the list"},
		{"fleet without etcd", []string{"fleet"}, "--etcd is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCLI(tc.args...)
			if code != 2 || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, stderr, tc.want)
			}
		})
	}
}
