// goexit: Decide calls os.Exit (proc_exit).
package main

import (
	"os"

	"github.com/edge-agent/edge-agent/plugins/sdk"
)

func init() {
	sdk.Register(sdk.Plugin{
		Init: func(sdk.Object) error { return nil },
		Decide: func(in *sdk.Input) sdk.Decision {
			if in.Command.Action == "ok" {
				return sdk.Allow()
			}
			os.Exit(3)
			return sdk.Allow()
		},
	})
}

func main() {}
