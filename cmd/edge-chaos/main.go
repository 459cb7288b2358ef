// Command edge-chaos is the chaos campaign of `make chaos` (docs/testing.md,
// "Chaos campaign"): it runs a 3-member etcd, mosquitto (or the agent's
// embedded broker), firmware-sim with its journal, edge-agent built with
// failpoints, and N honest controllers (this binary in controller mode)
// as real processes on loopback, with toxiproxy between them; injects a
// seeded schedule of faults (stale holders, dead holders, agent kills and
// crash points, slow and failing commits, broker restarts, etcd leader
// kills, network latency and cuts, firmware latency, 503s, dropped
// answers, hangs and kills); plays the operator for devices that cannot be
// asked; and then checks the recorded history: a porcupine model per
// device and direct checks against the firmware's journal.
//
//	edge-chaos [run] [-seed N] [-duration D] [-broker mosquitto|embedded] [-ha] [-controllers N] [-out DIR] [-keep]
//	edge-chaos run -fleet N -broker nats ...   N gateways on a 3-node NATS cluster (docs/testing.md, "A fleet")
//	edge-chaos check DIR        check a recorded history again
//	edge-chaos mutants [-seed N] [-duration D] [-only NAME,...]   build each mutant agent (mutants/*.patch) and show the campaign catches it
//
// Exit status: 0 when the history has no violation, 1 when it has (the
// last line says `violations: N`), 2 on a usage error, 3 when the
// campaign could not run.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/edge-agent/edge-agent/internal/chaos"
	"github.com/edge-agent/edge-agent/internal/rig"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	cmd := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "run":
		return runCmd(args)
	case "controller":
		return runController(args)
	case "check":
		return checkCmd(args)
	case "mutants":
		return mutantsCmd(args)
	}
	fmt.Fprintf(os.Stderr, "edge-chaos: unknown command %q (run, check, mutants)\n", cmd)
	return 2
}

// campaignFlags are the flags of run and mutants.
func campaignFlags(fs *flag.FlagSet, o *options) func() error {
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the fault schedule and the controllers' choices")
	fs.DurationVar(&o.duration, "duration", 60*time.Second, "how long faults are injected (then the run settles and is checked)")
	broker := fs.String("broker", "mosquitto", "mosquitto (with persistence, through toxiproxy), embedded (the agent's own broker) or nats (a 3-node NATS cluster with JetStream and MQTT; -fleet only)")
	fs.IntVar(&o.fleet, "fleet", 0, "run a fleet of N gateways (2..8): N agents, each with its own gateway_id and devices, on a 3-node NATS cluster (-broker nats), with broker node kills and devices moved between gateways")
	fs.BoolVar(&o.ha, "ha", false, "run a standby pair: two agents with one gateway_id and ha.enabled, and faults of either (kills, pauses, partitions from etcd)")
	fs.IntVar(&o.controllers, "controllers", 8, "controller processes (even slots resend eagerly, odd ones wait)")
	fs.DurationVar(&o.ttl, "ttl", 2*time.Second, "the controllers' lock lease TTL")
	fs.StringVar(&o.out, "out", "", "directory for the history (default: a new temporary directory)")
	fs.BoolVar(&o.keep, "keep", false, "keep the history directory even without a violation")
	fs.StringVar(&o.agentBin, "agent", "", "edge-agent binary built with -tags failpoints (default: built from ./cmd/edge-agent; run from the repository root)")
	fs.StringVar(&o.firmwareBin, "firmware", "", "firmware-sim binary (default: built from ./firmware-sim)")
	fs.StringVar(&o.etcdBin, "etcd-bin", "/usr/bin/etcd", "the etcd server binary")
	fs.StringVar(&o.mosquittoBin, "mosquitto-bin", "", "the mosquitto binary (default: /usr/sbin/mosquitto, else PATH)")
	fs.DurationVar(&o.settle, "settle", 60*time.Second, "after the faults: how long to wait for every published command's final Result")
	fs.DurationVar(&o.porcupineTO, "porcupine-timeout", time.Minute, "bound on porcupine's search per device")
	return func() error {
		switch *broker {
		case "mosquitto":
		case "embedded":
			o.embedded = true
		case "nats":
			o.nats = true
		default:
			return fmt.Errorf("-broker %q: want mosquitto, embedded or nats", *broker)
		}
		if o.fleet != 0 && (o.fleet < 2 || o.fleet > 8) {
			return fmt.Errorf("-fleet %d: want 2..8", o.fleet)
		}
		if o.fleet > 0 && (o.embedded || o.ha) {
			return errors.New("-fleet runs on the NATS cluster (-broker nats), without -ha")
		}
		if o.nats != (o.fleet > 0) {
			return errors.New("-broker nats goes with -fleet N (and -fleet N with -broker nats)")
		}
		if o.nats {
			if _, err := rig.FindNATS(); err != nil {
				return err
			}
		}
		if o.ha && o.embedded {
			return errors.New("-ha needs -broker mosquitto (the pair shares one broker; an embedded one lives in one agent)")
		}
		if o.controllers < 1 || o.controllers > 64 {
			return fmt.Errorf("-controllers %d: want 1..64", o.controllers)
		}
		if o.duration < 5*time.Second || o.duration > 48*time.Hour {
			return fmt.Errorf("-duration %v: want 5s..48h", o.duration)
		}
		if o.ttl < time.Second || o.ttl > time.Minute {
			return fmt.Errorf("-ttl %v: want 1s..1m", o.ttl)
		}
		if _, err := os.Stat(o.etcdBin); err != nil {
			return fmt.Errorf("-etcd-bin: %w (apt-get install etcd-server)", err)
		}
		if o.mosquittoBin == "" {
			o.mosquittoBin = "/usr/sbin/mosquitto"
			if _, err := os.Stat(o.mosquittoBin); err != nil {
				p, lerr := exec.LookPath("mosquitto")
				if lerr != nil && !o.embedded {
					return errors.New("mosquitto not found in /usr/sbin or PATH (apt-get install mosquitto), or use -broker embedded")
				}
				o.mosquittoBin = p
			}
		}
		self, err := os.Executable()
		if err != nil {
			return err
		}
		o.self = self
		o.devices = defaultDevices
		if o.fleet > 0 {
			o.devices = fleetDevices(o.fleet)
		}
		o.log = os.Stdout
		return nil
	}
}

func runCmd(args []string) int {
	fs := flag.NewFlagSet("edge-chaos run", flag.ContinueOnError)
	var o options
	finish := campaignFlags(fs, &o)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := finish(); err != nil {
		fmt.Fprintf(os.Stderr, "edge-chaos: %v\n", err)
		return 2
	}
	res, dir, err := runCampaign(o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "edge-chaos: the campaign could not run: %v\n", err)
		if dir != "" {
			fmt.Fprintf(os.Stderr, "edge-chaos: what it recorded is in %s\n", dir)
		}
		return 3
	}
	return finishRun(o, res, dir)
}

// finishRun prints the report; the history is removed when it is clean
// and not to be kept.
func finishRun(o options, res *chaos.CheckResult, dir string) int {
	h, err := chaos.LoadHistory(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "edge-chaos: %v\n", err)
		return 3
	}
	report(o.log, h, res, dir)
	if len(res.Violations) > 0 {
		return 1
	}
	if !o.keep && o.out == "" {
		os.RemoveAll(dir)
		fmt.Fprintf(o.log, "(history removed: no violation; -keep keeps it)\n")
	}
	return 0
}

func checkCmd(args []string) int {
	fs := flag.NewFlagSet("edge-chaos check", flag.ContinueOnError)
	to := fs.Duration("porcupine-timeout", time.Minute, "bound on porcupine's search per device")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: edge-chaos check DIR")
		return 2
	}
	dir := fs.Arg(0)
	h, err := chaos.LoadHistory(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "edge-chaos: %v\n", err)
		return 3
	}
	res := chaos.Check(h, dir, *to)
	report(os.Stdout, h, res, dir)
	if len(res.Violations) > 0 {
		return 1
	}
	return 0
}
