module github.com/edge-agent/edge-agent/plugins/sdk

// The plugin SDK is its own module, with no requirements: a plugin that
// imports it has an empty go.sum (docs/plugins.md). It needs Go 1.26, as
// every module of the project does (//go:wasmexport came with Go 1.24);
// the toolchain line names the release the project is built and tested
// with.
go 1.26.0

toolchain go1.26.8
