package device

import (
	"maps"
	"math"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/config"
)

// ModbusConfig is the `driver:` block of a device with kind: modbus
// (docs/config.md, "Modbus devices"), as written; Device resolves it.
type ModbusConfig struct {
	URL        string          `yaml:"url"`
	Timeout    config.Duration `yaml:"timeout"` // default DefaultModbusTimeout
	ModbusKeys `yaml:",inline"`
	// The keys of kind: http, each refused with a sentence saying why.
	Retries    int  `yaml:"retries"`
	Idempotent bool `yaml:"idempotent"`
	Queryable  bool `yaml:"queryable"`
}

// ModbusKeys are the keys only kind: modbus has.
type ModbusKeys struct {
	// UnitID is the Modbus unit identifier (1..255). Nil means 1.
	UnitID *int `yaml:"unit_id"`
	// Verify is "" (an unknown write holds for an operator) or "readback"
	// (an unknown write is resolved by reading the written points back).
	Verify string `yaml:"verify"`
	// Settle is the quiet period before a read-back (after the connection
	// was closed and before it is opened again). Zero means
	// DefaultModbusSettle; only with verify: readback.
	Settle config.Duration `yaml:"settle"`
	// Actions maps each command action to the writes it makes.
	Actions map[string]*ModbusActionConfig `yaml:"actions"`
	// State maps each key of the device's state to the point it is read
	// from after every applied write (and by a read-back).
	State map[string]*ModbusPointConfig `yaml:"state"`
}

// ModbusPointConfig is a ModbusPoint as written: one holding register (or
// a pair of them, for the 32-bit types) or one coil, at its zero-based
// address on the wire.
type ModbusPointConfig struct {
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

// ModbusActionConfig is a ModbusAction as written: each of Params' points
// is written with the command's parameter of that name, and the inline
// point, when set, is written with Value (a fixed write, e.g. a coil).
type ModbusActionConfig struct {
	Params            map[string]*ModbusPointConfig `yaml:"params"`
	ModbusPointConfig `yaml:",inline"`
	Value             any `yaml:"value"`
}

// Limits of a kind: modbus block.
const (
	DefaultModbusUnitID = 1
	MaxModbusSettle     = time.Minute
	MaxModbusPoints     = 32 // writes of one action, and state points
	// MinModbusRTUTimeout is the shortest timeout of an rtuovertcp://
	// device: the library paces each RTU request as on a 19200 bps serial
	// line (about 9 ms a request, BenchmarkModbusApply), so a shorter
	// one would end every write unknown.
	MinModbusRTUTimeout = 20 * time.Millisecond
)

// modbusWords are the register types, each with how many registers it
// takes.
var modbusWords = map[string]int{"uint16": 1, "int16": 1, "uint32": 2, "int32": 2, "float32": 2}

var actionRe = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

func init() {
	config.RegisterDriver("modbus", func() config.DriverConfig { return &ModbusConfig{} })
}

// set reports whether any of the keys was given.
func (m *ModbusKeys) set() bool {
	return m.UnitID != nil || m.Verify != "" || m.Settle != 0 || m.Actions != nil || m.State != nil
}

// Defaults implements config.DriverConfig.
func (c *ModbusConfig) Defaults() {
	if c.Timeout == 0 {
		c.Timeout = config.Duration(DefaultModbusTimeout)
	}
	if c.UnitID == nil {
		u := DefaultModbusUnitID
		c.UnitID = &u
	}
	if c.Verify == "readback" && c.Settle == 0 {
		c.Settle = config.Duration(DefaultModbusSettle)
	}
	for _, a := range c.Actions {
		if a == nil {
			continue
		}
		for _, pt := range a.Params {
			pt.defaults()
		}
		if a.Register != nil || a.Coil != nil {
			a.ModbusPointConfig.defaults()
		}
	}
	for _, pt := range c.State {
		pt.defaults()
	}
}

func (pt *ModbusPointConfig) defaults() {
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
	if pt.WordOrder == "" && modbusWords[pt.Type] == 2 {
		pt.WordOrder = "high_first"
	}
}

// Check implements config.DriverConfig.
func (c *ModbusConfig) Check(p *config.Problems, k string) {
	scheme, hostport, ok := strings.Cut(c.URL, "://")
	switch {
	case c.URL == "":
		p.Add(k+".url", "required: tcp://host:port or rtuovertcp://host:port")
	case !ok || (scheme != "tcp" && scheme != "rtuovertcp"):
		p.Add(k+".url", "%q: want tcp://host:port or rtuovertcp://host:port", c.URL)
	default:
		if host, port, err := net.SplitHostPort(hostport); err != nil || host == "" || !validPort(port) {
			p.Add(k+".url", "%q: want %s://host:port (e.g. %s://10.0.0.7:502)", c.URL, scheme, scheme)
		}
	}
	if scheme == "rtuovertcp" && c.Timeout.D() < MinModbusRTUTimeout {
		p.Add(k+".timeout", "%v is too short for rtuovertcp://: the library paces each RTU request as on a 19200 bps serial line (about 9 ms); at least %v", c.Timeout.D(), MinModbusRTUTimeout)
	}
	if c.Retries != 0 {
		p.Add(k+".retries", "only with kind: http (a Modbus write has no key, so it is never tried twice)")
	}
	if c.Idempotent {
		p.Add(k+".idempotent", "only with kind: http")
	}
	if c.Queryable {
		p.Add(k+".queryable", "only with kind: http; a Modbus device is resolved by verify: readback")
	}
	if u := *c.UnitID; u < 1 || u > 255 {
		p.Add(k+".unit_id", "%d: must be from 1 to 255", u)
	}
	switch c.Verify {
	case "", "readback":
	default:
		p.Add(k+".verify", "%q: want readback, or leave it out", c.Verify)
	}
	switch {
	case c.Settle != 0 && c.Verify != "readback":
		p.Add(k+".settle", "only with verify: readback")
	case c.Settle < 0 || c.Settle.D() > MaxModbusSettle:
		p.Add(k+".settle", "%v: must be from 0 to %v", c.Settle.D(), MaxModbusSettle)
	}
	if len(c.Actions) == 0 {
		p.Add(k+".actions", "at least one action is required")
	}
	for _, name := range slices.Sorted(maps.Keys(c.Actions)) {
		checkModbusAction(p, k+".actions."+name, name, c.Actions[name])
	}
	if len(c.State) > MaxModbusPoints {
		p.Add(k+".state", "%d points: at most %d", len(c.State), MaxModbusPoints)
	}
	for _, name := range slices.Sorted(maps.Keys(c.State)) {
		checkPoint(p, k+".state."+name, c.State[name])
	}
	checkTimeoutRetries(p, k, c.Timeout, c.Retries)
}

func checkModbusAction(p *config.Problems, k, name string, a *ModbusActionConfig) {
	switch {
	case !actionRe.MatchString(name):
		p.Add(k, "action %q must match [a-z][a-z0-9_]{0,63}", name)
	case name == wire.ActionFence:
		p.Add(k, "fence is the reserved barrier action; it never reaches the device")
	}
	if a == nil {
		p.Add(k, "empty: give params, or a register or coil with a value")
		return
	}
	fixed := a.Register != nil || a.Coil != nil
	if !fixed && a.Value != nil {
		p.Add(k+".value", "only with register or coil")
	}
	if !fixed && len(a.Params) == 0 {
		p.Add(k, "writes nothing: give params, or a register or coil with a value")
	}
	n := len(a.Params)
	if fixed {
		n++
	}
	if n > MaxModbusPoints {
		p.Add(k, "%d writes: at most %d", n, MaxModbusPoints)
	}
	used := map[string]string{} // register/coil address -> what writes it
	claim := func(what string, pt *ModbusPointConfig) {
		if pt == nil {
			return
		}
		for _, addr := range pt.addresses() {
			if other, dup := used[addr]; dup {
				p.Add(k, "%s and %s both write %s", other, what, addr)
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
		checkPoint(p, k, &a.ModbusPointConfig)
		claim("the fixed write", &a.ModbusPointConfig)
		switch v := a.Value.(type) {
		case nil:
			p.Add(k+".value", "required with register or coil")
		case bool:
			if a.Coil == nil {
				p.Add(k+".value", "%v: a register takes a number", v)
			}
		default:
			f, ok := number(v)
			switch {
			case !ok:
				p.Add(k+".value", "%v: want a number (register) or true/false (coil)", v)
			case a.Coil != nil:
				p.Add(k+".value", "%v: a coil takes true or false", v)
			case a.Register != nil && a.Scale != nil && *a.Scale != 0:
				if err := FitsModbus(a.Type, f / *a.Scale); err != nil {
					p.Add(k+".value", "%v: %v", v, err)
				}
			}
		}
	}
}

// checkPoint checks one register or coil.
func checkPoint(p *config.Problems, k string, pt *ModbusPointConfig) {
	if pt == nil {
		p.Add(k, "empty: give register or coil")
		return
	}
	switch {
	case pt.Register == nil && pt.Coil == nil:
		p.Add(k, "give register or coil")
	case pt.Register != nil && pt.Coil != nil:
		p.Add(k, "register or coil, not both")
	case pt.Coil != nil:
		if *pt.Coil < 0 || *pt.Coil > math.MaxUint16 {
			p.Add(k+".coil", "%d: must be from 0 to 65535", *pt.Coil)
		}
		if pt.Type != "" || pt.Scale != nil || pt.WordOrder != "" {
			p.Add(k, "type, scale and word_order are for registers; a coil is a bit")
		}
	default:
		words, ok := modbusWords[pt.Type]
		if !ok {
			p.Add(k+".type", "%q: want uint16, int16, uint32, int32 or float32", pt.Type)
			words = 1
		}
		if r := *pt.Register; r < 0 || r+words-1 > math.MaxUint16 {
			p.Add(k+".register", "%d: must be from 0 to %d", r, math.MaxUint16-words+1)
		}
		if s := *pt.Scale; s == 0 || math.IsNaN(s) || math.IsInf(s, 0) {
			p.Add(k+".scale", "%v: must be a finite number other than 0", s)
		}
		switch {
		case words == 1 && pt.WordOrder != "":
			p.Add(k+".word_order", "only for the 32-bit types")
		case words == 2 && pt.WordOrder != "high_first" && pt.WordOrder != "low_first":
			p.Add(k+".word_order", "%q: want high_first or low_first", pt.WordOrder)
		}
	}
}

// addresses are the wire addresses pt occupies, e.g. "register 4".
func (pt *ModbusPointConfig) addresses() []string {
	if pt.Coil != nil {
		return []string{"coil " + strconv.Itoa(*pt.Coil)}
	}
	if pt.Register == nil {
		return nil
	}
	out := []string{"register " + strconv.Itoa(*pt.Register)}
	if modbusWords[pt.Type] == 2 {
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

// Device is the block as the driver takes it (Defaults applied, Check
// passed).
func (c *ModbusConfig) Device() ModbusDevice {
	md := ModbusDevice{URL: c.URL, UnitID: uint8(*c.UnitID), Timeout: c.Timeout.D(),
		ReadBack: c.Verify == "readback", Settle: c.Settle.D(),
		Actions: map[string]ModbusAction{}, State: map[string]ModbusPoint{}}
	for name, a := range c.Actions {
		ma := ModbusAction{Params: map[string]ModbusPoint{}}
		for p, pt := range a.Params {
			ma.Params[p] = pt.point()
		}
		if a.Register != nil || a.Coil != nil {
			v := a.Value
			if i, ok := v.(int); ok {
				v = float64(i)
			}
			ma.Fixed = &ModbusFixed{Point: a.ModbusPointConfig.point(), Value: v}
		}
		md.Actions[name] = ma
	}
	for k, pt := range c.State {
		md.State[k] = pt.point()
	}
	return md
}

func (pt *ModbusPointConfig) point() ModbusPoint {
	if pt.Coil != nil {
		return ModbusPoint{Coil: true, Address: uint16(*pt.Coil)}
	}
	return ModbusPoint{Address: uint16(*pt.Register), Type: pt.Type, Scale: *pt.Scale, LowWordFirst: pt.WordOrder == "low_first"}
}
