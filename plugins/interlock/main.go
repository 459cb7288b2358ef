// Command interlock is a policy plugin for a device group: the valve may
// not open while the pump runs. It needs the group view, so the pump and
// the valve must be configured in one group (the agent then serialises
// their commands, and the view cannot change during the decision).
//
// A command to the valve that opens it (valve_param set to a number > 0 or
// true) is denied while the pump's pump_param is above 0 in its last
// confirmed state. A pump whose state is missing from the group view (the
// group is misconfigured) denies the opening too: fail closed.
//
// Config: {"pump": "pump-1", "valve": "valve-1",
//
//	"pump_param": "rpm", "valve_param": "open"}   (the last two optional)
package main

import (
	"errors"

	"github.com/edge-agent/edge-agent/plugins/sdk"
)

func init() { sdk.Register(sdk.Plugin{Init: setup, Decide: decide}) }

func main() {}

var pump, valve, pumpParam, valveParam string

func setup(cfg sdk.Object) error {
	if err := cfg.Only("pump", "valve", "pump_param", "valve_param"); err != nil {
		return err
	}
	var ok bool
	if pump, ok = cfg.Str("pump"); !ok || pump == "" {
		return errors.New(`"pump" must name the pump device`)
	}
	if valve, ok = cfg.Str("valve"); !ok || valve == "" {
		return errors.New(`"valve" must name the valve device`)
	}
	pumpParam, valveParam = "rpm", "open"
	if v, found := cfg.Get("pump_param"); found {
		if pumpParam, ok = v.Str(); !ok {
			return errors.New(`"pump_param" must be a string`)
		}
	}
	if v, found := cfg.Get("valve_param"); found {
		if valveParam, ok = v.Str(); !ok {
			return errors.New(`"valve_param" must be a string`)
		}
	}
	return nil
}

// on reports whether a parameter value means "on": a number above 0 or true.
func on(v sdk.Value) bool {
	if b, ok := v.Bool(); ok {
		return b
	}
	f, ok := v.Float()
	return ok && f > 0
}

func decide(in *sdk.Input) sdk.Decision {
	if in.Device.ID != valve {
		return sdk.Allow()
	}
	v, ok := in.Command.Params.Get(valveParam)
	if !ok || !on(v) {
		return sdk.Allow() // not an opening
	}
	ps, ok := in.Member(pump)
	if !ok {
		return sdk.Deny(valve + " may not open: the state of " + pump + " is unknown (not in the group view)")
	}
	if r, ok := ps.Get(pumpParam); ok && on(r) {
		return sdk.Deny(valve + " may not open while " + pump + " runs (" + pumpParam + " " + string(r.Raw()) + ")")
	}
	return sdk.Allow()
}
