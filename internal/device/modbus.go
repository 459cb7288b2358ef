package device

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/simonvetter/modbus"
)

// Defaults of ModbusDevice and ModbusOptions.
const (
	DefaultModbusTimeout = time.Second
	DefaultModbusSettle  = time.Second
	// modbusDial is the library's own bound on opening a connection.
	modbusDial = 5 * time.Second
	// DefaultProbeIdle: a connection idle longer than this is read from
	// before a write is sent on it, so that a connection the device has
	// dropped meanwhile is found out before the write, not by it.
	DefaultProbeIdle = time.Second
)

// ModbusDevice is the driver configuration of one Modbus TCP device (the
// `driver:` block of a device with kind: modbus; docs/config.md).
type ModbusDevice struct {
	// URL is tcp://host:port, or rtuovertcp://host:port for RTU framing
	// over TCP. Required.
	URL string
	// UnitID is the Modbus unit identifier. Zero means 1.
	UnitID uint8
	// Timeout bounds each request. Zero means DefaultModbusTimeout (1s).
	Timeout time.Duration
	// ReadBack (verify: readback) resolves an unknown write by reading
	// the written points back (ReadBacker). False (the zero value): the
	// device cannot be asked, and an unknown write waits for an operator.
	ReadBack bool
	// Settle is the quiet period before a read-back. Zero means
	// DefaultModbusSettle (1s).
	Settle time.Duration
	// Actions maps each command action to its writes. At least one.
	Actions map[string]ModbusAction
	// State maps state keys to the points read after every applied write
	// and by a read-back. Nil: the device reports no state.
	State map[string]ModbusPoint
}

// ModbusAction is what one action writes, in this order: each of Params'
// points with the command's parameter of that name (in address order),
// then Fixed, when set.
type ModbusAction struct {
	Params map[string]ModbusPoint
	Fixed  *ModbusFixed
}

// ModbusFixed is a write of a fixed value: a bool for a coil, a float64
// (engineering value) for a register.
type ModbusFixed struct {
	Point ModbusPoint
	Value any
}

// ModbusOptions configure a Modbus driver. The zero value is usable.
type ModbusOptions struct {
	// Logger receives one debug line per request and a warning per
	// unknown write; nil discards them.
	Logger *slog.Logger
	// Devices are configured as by Add. Nil means none yet.
	Devices map[string]ModbusDevice
	// ProbeIdle: see DefaultProbeIdle. Zero means the default; negative:
	// never probe.
	ProbeIdle time.Duration
}

// Modbus is the Driver for Modbus TCP devices, on github.com/simonvetter/modbus.
// It keeps one connection per device, opened when needed and again after
// any failure, with backoff between failed dials. It is safe for
// concurrent use; the requests of one device go one at a time.
//
// A write ends in one outcome (docs/protocol.md, "Modbus devices"): all
// its requests answered is Applied; a parameter that does not fit its
// point, or an exception that says the device did nothing (illegal
// function, address or value; busy) to the first request, is Refused; no
// connection is NotSent; anything else once a request was sent (a
// timeout, a dropped connection, any other exception, a failure after an
// earlier request of the same write succeeded) is Unknown.
type Modbus struct {
	log       *slog.Logger
	libLog    *log.Logger
	probeIdle time.Duration

	mu      sync.RWMutex
	devices map[string]*mbDevice
}

type mbDevice struct {
	id  string
	cfg ModbusDevice

	mu       sync.Mutex // one request at a time; guards the fields below
	client   *modbus.ModbusClient
	lastUse  time.Time
	fails    int
	nextDial time.Time
	lastErr  error
}

// NewModbus returns a driver for opts.Devices. It does no I/O.
func NewModbus(opts ModbusOptions) (*Modbus, error) {
	m := &Modbus{log: opts.Logger, probeIdle: opts.ProbeIdle, devices: map[string]*mbDevice{}}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if m.probeIdle == 0 {
		m.probeIdle = DefaultProbeIdle
	}
	// The library logs its warnings (e.g. an unexpected transaction ID)
	// through a log.Logger, to stdout when given none.
	m.libLog = slog.NewLogLogger(m.log.Handler(), slog.LevelDebug)
	for dev, cfg := range opts.Devices {
		if err := m.Add(dev, cfg); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Add configures one more device. It fails with ErrInvalidConfig (naming
// the device and the field) or ErrDuplicateDevice.
func (m *Modbus) Add(dev string, cfg ModbusDevice) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: device %s: %s", ErrInvalidConfig, dev, fmt.Sprintf(format, a...))
	}
	if dev == "" || strings.Contains(dev, "/") {
		return fmt.Errorf("%w: device ID %q", ErrInvalidConfig, dev)
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "tcp" && u.Scheme != "rtuovertcp") || u.Port() == "" || u.Hostname() == "" || u.Path != "" {
		return bad("url %q: want tcp://host:port or rtuovertcp://host:port", cfg.URL)
	}
	if cfg.Timeout < 0 || cfg.Settle < 0 {
		return bad("timeout and settle must not be negative")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultModbusTimeout
	}
	if cfg.Settle == 0 {
		cfg.Settle = DefaultModbusSettle
	}
	if cfg.UnitID == 0 {
		cfg.UnitID = 1
	}
	if len(cfg.Actions) == 0 {
		return bad("actions: at least one")
	}
	for name, a := range cfg.Actions {
		if len(a.Params) == 0 && a.Fixed == nil {
			return bad("actions.%s: writes nothing", name)
		}
		for p, pt := range a.Params {
			if err := pt.check(); err != nil {
				return bad("actions.%s.params.%s: %v", name, p, err)
			}
		}
		if f := a.Fixed; f != nil {
			if err := f.Point.check(); err != nil {
				return bad("actions.%s: %v", name, err)
			}
			if _, err := f.raw(); err != nil {
				return bad("actions.%s.value: %v", name, err)
			}
		}
	}
	for k, pt := range cfg.State {
		if err := pt.check(); err != nil {
			return bad("state.%s: %v", k, err)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, dup := m.devices[dev]; dup {
		return fmt.Errorf("%w: %s", ErrDuplicateDevice, dev)
	}
	m.devices[dev] = &mbDevice{id: dev, cfg: cfg}
	return nil
}

func (f *ModbusFixed) raw() (raw, error) {
	switch v := f.Value.(type) {
	case bool:
		if f.Point.Coil {
			return raw{bit: v}, nil
		}
	case float64:
		if !f.Point.Coil {
			return f.Point.encodeFloat(v)
		}
	case int:
		if !f.Point.Coil {
			return f.Point.encodeFloat(float64(v))
		}
	}
	return raw{}, fmt.Errorf("%v does not suit %s", f.Value, f.Point.label())
}

// Close closes every device's connection. The driver stays usable: the
// next request opens a connection again.
func (m *Modbus) Close() error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, d := range m.devices {
		d.mu.Lock()
		d.drop()
		d.mu.Unlock()
	}
	return nil
}

func (m *Modbus) device(dev string) *mbDevice {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.devices[dev]
}

// Queryable reports whether dev is read back (verify: readback): only then
// can the agent resolve an unknown write itself.
func (m *Modbus) Queryable(dev string) bool { return m.ReadsBack(dev) }

// ReadsBack reports whether dev is configured verify: readback.
func (m *Modbus) ReadsBack(dev string) bool {
	d := m.device(dev)
	return d != nil && d.cfg.ReadBack
}

// Query is refused: a Modbus write has no key to ask about
// (ErrNotQueryable); a device configured verify: readback is resolved by
// ReadBack.
func (m *Modbus) Query(ctx context.Context, dev, key string) (QueryResult, error) {
	return QueryResult{}, fmt.Errorf("device %s: %w: Modbus has no keys (verify: readback resolves by reading back)", dev, ErrNotQueryable)
}

// Bounds: a write is at most a dial, a probe, its writes and the state
// read; a read-back is the settle time, a dial and its reads.
func (m *Modbus) Bounds(dev string) (write, query time.Duration) {
	d := m.device(dev)
	if d == nil {
		return time.Second, time.Second
	}
	most := 0
	for _, a := range d.cfg.Actions {
		most = max(most, len(a.Params)+1)
	}
	reqs := time.Duration(most + len(d.cfg.State) + 2)
	return modbusDial + reqs*d.cfg.Timeout + time.Second,
		d.cfg.Settle + modbusDial + reqs*d.cfg.Timeout + time.Second
}

// planned is one request of a write: a point and what is written to it.
type planned struct {
	param string // "" for a fixed write
	point ModbusPoint
	val   raw
}

// plan is what w writes, in order. An error (wrapping ErrRefused) names
// the parameter and why: nothing may be sent.
func (d *mbDevice) plan(w Write) ([]planned, error) {
	a, ok := d.cfg.Actions[w.Action]
	if !ok {
		names := make([]string, 0, len(d.cfg.Actions))
		for n := range d.cfg.Actions {
			names = append(names, n)
		}
		slices.Sort(names)
		return nil, fmt.Errorf("%w: action %q is not configured for %s (it has %s)", ErrRefused, w.Action, d.id, strings.Join(names, ", "))
	}
	var params map[string]json.RawMessage
	if p := bytes.TrimSpace(w.Params); len(p) > 0 && string(p) != "null" {
		if err := json.Unmarshal(p, &params); err != nil {
			return nil, fmt.Errorf("%w: params: not a JSON object: %v", ErrRefused, err)
		}
	}
	for _, name := range sortedNames(params) {
		if _, ok := a.Params[name]; !ok {
			return nil, fmt.Errorf("%w: param %s: action %s does not write it", ErrRefused, name, w.Action)
		}
	}
	out := make([]planned, 0, len(a.Params)+1)
	for _, name := range sortedNames(a.Params) {
		pt := a.Params[name]
		v, ok := params[name]
		if !ok {
			return nil, fmt.Errorf("%w: param %s: required by action %s", ErrRefused, name, w.Action)
		}
		r, err := pt.encode(v)
		if err != nil {
			return nil, fmt.Errorf("%w: param %s: %v", ErrRefused, name, err)
		}
		out = append(out, planned{param: name, point: pt, val: r})
	}
	slices.SortStableFunc(out, func(x, y planned) int { return int(x.point.Address) - int(y.point.Address) })
	if f := a.Fixed; f != nil {
		r, err := f.raw()
		if err != nil {
			return nil, fmt.Errorf("%w: action %s: %v", ErrRefused, w.Action, err)
		}
		out = append(out, planned{point: f.Point, val: r})
	}
	return out, nil
}

func sortedNames[V any](m map[string]V) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func points(ps []planned) []ModbusPoint {
	out := make([]ModbusPoint, len(ps))
	for i, p := range ps {
		out[i] = p.point
	}
	return out
}
