// gonop: allows everything, through the SDK (which still parses the input):
// the floor of a Go plugin's cost, for the benchmarks.
package main

import "github.com/edge-agent/edge-agent/plugins/sdk"

func init() {
	sdk.Register(sdk.Plugin{
		Init:   func(sdk.Object) error { return nil },
		Decide: func(*sdk.Input) sdk.Decision { return sdk.Allow() },
	})
}

func main() {}
