// Package sim is the firmware simulator of docs/protocol.md §2: a stand-in for
// device firmware that honours idempotency keys and answers ops queries
// with tombstones, but knows nothing of fencing. It is the hardware of the
// tests and the demo, so it imports nothing of the agent.
//
// Keys are per device. For each key the simulator keeps one stored answer:
// the 200 of the write it applied or the 422 of a write it refused; a
// repeat of the key gets that answer and applies nothing. An ops query for
// a key that was not applied tombstones it: from then on an apply with it
// gets 409, so a request still in flight can never land after the querier
// has decided it did not.
package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/simonvetter/modbus"
)

// Options configure a simulator. Nil maps and empty strings mean what each
// field says.
type Options struct {
	// Devices maps each simulated device's ID to its type: pump, valve,
	// relay or generic. It must not be empty; any other device is 404.
	Devices map[string]string
	// JournalPath is the file every applied write is appended to (one JSON
	// line, fsynced before the write is answered), with tombstones in
	// JournalPath+".tombstones"; Open reloads both, so applied keys, their
	// answers and tombstones survive a restart. "" keeps everything in
	// memory only.
	JournalPath string
	// Logger receives one line per write decided; nil discards them.
	Logger *slog.Logger
	// Units gives devices their Modbus unit IDs (1..255). A device not
	// in it gets the lowest free unit, in device ID order (nil: the
	// devices get 1, 2, 3, ... in ID order).
	Units map[string]int
}

var deviceIDPattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// Sim is one simulator process's worth of devices. Its methods are safe for
// concurrent use.
type Sim struct {
	journalPath string
	log         *slog.Logger
	devices     map[string]*device // fixed by New; the fields of each are guarded by mu
	mux         *http.ServeMux
	closing     chan struct{} // closed by Close: every waiting request gives up
	served      chan struct{} // closed when the server goroutine has returned

	mu            sync.Mutex
	opened        bool
	closed        bool
	broken        error // a journal write or fsync failed: nothing more is applied
	seq           int64
	journal       []Entry
	faults        faultTable
	faultsChanged chan struct{} // closed and replaced on every SetFaults
	counts        FaultCounts
	jfile, tfile  *os.File
	srv           *http.Server
	ln            net.Listener
	mb            *modbus.ModbusServer // StartModbus
	mbAddr        string
	rtu           *rtuServer           // StartModbusRTU
	rtuBackend    *modbus.ModbusServer // StartModbusRTU's private Modbus TCP server
	units         map[uint8]*device    // by Modbus unit ID; fixed by New
	handlers      sync.WaitGroup       // requests being served; Close waits for them
}

type device struct {
	id, typ  string
	unit     uint8 // Modbus unit ID
	state    state
	ops      map[string]*op // by key
	requests map[string]int // apply requests received, by key
}

type opStatus int

const (
	opPending    opStatus = iota // registered by the request carrying it out; done is open
	opApplied                    // applied and durable; answer is its 200
	opRefused                    // refused by the hardware; answer is its 422
	opTombstoned                 // an ops query found it unapplied: never applied
)

// op is what the simulator knows of one key.
type op struct {
	status opStatus
	done   chan struct{} // for a pending op: closed when it is decided or abandoned
	opID   string
	code   int
	answer []byte          // the stored answer to repeats of the key
	state  json.RawMessage // applied: the state its answer reported
}

// New returns a simulator of opts.Devices. It does no I/O: Start (or Open)
// loads the journal.
func New(opts Options) (*Sim, error) {
	if len(opts.Devices) == 0 {
		return nil, ErrNoDevices
	}
	s := &Sim{
		journalPath:   opts.JournalPath,
		log:           opts.Logger,
		devices:       map[string]*device{},
		closing:       make(chan struct{}),
		served:        make(chan struct{}),
		faultsChanged: make(chan struct{}),
		opened:        opts.JournalPath == "",
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	for _, id := range slices.Sorted(maps.Keys(opts.Devices)) {
		typ := opts.Devices[id]
		if !deviceIDPattern.MatchString(id) {
			return nil, fmt.Errorf("%w: %q", ErrBadDeviceID, id)
		}
		if !knownType(typ) {
			return nil, fmt.Errorf("device %s: %w %q (want pump, valve, relay or generic)", id, ErrUnknownType, typ)
		}
		s.devices[id] = &device{id: id, typ: typ, state: initialState(typ), ops: map[string]*op{}, requests: map[string]int{}}
	}
	if err := s.assignUnits(opts.Units, slices.Sorted(maps.Keys(opts.Devices))); err != nil {
		return nil, err
	}
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("POST /v1/devices/{dev}/apply", s.handleApply)
	s.mux.HandleFunc("GET /v1/devices/{dev}/ops/{key}", s.handleOps)
	s.mux.HandleFunc("GET /v1/devices/{dev}/state", s.handleState)
	s.mux.HandleFunc("GET /v1/journal", s.handleJournal)
	s.mux.HandleFunc("POST /v1/faults", s.handleSetFaults)
	s.mux.HandleFunc("GET /v1/faults", s.handleGetFaults)
	return s, nil
}

// Open loads the journal and its tombstones and opens them for appending.
// Start calls it; a caller that serves Handler itself may call it first,
// or leave it to the first request. It does nothing the second time, or
// without a JournalPath.
func (s *Sim) Open() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.opened {
		return nil
	}
	if err := s.load(); err != nil {
		return err
	}
	s.opened = true
	return nil
}

// load replays the journal: each applied key gets back its stored answer,
// recomputed from the write itself, and each device the state after its
// last write. Called with mu held.
func (s *Sim) load() error {
	entries, jgood, err := readLines[Entry](s.journalPath)
	if err != nil {
		return err
	}
	tombs, tgood, err := readLines[tombstone](tombstonesPath(s.journalPath))
	if err != nil {
		return err
	}
	for i := 1; i < len(entries); i++ {
		if entries[i].Seq <= entries[i-1].Seq {
			return fmt.Errorf("%w: %s: seq %d after %d", ErrCorruptJournal, s.journalPath, entries[i].Seq, entries[i-1].Seq)
		}
	}
	jfile, err := openAppend(s.journalPath, jgood)
	if err != nil {
		return err
	}
	tfile, err := openAppend(tombstonesPath(s.journalPath), tgood)
	if err != nil {
		jfile.Close()
		return err
	}
	// Nothing below fails: the simulator is either loaded whole or not at all.
	s.jfile, s.tfile, s.journal = jfile, tfile, entries
	for _, e := range entries {
		s.seq = e.Seq
		d := s.devices[e.Device]
		if d == nil {
			s.log.Warn("journal names a device not simulated now", "device", e.Device, "seq", e.Seq)
			continue
		}
		if _, seen := d.ops[e.Key]; seen && e.Key != "" {
			continue // a key is applied once; the first line is its answer
		}
		_, members, err := decodeParams(e.Params)
		if err == nil {
			var next state
			if next, err = applyWrite(d.typ, d.state, e.Action, members); err == nil {
				d.state = next
			}
		}
		if err != nil {
			s.log.Warn("journal write does not replay on this device type", "device", e.Device, "type", d.typ, "seq", e.Seq, "err", err)
		}
		if e.Key == "" {
			continue // a Modbus write: no key to answer
		}
		st := d.state.JSON()
		d.ops[e.Key] = &op{status: opApplied, opID: e.OpID, code: http.StatusOK, answer: applyAnswer(st), state: st}
	}
	for _, t := range tombs {
		if d := s.devices[t.Device]; d != nil && d.ops[t.Key] == nil {
			d.ops[t.Key] = &op{status: opTombstoned}
		}
	}
	s.log.Info("journal loaded", "path", s.journalPath, "writes", len(entries), "tombstones", len(tombs))
	return nil
}

// Handler serves the API of docs/protocol.md §2.
func (s *Sim) Handler() http.Handler { return http.HandlerFunc(s.serve) }

func (s *Sim) serve(w http.ResponseWriter, r *http.Request) {
	if err := s.Open(); err != nil {
		writeError(w, http.StatusServiceUnavailable, "%v", err)
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		writeError(w, http.StatusServiceUnavailable, "%v", ErrClosed)
		return
	}
	s.handlers.Add(1)
	s.mu.Unlock()
	defer s.handlers.Done()
	s.mux.ServeHTTP(w, r)
}

// Start opens the journal, listens on addr (host:port; port 0 picks a free
// one) and serves until Close. ctx bounds only the listening.
func (s *Sim) Start(ctx context.Context, addr string) error {
	if err := s.Open(); err != nil {
		return err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("sim: listen on %s: %w", addr, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		ln.Close()
		return ErrClosed
	case s.srv != nil:
		ln.Close()
		return ErrStarted
	}
	s.ln = ln
	s.srv = &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	go func(srv *http.Server) {
		defer close(s.served)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("serve", "err", err)
		}
	}(s.srv)
	s.log.Info("firmware simulator listening", "addr", ln.Addr().String(), "devices", len(s.devices))
	return nil
}

// Addr is the address Start listens on, "" before Start.
func (s *Sim) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// URL is the base URL of the API ("http://" + Addr()), "" before Start.
func (s *Sim) URL() string {
	if a := s.Addr(); a != "" {
		return "http://" + a
	}
	return ""
}

// Close stops serving, like a power cut for the requests in progress: a
// write still waiting (latency, hang, another request of its key) is
// abandoned unapplied and its connection closed. A write already applied
// stays in the journal. Close waits for every request to end, then closes
// the journal. It is idempotent; afterwards Start, Open and SetFaults
// return ErrClosed, while Journal, State, Requests and Injected keep
// answering from memory.
func (s *Sim) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	srv, mb, rtu, rtuBackend := s.srv, s.mb, s.rtu, s.rtuBackend
	s.mu.Unlock()
	if mb != nil {
		mb.Stop() // closes the listener and every connection; held handlers see closing
	}
	if rtu != nil {
		rtuBackend.Stop()
		rtu.close()
	}

	var errs []error
	if srv != nil {
		// Shutdown waits for connections to go idle; a client's pooled
		// connection that never sent a request stays "new" and would hold
		// it for 5 s. Requests in progress are waited for below
		// (s.handlers), so such connections are simply closed.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if err := srv.Shutdown(ctx); err != nil {
			srv.Close()
		}
		cancel()
		<-s.served
	}
	s.handlers.Wait()

	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range []*os.File{s.jfile, s.tfile} {
		if f != nil {
			if err := f.Close(); err != nil {
				errs = append(errs, fmt.Errorf("sim: close %s: %w", f.Name(), err))
			}
		}
	}
	s.jfile, s.tfile = nil, nil
	return errors.Join(errs...)
}

// Journal returns every applied write, oldest first.
func (s *Sim) Journal() []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.journal)
}

// State returns the device's current state, a JSON object with sorted keys
// (e.g. {"rpm":1200}).
func (s *Sim) State(dev string) (json.RawMessage, error) {
	d := s.devices[dev]
	if d == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownDevice, dev)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return d.state.JSON(), nil
}

// Requests counts the apply requests that arrived for key on dev, whatever
// became of them (repeats, refusals, injected faults included): a test's
// proof that a try was, or was not, sent.
func (s *Sim) Requests(dev, key string) int {
	d := s.devices[dev]
	if d == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return d.requests[key]
}

// Injected counts the faults injected so far: a test's proof that its fault
// happened.
func (s *Sim) Injected() FaultCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts
}

// SetFaults does what POST /v1/faults does: f.Device "" sets the faults of
// every device (and drops per-device ones; Faults{} clears all), otherwise
// of that device only. Requests already held by hang are released when it
// is cleared.
func (s *Sim) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if f.Device != "" && s.devices[f.Device] == nil {
		return fmt.Errorf("%w: %q", ErrUnknownDevice, f.Device)
	}
	s.faults.set(f)
	close(s.faultsChanged)
	s.faultsChanged = make(chan struct{})
	s.log.Info("faults set", "device", f.Device, "latency_ms", f.LatencyMS, "error_rate", f.ErrorRate,
		"drop_response_rate", f.DropResponseRate, "hang", f.Hang, "reset_rate", f.ResetRate, "hang_after_apply", f.HangAfterApply, "exception", f.Exception)
	return nil
}

// FaultsOf returns the faults in force for dev.
func (s *Sim) FaultsOf(dev string) Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults.of(dev)
}

func applyAnswer(st json.RawMessage) []byte {
	return mustJSON(struct {
		Applied bool            `json:"applied"`
		State   json.RawMessage `json:"state"`
	}{true, st})
}

func errorAnswer(format string, a ...any) []byte {
	return mustJSON(struct {
		Error string `json:"error"`
	}{fmt.Sprintf(format, a...)})
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("sim: marshal answer: %v", err))
	}
	return b
}

func writeRaw(w http.ResponseWriter, code int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	// body may be a key's stored answer, shared by every repeat: never
	// append to it.
	w.Write(body)
	w.Write([]byte{'\n'})
}

func writeError(w http.ResponseWriter, code int, format string, a ...any) {
	writeRaw(w, code, errorAnswer(format, a...))
}

// dropConnection closes the request's connection without an answer.
func dropConnection(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler) // HTTP/2, or a hijack refused: the server aborts the stream
}
