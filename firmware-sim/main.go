// Command firmware-sim is the simulated device firmware of docs/protocol.md §2.
//
//	firmware-sim [--listen 127.0.0.1:8081] [--modbus 127.0.0.1:5020] [--modbus-rtu 127.0.0.1:5021] [--journal FILE] [--log-level info] --devices pump-7:pump,valve-1:valve[:UNIT]
//	firmware-sim --version
//
// It serves until SIGINT or SIGTERM. Exit status: 0 on a clean stop, 2 on a
// usage error, 1 otherwise.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/edge-agent/edge-agent/firmware-sim/sim"
)

// Version, Commit and Date are set at build time by the Makefile (-ldflags
// -X main.Version=...); --version prints them in the form of
// internal/buildinfo.Line (written out here: the simulator stands for the
// hardware and imports nothing of the agent).
var (
	Version = "0.1.0-dev"
	Commit  = ""
	Date    = ""
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := flag.NewFlagSet("firmware-sim", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8081", "address to serve the device API on")
	journal := fs.String("journal", "", "append every applied write to this file (fsynced), tombstones to FILE.tombstones; reloaded at start")
	devices := fs.String("devices", "", "the simulated devices, ID:TYPE[:UNIT],... (TYPE: pump, valve, relay, generic; UNIT: Modbus unit ID 1..255, default the next free one)")
	modbusAddr := fs.String("modbus", "", "also serve the devices over Modbus TCP on this address (e.g. 127.0.0.1:5020); \"\": not at all")
	rtuAddr := fs.String("modbus-rtu", "", "also serve the devices over Modbus RTU-over-TCP (RTU frames with their CRC on a TCP stream) on this address (e.g. 127.0.0.1:5021); \"\": not at all")
	logLevel := fs.String("log-level", "info", "debug, info (one line per applied write), warn or error")
	version := fs.Bool("version", false, "print the version, commit, build date, Go version and OS/arch, and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *version {
		commit, date := Commit, Date
		if commit == "" {
			commit = "unknown"
		}
		if date == "" {
			date = "unknown"
		}
		fmt.Printf("firmware-sim %s (commit %s, built %s) %s %s/%s\n", Version, commit, date, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return 0
	}
	devs, units, err := parseDevices(*devices)
	if err != nil {
		fmt.Fprintf(os.Stderr, "firmware-sim: --devices: %v\n", err)
		return 2
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "firmware-sim: --log-level %q: want debug, info, warn or error\n", *logLevel)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	s, err := sim.New(sim.Options{Devices: devs, Units: units, JournalPath: *journal, Logger: log})
	if err != nil {
		fmt.Fprintf(os.Stderr, "firmware-sim: --devices: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := s.Start(ctx, *listen); err != nil {
		fmt.Fprintf(os.Stderr, "firmware-sim: %v\n", err)
		return 1
	}
	// The one line on stdout: scripts and tests read the address from it
	// (useful with --listen 127.0.0.1:0).
	fmt.Printf("firmware-sim listening on %s\n", s.URL())
	if *modbusAddr != "" {
		if err := s.StartModbus(*modbusAddr); err != nil {
			fmt.Fprintf(os.Stderr, "firmware-sim: --modbus: %v\n", err)
			s.Close()
			return 1
		}
		// The second line: the Modbus address and each device's unit.
		fmt.Printf("firmware-sim modbus on %s units %s\n", s.ModbusAddr(), unitList(s, devs))
	}
	if *rtuAddr != "" {
		if err := s.StartModbusRTU(*rtuAddr); err != nil {
			fmt.Fprintf(os.Stderr, "firmware-sim: --modbus-rtu: %v\n", err)
			s.Close()
			return 1
		}
		// The next line: the RTU-over-TCP address and each device's unit.
		fmt.Printf("firmware-sim modbus-rtu on %s units %s\n", s.ModbusRTUAddr(), unitList(s, devs))
	}
	<-ctx.Done()
	if err := s.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "firmware-sim: %v\n", err)
		return 1
	}
	return 0
}

// parseDevices reads "ID:TYPE[:UNIT],ID:TYPE[:UNIT],...".
func parseDevices(spec string) (map[string]string, map[string]int, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, nil, errors.New("required, e.g. pump-7:pump,valve-1:valve")
	}
	devs, units := map[string]string{}, map[string]int{}
	for item := range strings.SplitSeq(spec, ",") {
		id, rest, ok := strings.Cut(strings.TrimSpace(item), ":")
		typ, unit, hasUnit := strings.Cut(rest, ":")
		if !ok || id == "" || typ == "" {
			return nil, nil, fmt.Errorf("%q is not ID:TYPE or ID:TYPE:UNIT", item)
		}
		if _, dup := devs[id]; dup {
			return nil, nil, fmt.Errorf("device %s given twice", id)
		}
		devs[id] = typ
		if hasUnit {
			u, err := strconv.Atoi(unit)
			if err != nil {
				return nil, nil, fmt.Errorf("%q: unit %q is not a number", item, unit)
			}
			units[id] = u
		}
	}
	return devs, units, nil
}

// unitList is "pump-7=1,valve-1=2" in device order.
func unitList(s *sim.Sim, devs map[string]string) string {
	ids := make([]string, 0, len(devs))
	for id := range devs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	parts := make([]string, len(ids))
	for i, id := range ids {
		u, _ := s.Unit(id)
		parts[i] = fmt.Sprintf("%s=%d", id, u)
	}
	return strings.Join(parts, ",")
}
