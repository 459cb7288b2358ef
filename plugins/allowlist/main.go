// Command allowlist is a policy plugin: only the listed actions may reach
// the device.
//
// Config: {"actions": ["set", "stop"]}
package main

import (
	"errors"

	"github.com/edge-agent/edge-agent/plugins/sdk"
)

func init() { sdk.Register(sdk.Plugin{Init: setup, Decide: decide}) }

func main() {}

var actions []string

func setup(cfg sdk.Object) error {
	if err := cfg.Only("actions"); err != nil {
		return err
	}
	v, ok := cfg.Get("actions")
	if !ok {
		return errors.New(`"actions" is required`)
	}
	if actions, ok = v.Strings(); !ok {
		return errors.New(`"actions" must be an array of strings`)
	}
	return nil
}

func decide(in *sdk.Input) sdk.Decision {
	for _, a := range actions {
		if a == in.Command.Action {
			return sdk.Allow()
		}
	}
	return sdk.Deny("action " + in.Command.Action + " is not allowed on " + in.Device.ID)
}
