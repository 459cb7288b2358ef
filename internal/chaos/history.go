package chaos

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
)

// The history of a run is a directory of JSON-lines files:
//
//	ctl-*.jsonl     each controller process's events (Event)
//	observer.jsonl  every Result the broker delivered (Event, ev "result")
//	faults.jsonl    every fault the schedule injected (FaultRecord)
//	journal.jsonl   firmware-sim's journal: what reached the hardware
//
// Times are wall-clock Unix nanoseconds of this machine (every process
// runs on it, so they compare across files).

// Event kinds in controller and observer files.
const (
	EvInvoked   = "invoked"   // about to publish an operation for the first time
	EvPublished = "published" // the broker acknowledged a publish of it (PUBACK)
	EvResult    = "result"    // a Result arrived for it
	EvGaveUp    = "gaveup"    // the controller stopped waiting for it
	EvAcquired  = "acquired"  // a lock was taken: Fence is its token
	EvLost      = "lost"      // the holder lost ownership
	EvReleased  = "released"  // the lock was released
	EvPaused    = "paused"    // the controller stopped itself after an ownership check (a stale holder)
	EvNote      = "note"      // anything else worth reading in a window
)

// Event is one line of a controller's or the observer's file.
type Event struct {
	T      int64           `json:"t"`
	Src    string          `json:"src"` // controller ID, or "observer"
	Ev     string          `json:"ev"`
	Dev    string          `json:"dev,omitempty"`
	Op     string          `json:"op,omitempty"`
	Fence  int64           `json:"fence,omitempty"`
	Action string          `json:"action,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Lock   string          `json:"lock,omitempty"`
	Result *wire.Result    `json:"result,omitempty"`
	Err    string          `json:"err,omitempty"`
	Gw     string          `json:"gw,omitempty"` // the observer's Results: the gateway whose topic it came on (-fleet)
}

// FaultRecord is one line of faults.jsonl.
type FaultRecord struct {
	T      int64  `json:"t"`
	Kind   string `json:"kind"`
	Phase  string `json:"phase"` // start, end
	Target string `json:"target,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// LineWriter appends JSON lines to a file, one write(2) per line, so a
// SIGKILL of the writer never leaves half a line behind a whole one.
type LineWriter struct {
	mu sync.Mutex
	f  *os.File
}

func OpenLines(path string) (*LineWriter, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	return &LineWriter{f: f}, nil
}

func (w *LineWriter) Write(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("history: marshal %T: %v", v, err))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = w.f.Write(append(b, '\n'))
}

func (w *LineWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.f.Close()
}

// ReadLines decodes the complete lines of path (a missing file has none; a
// torn last line, cut by a SIGKILL, is skipped).
func ReadLines[T any](path string) ([]T, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	data = data[:bytes.LastIndexByte(data, '\n')+1]
	var out []T
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var v T
		if err := json.Unmarshal(line, &v); err != nil {
			return nil, fmt.Errorf("history: %s line %d: %w", path, n, err)
		}
		out = append(out, v)
	}
	return out, sc.Err()
}

// History is a run's recorded history, loaded from its directory.
type History struct {
	Events  []Event // controllers' and observer's, by time
	Faults  []FaultRecord
	Journal []sim.Entry
	// Meta is what the run was (run.json).
	Meta RunMeta
}

// RunMeta describes a run: written at its start, read by the checker.
type RunMeta struct {
	Seed     uint64            `json:"seed"`
	Duration string            `json:"duration"`
	Broker   string            `json:"broker"`           // mosquitto or embedded
	Tags     string            `json:"tags"`             // the agent's build tags
	Mutant   string            `json:"mutant,omitempty"` // the agent is this mutant (mutants/NAME.patch)
	HA       bool              `json:"ha,omitempty"`     // a pair of agents for the gateway, one active (docs/protocol.md §8)
	Fleet    []string          `json:"fleet,omitempty"`  // -fleet N: the gateways' IDs (docs/protocol.md §9)
	Devices  []DeviceSpec      `json:"devices"`
	Start    int64             `json:"start"`
	End      int64             `json:"end"` // when the faults stopped
	Settled  int64             `json:"settled"`
	Extra    map[string]string `json:"extra,omitempty"`
}

// DeviceSpec is one simulated device of the campaign.
type DeviceSpec struct {
	ID        string `json:"id"`
	Type      string `json:"type"`
	Group     string `json:"group,omitempty"`
	Queryable bool   `json:"queryable"`
	Hot       bool   `json:"hot,omitempty"`
}

func (m RunMeta) device(id string) (DeviceSpec, bool) {
	for _, d := range m.Devices {
		if d.ID == id {
			return d, true
		}
	}
	return DeviceSpec{}, false
}

// LoadHistory reads a run directory.
func LoadHistory(dir string) (*History, error) {
	h := &History{}
	b, err := os.ReadFile(filepath.Join(dir, "run.json"))
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	if err := json.Unmarshal(b, &h.Meta); err != nil {
		return nil, fmt.Errorf("history: run.json: %w", err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "ctl-*.jsonl"))
	if err != nil {
		return nil, err
	}
	files = append(files, filepath.Join(dir, "observer.jsonl"))
	for _, f := range files {
		evs, err := ReadLines[Event](f)
		if err != nil {
			return nil, err
		}
		h.Events = append(h.Events, evs...)
	}
	sort.SliceStable(h.Events, func(i, j int) bool { return h.Events[i].T < h.Events[j].T })
	if h.Faults, err = ReadLines[FaultRecord](filepath.Join(dir, "faults.jsonl")); err != nil {
		return nil, err
	}
	if h.Journal, err = ReadLines[sim.Entry](filepath.Join(dir, "journal.jsonl")); err != nil {
		return nil, err
	}
	return h, nil
}

// stamp renders a Unix-nanosecond time relative to the run's start.
func (m RunMeta) Stamp(t int64) string {
	if t == 0 || t == never {
		return "      -"
	}
	return fmt.Sprintf("%8.3fs", float64(t-m.Start)/float64(time.Second))
}

// never is the response time of an operation that never returned.
const never = int64(1<<63 - 1)

func shortJSON(b json.RawMessage) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 60 {
		s = s[:60] + "..."
	}
	return s
}
