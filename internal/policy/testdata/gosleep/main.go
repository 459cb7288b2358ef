// gosleep: Decide sleeps for a minute (a host call, poll_oneoff, where no
// interrupt check runs).
package main

import (
	"time"

	"github.com/edge-agent/edge-agent/plugins/sdk"
)

func init() {
	sdk.Register(sdk.Plugin{
		Init: func(sdk.Object) error { return nil },
		Decide: func(in *sdk.Input) sdk.Decision {
			if in.Command.Action == "ok" {
				return sdk.Allow()
			}
			time.Sleep(time.Minute)
			return sdk.Allow()
		},
	})
}

func main() {}
