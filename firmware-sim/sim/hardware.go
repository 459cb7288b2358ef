package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
)

// The device types of docs/protocol.md §2.
const (
	TypePump    = "pump"
	TypeValve   = "valve"
	TypeRelay   = "relay"
	TypeGeneric = "generic"
)

// refusal is a write the hardware does not accept (HTTP 422). Its message
// starts with the parameter (or "action") it is about.
type refusal struct{ msg string }

func (r *refusal) Error() string { return r.msg }

func refuse(format string, a ...any) error { return &refusal{fmt.Sprintf(format, a...)} }

// state is a device's state: a JSON object. Values are int64, bool or
// json.RawMessage (generic devices keep the params as received). A state is
// never modified in place: a write makes a new one, so a stored answer can
// keep referring to the state it reported.
type state map[string]any

func (s state) JSON() json.RawMessage {
	b, err := json.Marshal(s)
	if err != nil { // cannot happen: the values are int64, bool or valid JSON
		panic(fmt.Sprintf("sim: marshal state: %v", err))
	}
	return b
}

func knownType(typ string) bool {
	switch typ {
	case TypePump, TypeValve, TypeRelay, TypeGeneric:
		return true
	}
	return false
}

func initialState(typ string) state {
	switch typ {
	case TypePump:
		return state{"rpm": int64(0)}
	case TypeValve:
		return state{"open": int64(0)}
	case TypeRelay:
		return state{"on": false}
	}
	return state{}
}

// decodeParams reads a write's params: absent or null is {}, anything
// else must be a JSON object. It returns the compacted object (what the
// journal records) and its members.
func decodeParams(raw json.RawMessage) (json.RawMessage, map[string]json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return json.RawMessage(`{}`), map[string]json.RawMessage{}, nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, nil, fmt.Errorf("params: %v", err)
	}
	compact := json.RawMessage(buf.Bytes())
	var m map[string]json.RawMessage
	if compact[0] != '{' || json.Unmarshal(compact, &m) != nil {
		return nil, nil, fmt.Errorf("params: must be a JSON object")
	}
	return compact, m, nil
}

// applyWrite is the hardware: it returns the state after action with params
// on a device of type typ in state cur, or a *refusal. cur is not modified.
func applyWrite(typ string, cur state, action string, params map[string]json.RawMessage) (state, error) {
	switch typ {
	case TypePump:
		return setOrReset(cur, action, params, "stop", "rpm", 0, 6000)
	case TypeValve:
		return setOrReset(cur, action, params, "close", "open", 0, 100)
	case TypeRelay:
		switch action {
		case "set":
			if err := onlyParams(params, "on"); err != nil {
				return nil, err
			}
			raw, ok := params["on"]
			if !ok {
				return nil, refuse("on: required (a boolean)")
			}
			var on bool
			if err := json.Unmarshal(raw, &on); err != nil {
				return nil, refuse("on: must be a boolean, got %s", clip(raw))
			}
			return state{"on": on}, nil
		case "toggle":
			if err := onlyParams(params); err != nil {
				return nil, err
			}
			on, _ := cur["on"].(bool)
			return state{"on": !on}, nil
		}
		return nil, refuse("action: a relay accepts set and toggle, not %q", action)
	case TypeGeneric:
		next := maps.Clone(cur)
		for k, v := range params {
			next[k] = v
		}
		return next, nil
	}
	return nil, refuse("action: unknown device type %q", typ)
}

// setOrReset is the pump and the valve: "set" with one integer parameter
// in [lo, hi], and an action that sets it to 0.
func setOrReset(cur state, action string, params map[string]json.RawMessage, reset, param string, lo, hi int64) (state, error) {
	switch action {
	case "set":
		if err := onlyParams(params, param); err != nil {
			return nil, err
		}
		raw, ok := params[param]
		if !ok {
			return nil, refuse("%s: required (an integer %d..%d)", param, lo, hi)
		}
		n, ok := integer(raw)
		if !ok || n < lo || n > hi {
			return nil, refuse("%s: must be an integer %d..%d, got %s", param, lo, hi, clip(raw))
		}
		return state{param: n}, nil
	case reset:
		if err := onlyParams(params); err != nil {
			return nil, err
		}
		return state{param: int64(0)}, nil
	}
	return nil, refuse("action: this device accepts set and %s, not %q", reset, action)
}

// onlyParams refuses the first (in sorted order) parameter not in allowed.
func onlyParams(params map[string]json.RawMessage, allowed ...string) error {
	for _, k := range slices.Sorted(maps.Keys(params)) {
		if !slices.Contains(allowed, k) {
			return refuse("%s: unknown parameter", k)
		}
	}
	return nil
}

// integer reads a JSON number with an integral value (1200 and 1200.0 alike).
func integer(raw json.RawMessage) (int64, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] == '"' { // json.Number would accept "1200"
		return 0, false
	}
	var num json.Number
	if err := json.Unmarshal(raw, &num); err != nil {
		return 0, false
	}
	if n, err := strconv.ParseInt(num.String(), 10, 64); err == nil {
		return n, true
	}
	f, err := num.Float64()
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, false
	}
	return int64(f), true
}

func clip(raw json.RawMessage) string {
	const max = 40
	if len(raw) > max {
		return string(raw[:max]) + "..."
	}
	return string(raw)
}
