package main

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
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

// fleetSample is a fleet as fleet() builds it: a single gateway holding
// one write unknown, an ha pair (active and standby on one host), and a
// gateway that stopped.
func fleetSample() []*fleetGateway {
	at := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	return []*fleetGateway{
		{Gateway: "gw-a", Registered: true, Host: "box-1", PID: 11, Version: "v1.2.0", StartedAt: at, Role: "single",
			Status: "online", Online: true, HeldWrites: 1, Devices: []fleetDevice{
				{Device: "pump-1", Claimed: true, LastFence: 42, LastOpID: "op-9", State: json.RawMessage(`{"rpm":100}`)},
				{Device: "valve-1", Claimed: true, LastFence: 42, LastOpID: "op-3", State: json.RawMessage(`{"open":5}`), HeldWrites: 1},
			}},
		{Gateway: "gw-h", Registered: true, Host: "box-2", PID: 21, Version: "v1.2.0", StartedAt: at, Role: "active",
			Standbys: []fleetStandby{{Host: "box-2", PID: 22, Version: "v1.2.0", StartedAt: at}},
			Status:   "online", Online: true, Devices: []fleetDevice{{Device: "pump-h", Claimed: true, LastFence: 7, State: json.RawMessage(`{}`)}}},
		{Gateway: "gw-old", Status: "offline", Devices: []fleetDevice{}},
	}
}

// The table: each gateway's role, of a pair the active's host and pid and
// the standby's, the held writes per gateway (the sum) and per device;
// without --broker, "-" where only the retained states could tell.
func TestPrintFleetTable(t *testing.T) {
	var b strings.Builder
	if err := printFleet(&b, fleetSample(), false, true); err != nil {
		t.Fatal(err)
	}
	want := `GATEWAY  STATUS   ROLE    HOST            STANDBY         VERSION  STARTED               DEVICES  HELD
gw-a     online   single  box-1           -               v1.2.0   2026-12-04T10:00:00Z  2        1
gw-h     online   active  box-2 (pid 21)  box-2 (pid 22)  v1.2.0   2026-12-04T10:00:00Z  1        0
gw-old   offline  -       -               -               -        -                     0        0

gw-a:
  DEVICE   CLAIMED  LAST_FENCE  HELD  LAST_OP  STATE
  pump-1   true     42          0     op-9     {"rpm":100}
  valve-1  true     42          1     op-3     {"open":5}

gw-h:
  DEVICE  CLAIMED  LAST_FENCE  HELD  LAST_OP  STATE
  pump-h  true     7           0     -        {}
`
	if b.String() != want {
		t.Fatalf("table:\n%s\nwant:\n%s", b.String(), want)
	}

	b.Reset()
	if err := printFleet(&b, fleetSample(), false, false); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	for _, re := range []string{`^gw-a\s+registered\s+single\s+box-1\s+-\s+v1\.2\.0\s+\S+\s+2\s+-$`, `^gw-old\s+not registered\s`} {
		if !slices.ContainsFunc(lines, regexp.MustCompile(re).MatchString) {
			t.Errorf("without --broker, no line matches %s:\n%s", re, b.String())
		}
	}
	if !strings.Contains(b.String(), "  valve-1  true     42          -     op-3") {
		t.Errorf("without --broker, a device's held writes are not known:\n%s", b.String())
	}
}

// --json: held_writes on every gateway and device (0 too), standbys only
// for a gateway that has them, and an empty fleet is [].
func TestPrintFleetJSON(t *testing.T) {
	var b strings.Builder
	if err := printFleet(&b, fleetSample(), true, true); err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(b.String()), &rows); err != nil || len(rows) != 3 {
		t.Fatalf("%v: %s", err, b.String())
	}
	if rows[0]["held_writes"] != 1.0 || rows[0]["role"] != "single" || rows[0]["standbys"] != nil {
		t.Errorf("gw-a: %v", rows[0])
	}
	devs := rows[0]["devices"].([]any)
	if devs[0].(map[string]any)["held_writes"] != 0.0 || devs[1].(map[string]any)["held_writes"] != 1.0 {
		t.Errorf("gw-a's devices: %v", devs)
	}
	sb, _ := rows[1]["standbys"].([]any)
	if rows[1]["role"] != "active" || rows[1]["host"] != "box-2" || rows[1]["pid"] != 21.0 || len(sb) != 1 ||
		sb[0].(map[string]any)["pid"] != 22.0 || rows[1]["held_writes"] != 0.0 {
		t.Errorf("gw-h: %v", rows[1])
	}
	if _, ok := rows[2]["role"]; ok {
		t.Errorf("gw-old has a role: %v", rows[2])
	}
	b.Reset()
	printFleet(&b, nil, true, false)
	if b.String() != "[]\n" {
		t.Errorf("an empty fleet: %q", b.String())
	}
}
