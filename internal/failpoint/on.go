//go:build failpoints

package failpoint

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Enabled is true: this build has failpoints.
const Enabled = true

// ErrDisabled is never returned in a failpoints build.
var ErrDisabled = errors.New("failpoint: disabled")

// ErrInjected is what Err returns for an armed "error" action.
var ErrInjected = errors.New("failpoint: injected failure")

type action struct {
	op    string // "" : every op
	kind  string // crash, error, sleep
	sleep time.Duration
	nth   int64   // > 0: only the nth hit
	prob  float64 // > 0: each hit with this probability
	hits  int64
}

var state struct {
	once   sync.Once
	mu     sync.Mutex
	points map[string][]*action
	funcs  map[string]func() error
	rng    *rand.Rand
	err    error // of the environment's spec
}

func load() {
	state.once.Do(func() {
		state.points = map[string][]*action{}
		state.funcs = map[string]func() error{}
		seed := uint64(1)
		if v := os.Getenv("EDGE_AGENT_FAILPOINTS_SEED"); v != "" {
			if n, err := strconv.ParseUint(v, 10, 64); err == nil {
				seed = n
			}
		}
		state.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		spec := os.Getenv("EDGE_AGENT_FAILPOINTS")
		if v := os.Getenv("EDGE_AGENT_CRASH"); v != "" {
			spec += ";" + v + "=crash"
		}
		if v := os.Getenv("EDGE_AGENT_FAULT_FAIL_COMMIT"); v != "" {
			spec += ";" + Commit + "=error@" + v
		}
		if v := os.Getenv("EDGE_AGENT_FAULT_STALL_COMMIT"); v != "" {
			spec += ";" + Commit + "=stall@" + v
		}
		if err := parse(spec); err != nil {
			state.err = err
		}
	})
}

// FromEnv arms the points of the environment (EDGE_AGENT_FAILPOINTS and
// the older variables) and reports a malformed spec. A process calls it at
// start so that a bad spec is an error, not ignored.
func FromEnv() error {
	load()
	if state.err != nil {
		return state.err
	}
	state.mu.Lock()
	defer state.mu.Unlock()
	if len(state.points) > 0 {
		var names []string
		for p := range state.points {
			names = append(names, p)
		}
		fmt.Fprintf(os.Stderr, "failpoint: armed %s\n", strings.Join(names, ", "))
	}
	return nil
}

// SetFunc makes Err(point) return f() (for in-process tests: a commit that
// fails on a condition). restore removes it.
func SetFunc(point string, f func() error) (restore func(), err error) {
	load()
	if !known(point) {
		return func() {}, fmt.Errorf("failpoint: unknown point %q", point)
	}
	state.mu.Lock()
	state.funcs[point] = f
	state.mu.Unlock()
	return func() {
		state.mu.Lock()
		delete(state.funcs, point)
		state.mu.Unlock()
	}, nil
}

func known(p string) bool {
	for _, q := range Points {
		if q == p {
			return true
		}
	}
	return false
}

func parse(spec string) error {
	for _, item := range strings.Split(spec, ";") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		lhs, rhs, ok := strings.Cut(item, "=")
		if !ok {
			return fmt.Errorf("failpoint: %q: want POINT[:OP_ID]=ACTION", item)
		}
		point, op, _ := strings.Cut(lhs, ":")
		if !known(point) {
			return fmt.Errorf("failpoint: %q: unknown point %q (known: %s)", item, point, strings.Join(Points, ", "))
		}
		a := &action{op: op}
		if i := strings.IndexAny(rhs, "@%"); i >= 0 {
			n, err := strconv.ParseFloat(rhs[i+1:], 64)
			switch {
			case err != nil:
				return fmt.Errorf("failpoint: %q: %q is not a number", item, rhs[i+1:])
			case rhs[i] == '@' && (n < 1 || n != float64(int64(n))):
				return fmt.Errorf("failpoint: %q: @N wants a positive integer", item)
			case rhs[i] == '%' && (n <= 0 || n > 1):
				return fmt.Errorf("failpoint: %q: %%P wants 0 < P <= 1", item)
			case rhs[i] == '@':
				a.nth = int64(n)
			default:
				a.prob = n
			}
			rhs = rhs[:i]
		}
		switch {
		case rhs == "crash", rhs == "error", rhs == "stall":
			a.kind = rhs
		case strings.HasPrefix(rhs, "sleep(") && strings.HasSuffix(rhs, ")"):
			d, err := time.ParseDuration(rhs[len("sleep(") : len(rhs)-1])
			if err != nil || d < 0 {
				return fmt.Errorf("failpoint: %q: sleep wants a duration", item)
			}
			a.kind, a.sleep = "sleep", d
		default:
			return fmt.Errorf("failpoint: %q: unknown action %q (crash, error, stall, sleep(D))", item, rhs)
		}
		state.mu.Lock()
		state.points[point] = append(state.points[point], a)
		state.mu.Unlock()
	}
	return nil
}

// fire returns the actions of point that fire at this hit for op.
func fire(point, op string, peek bool) []*action {
	load()
	state.mu.Lock()
	defer state.mu.Unlock()
	var out []*action
	for _, a := range state.points[point] {
		if a.op != "" && a.op != op {
			continue
		}
		if peek {
			out = append(out, a)
			continue
		}
		a.hits++
		switch {
		case a.nth > 0 && a.hits != a.nth:
			continue
		case a.prob > 0 && state.rng.Float64() >= a.prob:
			continue
		}
		out = append(out, a)
	}
	return out
}

// Armed reports whether a crash is armed at point for op (without counting
// a hit), for a point that must prepare before it is hit (before_ack waits
// for the Result to be published).
func Armed(point, op string) bool {
	for _, a := range fire(point, op, true) {
		if a.kind == "crash" {
			return true
		}
	}
	return false
}

// Hit runs the crash and sleep actions armed at point for op.
func Hit(point, op string) {
	for _, a := range fire(point, op, false) {
		switch a.kind {
		case "crash":
			fmt.Fprintf(os.Stderr, "failpoint: SIGKILL at crash point %s op_id %s\n", point, op)
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never returns
		case "sleep":
			// A long one (a slow start-up, not a slow commit's) says
			// when it begins and ends, for the tests that act inside it.
			long := a.sleep >= time.Second
			if long {
				fmt.Fprintf(os.Stderr, "failpoint: sleeping %s at %s\n", a.sleep, point)
			}
			time.Sleep(a.sleep)
			if long {
				fmt.Fprintf(os.Stderr, "failpoint: slept %s at %s\n", a.sleep, point)
			}
		case "stall":
			stall(point)
		}
	}
}

// stall blocks for good: a disk that stopped answering (the step never
// returns; the process lives on).
func stall(point string) {
	fmt.Fprintf(os.Stderr, "failpoint: %s stalled for good\n", point)
	select {}
}

// Err runs point's actions (sleep and crash too) and returns an error when
// an "error" action fires or a function set by SetFunc returns one.
func Err(point string) error {
	state.mu.Lock()
	f := state.funcs[point]
	state.mu.Unlock()
	if f != nil {
		if err := f(); err != nil {
			return err
		}
	}
	for _, a := range fire(point, "", false) {
		switch a.kind {
		case "error":
			return fmt.Errorf("%w at %s (EDGE_AGENT_FAILPOINTS)", ErrInjected, point)
		case "crash":
			fmt.Fprintf(os.Stderr, "failpoint: SIGKILL at crash point %s\n", point)
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		case "sleep":
			time.Sleep(a.sleep)
		case "stall":
			stall(point)
		}
	}
	return nil
}
