package device

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"

	"github.com/edge-agent/edge-agent/internal/clip"
)

// ModbusPoint is one holding register (two for the 32-bit types) or one
// coil, at its zero-based address on the wire (holding register 0 is
// "40001" in Modicon notation).
type ModbusPoint struct {
	// Coil: the point is a coil (a bit); Type, Scale and LowWordFirst
	// are then unused.
	Coil    bool
	Address uint16
	// Type is uint16, int16, uint32, int32 or float32. "" means uint16.
	Type string
	// Scale: the engineering value is the raw value times Scale; a write
	// sends value / Scale. Zero means 1.
	Scale float64
	// LowWordFirst: a 32-bit value's low word is at Address (the zero
	// value: the high word is, as the Modbus specification orders bytes).
	LowWordFirst bool
}

// words is how many registers p takes (0 for a coil).
func (p ModbusPoint) words() int {
	switch {
	case p.Coil:
		return 0
	case p.Type == "uint32" || p.Type == "int32" || p.Type == "float32":
		return 2
	}
	return 1
}

func (p ModbusPoint) scale() float64 {
	if p.Scale == 0 {
		return 1
	}
	return p.Scale
}

func (p ModbusPoint) typ() string {
	if p.Type == "" {
		return "uint16"
	}
	return p.Type
}

// label names p's address in readings and reasons: "register 4", "coil 0".
func (p ModbusPoint) label() string {
	if p.Coil {
		return "coil " + strconv.Itoa(int(p.Address))
	}
	return "register " + strconv.Itoa(int(p.Address))
}

func (p ModbusPoint) check() error {
	if p.Coil {
		return nil
	}
	switch p.typ() {
	case "uint16", "int16", "uint32", "int32", "float32":
	default:
		return fmt.Errorf("type %q: want uint16, int16, uint32, int32 or float32", p.Type)
	}
	if int(p.Address)+p.words()-1 > math.MaxUint16 {
		return fmt.Errorf("register %d: a %s does not fit below 65536", p.Address, p.typ())
	}
	if s := p.scale(); math.IsNaN(s) || math.IsInf(s, 0) {
		return fmt.Errorf("scale %v: must be finite", s)
	}
	return nil
}

// raw is one point's value as on the wire: registers or a coil.
type raw struct {
	words []uint16
	bit   bool
}

// json is the raw value in readings: a number for one register, the
// registers in address order for two, true/false for a coil.
func (r raw) json(p ModbusPoint) any {
	switch {
	case p.Coil:
		return r.bit
	case len(r.words) == 1:
		return r.words[0]
	}
	return r.words
}

// FitsModbus checks that the raw value v (an engineering value divided by
// its point's scale) can be written as typ: an integer type needs an
// integral value within its range, float32 a finite one within its range.
// The driver applies it before anything is sent; the configuration check
// applies it to the fixed values of actions.
func FitsModbus(typ string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("not a finite number")
	}
	var lo, hi float64
	switch typ {
	case "uint16":
		hi = math.MaxUint16
	case "int16":
		lo, hi = math.MinInt16, math.MaxInt16
	case "uint32":
		hi = math.MaxUint32
	case "int32":
		lo, hi = math.MinInt32, math.MaxInt32
	case "float32":
		if math.Abs(v) > math.MaxFloat32 {
			return fmt.Errorf("%v does not fit a float32", v)
		}
		return nil
	default:
		return fmt.Errorf("unknown type %q", typ)
	}
	if v != math.Trunc(v) {
		return fmt.Errorf("%v is not an integer, which a %s register needs", v, typ)
	}
	if v < lo || v > hi {
		return fmt.Errorf("%v is out of the %s range %v..%v", v, typ, lo, hi)
	}
	return nil
}

// encode turns an engineering value (a JSON number for a register, a JSON
// boolean for a coil) into what is written. The error says why the value
// does not fit, before anything is sent.
func (p ModbusPoint) encode(v json.RawMessage) (raw, error) {
	v = bytes.TrimSpace(v)
	if p.Coil {
		switch string(v) {
		case "true":
			return raw{bit: true}, nil
		case "false":
			return raw{bit: false}, nil
		}
		return raw{}, fmt.Errorf("%s is not true or false, which %s takes", clipJSON(v), p.label())
	}
	if len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
		return raw{}, fmt.Errorf("%s is not a number, which %s takes", clipJSON(v), p.label())
	}
	f, err := strconv.ParseFloat(string(v), 64)
	if err != nil {
		return raw{}, fmt.Errorf("%s is not a number within range, which %s takes", clipJSON(v), p.label())
	}
	return p.encodeFloat(f)
}

func (p ModbusPoint) encodeFloat(f float64) (raw, error) {
	r := f / p.scale()
	if err := FitsModbus(p.typ(), r); err != nil {
		if p.scale() != 1 {
			return raw{}, fmt.Errorf("%v / scale %v: %v (%s)", f, p.scale(), err, p.label())
		}
		return raw{}, fmt.Errorf("%v (%s)", err, p.label())
	}
	var w32 uint32
	switch p.typ() {
	case "uint16":
		return raw{words: []uint16{uint16(r)}}, nil
	case "int16":
		return raw{words: []uint16{uint16(int16(r))}}, nil
	case "uint32":
		w32 = uint32(r)
	case "int32":
		w32 = uint32(int32(r))
	case "float32":
		w32 = math.Float32bits(float32(r))
	}
	hi, lo := uint16(w32>>16), uint16(w32)
	if p.LowWordFirst {
		return raw{words: []uint16{lo, hi}}, nil
	}
	return raw{words: []uint16{hi, lo}}, nil
}

// decode turns what was read into the engineering value, as JSON: an
// integer for the integer types at scale 1, else a number; true/false for
// a coil.
func (p ModbusPoint) decode(r raw) json.RawMessage {
	if p.Coil {
		return json.RawMessage(strconv.FormatBool(r.bit))
	}
	var w32 uint32
	if len(r.words) == 2 {
		hi, lo := r.words[0], r.words[1]
		if p.LowWordFirst {
			hi, lo = lo, hi
		}
		w32 = uint32(hi)<<16 | uint32(lo)
	}
	var v float64
	switch p.typ() {
	case "uint16":
		v = float64(r.words[0])
	case "int16":
		v = float64(int16(r.words[0]))
	case "uint32":
		v = float64(w32)
	case "int32":
		v = float64(int32(w32))
	case "float32":
		f := float64(math.Float32frombits(w32)) * p.scale()
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return json.RawMessage("null") // JSON has no NaN: the device holds no number
		}
		if p.scale() == 1 {
			return json.RawMessage(strconv.FormatFloat(f, 'g', -1, 32))
		}
		return json.RawMessage(strconv.FormatFloat(f, 'g', -1, 64))
	}
	if p.scale() == 1 {
		return json.RawMessage(strconv.FormatInt(int64(v), 10))
	}
	return json.RawMessage(strconv.FormatFloat(v*p.scale(), 'g', -1, 64))
}

// readings is points' raw values as one canonical JSON object keyed by
// label (sorted keys), e.g. {"coil 0":true,"register 0":1200}: what the
// pending record keeps before a write and what a read-back compares.
func readings(points []ModbusPoint, vals []raw) json.RawMessage {
	m := make(map[string]any, len(points))
	for i, p := range points {
		m[p.label()] = vals[i].json(p)
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err) // numbers, bools and slices of numbers only
	}
	return b
}

// stateJSON is the named values as a JSON object with sorted keys.
func stateJSON(vals map[string]json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range slices.Sorted(maps.Keys(vals)) {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		b.Write(vals[k])
	}
	b.WriteByte('}')
	return b.Bytes()
}

func clipJSON(v []byte) string {
	if len(v) == 0 {
		return "nothing"
	}
	return clip.Bytes(v, 40)
}
