// Command range-limit is a policy plugin: a numeric parameter must stay
// within [min, max]. With clamp, an out-of-range value is rewritten to the
// bound instead of being denied.
//
// Config: {"param": "rpm", "min": 0, "max": 3000, "clamp": false}
// (min or max may be left out; at least one is required).
package main

import (
	"errors"

	"github.com/edge-agent/edge-agent/plugins/sdk"
)

func init() { sdk.Register(sdk.Plugin{Init: setup, Decide: decide}) }

func main() {}

var (
	param          string
	min, max       float64
	hasMin, hasMax bool
	minRaw, maxRaw []byte // the bounds as written in the config
	clamp          bool
)

func setup(cfg sdk.Object) error {
	if err := cfg.Only("param", "min", "max", "clamp"); err != nil {
		return err
	}
	var ok bool
	if param, ok = cfg.Str("param"); !ok || param == "" {
		return errors.New(`"param" must be a non-empty string`)
	}
	if v, found := cfg.Get("min"); found {
		if min, hasMin = v.Float(); !hasMin {
			return errors.New(`"min" must be a number`)
		}
		minRaw = append([]byte(nil), v.Raw()...)
	}
	if v, found := cfg.Get("max"); found {
		if max, hasMax = v.Float(); !hasMax {
			return errors.New(`"max" must be a number`)
		}
		maxRaw = append([]byte(nil), v.Raw()...)
	}
	if !hasMin && !hasMax {
		return errors.New(`"min" or "max" is required`)
	}
	if hasMin && hasMax && min > max {
		return errors.New(`"min" is above "max"`)
	}
	if v, found := cfg.Get("clamp"); found {
		if clamp, ok = v.Bool(); !ok {
			return errors.New(`"clamp" must be a boolean`)
		}
	}
	return nil
}

func decide(in *sdk.Input) sdk.Decision {
	v, ok := in.Command.Params.Get(param)
	if !ok {
		return sdk.Allow() // the command does not touch this parameter
	}
	x, ok := v.Float()
	if !ok {
		return sdk.Deny(param + " is not a number")
	}
	switch {
	case hasMax && x > max:
		if clamp {
			return sdk.Rewrite(in.Command.Params.With(param, sdk.RawValue(maxRaw)))
		}
		return sdk.Deny(param + " " + string(v.Raw()) + " above max " + string(maxRaw))
	case hasMin && x < min:
		if clamp {
			return sdk.Rewrite(in.Command.Params.With(param, sdk.RawValue(minRaw)))
		}
		return sdk.Deny(param + " " + string(v.Raw()) + " below min " + string(minRaw))
	}
	return sdk.Allow()
}
