package config

import (
	"maps"
	"math"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edge-agent/edge-agent/internal/device"

	"github.com/edge-agent/edge-agent/wire"
)

// Modbus is the part of a device's `driver:` block that only `kind: modbus`
// uses (docs/config.md, "Modbus devices"). It is inlined into Driver, so
// its keys sit next to kind, url and timeout.
type Modbus struct {
	// UnitID is the Modbus unit identifier (1..255). Nil means 1.
	UnitID *int `yaml:"unit_id"`
	// Verify is "" (an unknown write holds for an operator) or "readback"
	// (an unknown write is resolved by reading the written points back).
	Verify string `yaml:"verify"`
	// Settle is the quiet period before a read-back (after the connection
	// was closed and before it is opened again). Zero means
	// DefaultModbusSettle; only with verify: readback.
	Settle Duration `yaml:"settle"`
	// Actions maps each command action to the writes it makes.
	Actions map[string]*ModbusAction `yaml:"actions"`
	// State maps each key of the device's state to the point it is read
	// from after every applied write (and by a read-back).
	State map[string]*ModbusPoint `yaml:"state"`
}

// ModbusPoint is one holding register (or a pair of them, for the 32-bit
// types) or one coil. Addresses are the zero-based addresses on the wire
// (holding register 0 is "40001" in Modicon notation).
type ModbusPoint struct {
	Register *int `yaml:"register"`
	Coil     *int `yaml:"coil"`
	// Type of a register point: uint16 (default), int16, uint32, int32
	// or float32. Coils have none.
	Type string `yaml:"type"`
	// Scale: the engineering value is the raw value times Scale (a write
	// sends value / scale). Nil means 1. Registers only.
	Scale *float64 `yaml:"scale"`
	// WordOrder of the 32-bit types: high_first (default) or low_first.
	WordOrder string `yaml:"word_order"`
}

// ModbusAction is what one command action writes: each of Params' points
// is written with the command's parameter of that name, and the inline
// point, when set, is written with Value (a fixed write, e.g. a coil).
type ModbusAction struct {
	Params      map[string]*ModbusPoint `yaml:"params"`
	ModbusPoint `yaml:",inline"`
	Value       any `yaml:"value"`
}

// Defaults and limits of Modbus devices.
const (
	DefaultModbusTimeout = time.Second
	DefaultModbusSettle  = time.Second
	DefaultModbusUnitID  = 1
	MaxModbusSettle      = time.Minute
	MaxModbusPoints      = 32 // writes of one action, and state points
	// MinModbusRTUTimeout is the shortest timeout of an rtuovertcp://
	// device: the library paces each RTU request as on a 19200 bps serial
	// line (about 9 ms a request, BenchmarkModbusApply), so a shorter
	// one would end every write unknown.
	MinModbusRTUTimeout = 20 * time.Millisecond
)

// ModbusTypes are the register types; Words says how many registers each
// takes.
var ModbusTypes = map[string]int{"uint16": 1, "int16": 1, "uint32": 2, "int32": 2, "float32": 2}

var actionRe = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

// set reports whether any Modbus key was given.
func (m *Modbus) set() bool {
	return m.UnitID != nil || m.Verify != "" || m.Settle != 0 || m.Actions != nil || m.State != nil
}

// modbusDefaults fills in the defaults of a kind: modbus driver before the
// common ones (its timeout default is its own).
func (dr *Driver) modbusDefaults() {
	if dr.Kind != "modbus" {
		return
	}
	if dr.Timeout == 0 {
		dr.Timeout = Duration(DefaultModbusTimeout)
	}
	if dr.UnitID == nil {
		u := DefaultModbusUnitID
		dr.UnitID = &u
	}
	if dr.Verify == "readback" && dr.Settle == 0 {
		dr.Settle = Duration(DefaultModbusSettle)
	}
	for _, a := range dr.Actions {
		if a == nil {
			continue
		}
		for _, pt := range a.Params {
			pt.defaults()
		}
		if a.Register != nil || a.Coil != nil {
			a.ModbusPoint.defaults()
		}
	}
	for _, pt := range dr.State {
		pt.defaults()
	}
}

func (pt *ModbusPoint) defaults() {
	if pt == nil || pt.Register == nil {
		return
	}
	if pt.Type == "" {
		pt.Type = "uint16"
	}
	if pt.Scale == nil {
		s := 1.0
		pt.Scale = &s
	}
	if pt.WordOrder == "" && ModbusTypes[pt.Type] == 2 {
		pt.WordOrder = "high_first"
	}
}

// checkHTTPOnly reports the Modbus keys on a kind: http driver.
func (dr *Driver) checkHTTP(p *problems, key string) {
	switch {
	case dr.URL == "":
		p.add(key+".driver.url", "required")
	case !strings.HasPrefix(dr.URL, "http://") && !strings.HasPrefix(dr.URL, "https://"):
		p.add(key+".driver.url", "%q: want http:// or https://", dr.URL)
	}
	if dr.Modbus.set() {
		p.add(key+".driver", "unit_id, verify, settle, actions and state are only for kind: modbus")
	}
}

// checkModbus adds a problem for every rule a kind: modbus driver breaks.
func (dr *Driver) checkModbus(p *problems, key string) {
	k := key + ".driver"
	scheme, hostport, ok := strings.Cut(dr.URL, "://")
	switch {
	case dr.URL == "":
		p.add(k+".url", "required: tcp://host:port or rtuovertcp://host:port")
	case !ok || (scheme != "tcp" && scheme != "rtuovertcp"):
		p.add(k+".url", "%q: want tcp://host:port or rtuovertcp://host:port", dr.URL)
	default:
		if host, port, err := net.SplitHostPort(hostport); err != nil || host == "" || !validPort(port) {
			p.add(k+".url", "%q: want %s://host:port (e.g. %s://10.0.0.7:502)", dr.URL, scheme, scheme)
		}
	}
	if scheme == "rtuovertcp" && dr.Timeout.D() < MinModbusRTUTimeout {
		p.add(k+".timeout", "%v is too short for rtuovertcp://: the library paces each RTU request as on a 19200 bps serial line (about 9 ms); at least %v", dr.Timeout.D(), MinModbusRTUTimeout)
	}
	if *dr.Retries != 0 {
		p.add(k+".retries", "only with kind: http (a Modbus write has no key, so it is never tried twice)")
	}
	if dr.Idempotent {
		p.add(k+".idempotent", "only with kind: http")
	}
	if dr.Queryable {
		p.add(k+".queryable", "only with kind: http; a Modbus device is resolved by verify: readback")
	}
	if u := *dr.UnitID; u < 1 || u > 255 {
		p.add(k+".unit_id", "%d: must be from 1 to 255", u)
	}
	switch dr.Verify {
	case "", "readback":
	default:
		p.add(k+".verify", "%q: want readback, or leave it out", dr.Verify)
	}
	switch {
	case dr.Settle != 0 && dr.Verify != "readback":
		p.add(k+".settle", "only with verify: readback")
	case dr.Settle < 0 || dr.Settle.D() > MaxModbusSettle:
		p.add(k+".settle", "%v: must be from 0 to %v", dr.Settle.D(), MaxModbusSettle)
	}
	if len(dr.Actions) == 0 {
		p.add(k+".actions", "at least one action is required")
	}
	for _, name := range slices.Sorted(maps.Keys(dr.Actions)) {
		dr.checkModbusAction(p, k+".actions."+name, name, dr.Actions[name])
	}
	if len(dr.State) > MaxModbusPoints {
		p.add(k+".state", "%d points: at most %d", len(dr.State), MaxModbusPoints)
	}
	for _, name := range slices.Sorted(maps.Keys(dr.State)) {
		checkPoint(p, k+".state."+name, dr.State[name])
	}
}

func (dr *Driver) checkModbusAction(p *problems, k, name string, a *ModbusAction) {
	switch {
	case !actionRe.MatchString(name):
		p.add(k, "action %q must match [a-z][a-z0-9_]{0,63}", name)
	case name == wire.ActionFence:
		p.add(k, "fence is the reserved barrier action; it never reaches the device")
	}
	if a == nil {
		p.add(k, "empty: give params, or a register or coil with a value")
		return
	}
	fixed := a.Register != nil || a.Coil != nil
	if !fixed && a.Value != nil {
		p.add(k+".value", "only with register or coil")
	}
	if !fixed && len(a.Params) == 0 {
		p.add(k, "writes nothing: give params, or a register or coil with a value")
	}
	n := len(a.Params)
	if fixed {
		n++
	}
	if n > MaxModbusPoints {
		p.add(k, "%d writes: at most %d", n, MaxModbusPoints)
	}
	used := map[string]string{} // register/coil address -> what writes it
	claim := func(what string, pt *ModbusPoint) {
		if pt == nil {
			return
		}
		for _, addr := range pt.addresses() {
			if other, dup := used[addr]; dup {
				p.add(k, "%s and %s both write %s", other, what, addr)
				return
			}
			used[addr] = what
		}
	}
	for _, param := range slices.Sorted(maps.Keys(a.Params)) {
		checkPoint(p, k+".params."+param, a.Params[param])
		claim("params."+param, a.Params[param])
	}
	if fixed {
		checkPoint(p, k, &a.ModbusPoint)
		claim("the fixed write", &a.ModbusPoint)
		switch v := a.Value.(type) {
		case nil:
			p.add(k+".value", "required with register or coil")
		case bool:
			if a.Coil == nil {
				p.add(k+".value", "%v: a register takes a number", v)
			}
		default:
			f, ok := number(v)
			switch {
			case !ok:
				p.add(k+".value", "%v: want a number (register) or true/false (coil)", v)
			case a.Coil != nil:
				p.add(k+".value", "%v: a coil takes true or false", v)
			case a.Register != nil && a.Scale != nil && *a.Scale != 0:
				if err := device.FitsModbus(a.Type, f / *a.Scale); err != nil {
					p.add(k+".value", "%v: %v", v, err)
				}
			}
		}
	}
}

// checkPoint checks one register or coil.
func checkPoint(p *problems, k string, pt *ModbusPoint) {
	if pt == nil {
		p.add(k, "empty: give register or coil")
		return
	}
	switch {
	case pt.Register == nil && pt.Coil == nil:
		p.add(k, "give register or coil")
	case pt.Register != nil && pt.Coil != nil:
		p.add(k, "register or coil, not both")
	case pt.Coil != nil:
		if *pt.Coil < 0 || *pt.Coil > math.MaxUint16 {
			p.add(k+".coil", "%d: must be from 0 to 65535", *pt.Coil)
		}
		if pt.Type != "" || pt.Scale != nil || pt.WordOrder != "" {
			p.add(k, "type, scale and word_order are for registers; a coil is a bit")
		}
	default:
		words, ok := ModbusTypes[pt.Type]
		if !ok {
			p.add(k+".type", "%q: want uint16, int16, uint32, int32 or float32", pt.Type)
			words = 1
		}
		if r := *pt.Register; r < 0 || r+words-1 > math.MaxUint16 {
			p.add(k+".register", "%d: must be from 0 to %d", r, math.MaxUint16-words+1)
		}
		if s := *pt.Scale; s == 0 || math.IsNaN(s) || math.IsInf(s, 0) {
			p.add(k+".scale", "%v: must be a finite number other than 0", s)
		}
		switch {
		case words == 1 && pt.WordOrder != "":
			p.add(k+".word_order", "only for the 32-bit types")
		case words == 2 && pt.WordOrder != "high_first" && pt.WordOrder != "low_first":
			p.add(k+".word_order", "%q: want high_first or low_first", pt.WordOrder)
		}
	}
}

// addresses are the wire addresses pt occupies, e.g. "register 4".
func (pt *ModbusPoint) addresses() []string {
	if pt.Coil != nil {
		return []string{"coil " + strconv.Itoa(*pt.Coil)}
	}
	if pt.Register == nil {
		return nil
	}
	out := []string{"register " + strconv.Itoa(*pt.Register)}
	if ModbusTypes[pt.Type] == 2 {
		out = append(out, "register "+strconv.Itoa(*pt.Register+1))
	}
	return out
}

func number(v any) (float64, bool) {
	switch x := v.(type) {
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case uint64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

func validPort(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= 1 && n <= 65535
}
