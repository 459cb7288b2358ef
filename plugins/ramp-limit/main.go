// Command ramp-limit is a policy plugin: a numeric parameter may change by
// at most max_step per command, compared with the device's last confirmed
// state. With clamp, a larger step is rewritten to the largest allowed one.
// A device whose state does not have the parameter yet is not limited.
//
// Config: {"param": "rpm", "max_step": 200, "clamp": false}
package main

import (
	"errors"
	"math"
	"strconv"

	"github.com/edge-agent/edge-agent/plugins/sdk"
)

func init() { sdk.Register(sdk.Plugin{Init: setup, Decide: decide}) }

func main() {}

var (
	param   string
	maxStep float64
	clamp   bool
)

func setup(cfg sdk.Object) error {
	if err := cfg.Only("param", "max_step", "clamp"); err != nil {
		return err
	}
	var ok bool
	if param, ok = cfg.Str("param"); !ok || param == "" {
		return errors.New(`"param" must be a non-empty string`)
	}
	if maxStep, ok = cfg.Float("max_step"); !ok || maxStep < 0 {
		return errors.New(`"max_step" must be a number >= 0`)
	}
	if v, found := cfg.Get("clamp"); found {
		if clamp, ok = v.Bool(); !ok {
			return errors.New(`"clamp" must be a boolean`)
		}
	}
	return nil
}

func num(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func decide(in *sdk.Input) sdk.Decision {
	v, ok := in.Command.Params.Get(param)
	if !ok {
		return sdk.Allow()
	}
	next, ok := v.Float()
	if !ok {
		return sdk.Deny(param + " is not a number")
	}
	prev, ok := in.State.Float(param)
	if !ok {
		return sdk.Allow() // no reference yet
	}
	step := next - prev
	if math.Abs(step) <= maxStep {
		return sdk.Allow()
	}
	if clamp {
		limited := prev + math.Copysign(maxStep, step)
		return sdk.Rewrite(in.Command.Params.With(param, sdk.Num(limited)))
	}
	return sdk.Deny(param + " change " + num(prev) + " -> " + num(next) +
		" is " + num(math.Abs(step)) + ", above max_step " + num(maxStep))
}
