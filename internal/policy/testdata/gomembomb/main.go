// gomembomb: Decide allocates 1 MiB at a time and keeps it all.
package main

import "github.com/edge-agent/edge-agent/plugins/sdk"

var hoard [][]byte

func init() {
	sdk.Register(sdk.Plugin{
		Init: func(sdk.Object) error { return nil },
		Decide: func(in *sdk.Input) sdk.Decision {
			if in.Command.Action == "ok" {
				return sdk.Allow()
			}
			for {
				b := make([]byte, 1<<20)
				for i := range b {
					b[i] = byte(i)
				}
				hoard = append(hoard, b)
			}
		},
	})
}

func main() {}
