// gopanic: Decide panics (the SDK recovers and returns an error), or
// dereferences nil, as the command's action says.
package main

import "github.com/edge-agent/edge-agent/plugins/sdk"

var nothing *sdk.Input

func init() {
	sdk.Register(sdk.Plugin{
		Init: func(sdk.Object) error { return nil },
		Decide: func(in *sdk.Input) sdk.Decision {
			switch in.Command.Action {
			case "ok":
				return sdk.Allow()
			case "nil":
				return sdk.Deny(nothing.Device.ID)
			}
			panic("boom")
		},
	})
}

func main() {}
