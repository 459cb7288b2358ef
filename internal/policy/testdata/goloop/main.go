// goloop: Decide never returns (a Go loop, with calls in it).
package main

import "github.com/edge-agent/edge-agent/plugins/sdk"

var n int

//go:noinline
func step(i int) int { return i*31 + 7 }

func init() {
	sdk.Register(sdk.Plugin{
		Init: func(sdk.Object) error { return nil },
		Decide: func(in *sdk.Input) sdk.Decision {
			if in.Command.Action == "ok" {
				return sdk.Allow()
			}
			for {
				n = step(n)
			}
		},
	})
}

func main() {}
