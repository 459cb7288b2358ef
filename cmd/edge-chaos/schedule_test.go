package main

import (
	"reflect"
	"testing"
	"time"
)

// The schedule is the seed's: the same seed gives the same faults, another
// seed others; every kind is in every round, so a few minutes have them
// all.
func TestScheduleIsTheSeeds(t *testing.T) {
	a := schedule(7, 3*time.Minute, 8, defaultDevices, 2*time.Second, false, false, 0)
	b := schedule(7, 3*time.Minute, 8, defaultDevices, 2*time.Second, false, false, 0)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("seed 7 gave two different schedules")
	}
	if reflect.DeepEqual(a, schedule(8, 3*time.Minute, 8, defaultDevices, 2*time.Second, false, false, 0)) {
		t.Fatal("seeds 7 and 8 gave the same schedule")
	}
	for seed := uint64(1); seed <= 20; seed++ {
		kinds := map[string]int{}
		for _, f := range schedule(seed, 3*time.Minute, 8, defaultDevices, 2*time.Second, false, false, 0) {
			kinds[f.Kind]++
			if f.At < 0 || f.At >= 3*time.Minute {
				t.Fatalf("seed %d: fault %s at %v, outside the run", seed, f, f.At)
			}
		}
		for _, k := range faultKinds {
			if kinds[k] == 0 {
				t.Errorf("seed %d: no %s in 3 minutes", seed, k)
			}
		}
	}
	// With the embedded broker there is no mosquitto to restart and no
	// link between the agent and its broker.
	for _, f := range schedule(7, 3*time.Minute, 8, defaultDevices, 2*time.Second, true, false, 0) {
		if f.Kind == fBrokerRestart || f.Kind == fNetBroker {
			t.Fatalf("embedded: scheduled %s", f)
		}
	}
}

// The short run of make test (seed 7, 60s) has every kind of fault.
func TestShortRunScheduleHasEveryKind(t *testing.T) {
	kinds := map[string]bool{}
	for _, f := range schedule(7, 60*time.Second, 8, defaultDevices, 2*time.Second, false, false, 0) {
		kinds[f.Kind] = true
	}
	for _, k := range faultKinds {
		if !kinds[k] {
			t.Errorf("seed 7, 60s: no %s", k)
		}
	}
}

// The pair's short run of make test (seed 5, 45s, -ha) has the pair's
// faults, on the active and the standby, and no clone; without -ha no
// fault names one of the pair.
func TestHAScheduleHasThePairsFaults(t *testing.T) {
	kinds, on := map[string]bool{}, map[string]bool{}
	for _, f := range schedule(5, 45*time.Second, 8, defaultDevices, 2*time.Second, false, true, 0) {
		kinds[f.Kind] = true
		on[f.Agent] = true
		if f.Kind == fAgentClone {
			t.Fatalf("-ha: scheduled %s", f)
		}
	}
	for _, k := range []string{fHAKill, fHAPause, fHAPartition} {
		if !kinds[k] {
			t.Errorf("seed 5, 45s, -ha: no %s", k)
		}
	}
	if !on["active"] || !on["standby"] {
		t.Errorf("seed 5, 45s, -ha: faults on %v, want the active and the standby", on)
	}
	for _, f := range schedule(7, 60*time.Second, 8, defaultDevices, 2*time.Second, false, false, 0) {
		if f.Agent != "" || f.Kind == fHAKill || f.Kind == fHAPause || f.Kind == fHAPartition {
			t.Fatalf("without -ha: scheduled %s", f)
		}
	}
}

// A fleet's schedule (-fleet 3): broker node kills, etcd member kills and
// device moves instead of the mosquitto restart; the agent's faults,
// wipes and restores among them, each on one gateway, every gateway hit;
// the fleet's short run of make test (seed 3, 60s) has them all.
func TestFleetScheduleHasTheFleetsFaults(t *testing.T) {
	devs := fleetDevices(3)
	a := schedule(3, 60*time.Second, 8, devs, 2*time.Second, false, false, 3)
	if !reflect.DeepEqual(a, schedule(3, 60*time.Second, 8, devs, 2*time.Second, false, false, 3)) {
		t.Fatal("seed 3 gave two different fleet schedules")
	}
	kinds, on := map[string]bool{}, map[string]bool{}
	for _, f := range a {
		kinds[f.Kind] = true
		if f.Kind == fBrokerRestart {
			t.Fatalf("-fleet: scheduled %s", f)
		}
		if agentKinds[f.Kind] || f.Kind == fAgentClone || f.Kind == fNetBroker || f.Kind == fNetFirmware {
			if f.Agent == "" {
				t.Fatalf("-fleet: %s on no gateway", f)
			}
			on[f.Agent] = true
		}
	}
	for _, k := range []string{fNATSKill, fEtcdMemberKill, fEtcdLeaderKill, fDeviceMove, fAgentWipe, fAgentRestore, fAgentKill, fAgentCrashPoint, fNetBroker} {
		if !kinds[k] {
			t.Errorf("seed 3, 60s, -fleet 3: no %s", k)
		}
	}
	for _, gw := range []string{"gw1", "gw2", "gw3"} {
		if !on[gw] {
			t.Errorf("seed 3, 60s, -fleet 3: no fault on %s (%v)", gw, on)
		}
	}
	// Every fleet device starts on one gateway; the movers on different ones.
	homes := map[int]int{}
	for _, d := range devs {
		homes[homeOf(d.ID, 3)]++
	}
	if len(homes) != 3 || homes[-1] != 0 {
		t.Errorf("fleet devices by gateway: %v", homes)
	}
}
