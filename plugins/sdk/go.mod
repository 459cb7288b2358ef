module github.com/edge-agent/edge-agent/plugins/sdk

// The plugin SDK is its own module, with no requirements: a plugin that
// imports it has an empty go.sum (docs/plugins.md). Go 1.24 is the first
// release with //go:wasmexport.
go 1.24
