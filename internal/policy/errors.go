package policy

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Errors of loading a plugin (Start, Reload, TestOnce). They come wrapped
// in a *LoadError that names the file, and the devices when a configuration
// is at fault.
var (
	// ErrRead: the plugin file could not be read.
	ErrRead = errors.New("policy: cannot read plugin")
	// ErrInvalidModule: the file is not a WebAssembly module wazero can
	// compile (or instrument).
	ErrInvalidModule = errors.New("policy: invalid WebAssembly module")
	// ErrMissingExport: a required export (memory, policy_abi_version,
	// policy_buffer, policy_eval) is absent or has the wrong signature.
	ErrMissingExport = errors.New("policy: missing or mistyped export")
	// ErrABIVersion: policy_abi_version returned something other than 1.
	ErrABIVersion = errors.New("policy: unsupported ABI version")
	// ErrImport: the module imports something the host does not provide.
	ErrImport = errors.New("policy: unsupported import")
	// ErrInit: instantiation, _initialize or the start function failed.
	ErrInit = errors.New("policy: plugin failed to initialise")
	// ErrConfigRejected: policy_init returned non-zero for a device's
	// policy.config (or the plugin has no policy_init but a config was given).
	ErrConfigRejected = errors.New("policy: plugin rejected its configuration")
)

// Errors of one evaluation. Every one of them means the policy did not
// decide: the caller rejects the command policy_error. They come wrapped in
// an *EvalError.
var (
	// ErrTimeout: the call ran past its deadline and was stopped.
	ErrTimeout = errors.New("policy: call exceeded its deadline")
	// ErrTrap: the guest trapped (unreachable, out-of-bounds access, stack
	// overflow...).
	ErrTrap = errors.New("policy: plugin trapped")
	// ErrExit: the guest called proc_exit (a Go panic or fatal error ends so).
	ErrExit = errors.New("policy: plugin exited")
	// ErrMemoryLimit: the guest needed more memory than its limit. It comes
	// with ErrExit or ErrTrap, whichever way the guest died.
	ErrMemoryLimit = errors.New("policy: plugin memory limit reached")
	// ErrPluginError: policy_eval returned a negative value, or
	// policy_buffer returned 0 or an address outside memory.
	ErrPluginError = errors.New("policy: plugin reported an error")
	// ErrBadOutput: the output is not JSON of the shape
	// {"allow": bool, "reason"?: string, "params"?: object}.
	ErrBadOutput = errors.New("policy: malformed plugin output")
	// ErrOutputTooLarge: the output is larger than the plugin's MaxOutput.
	ErrOutputTooLarge = errors.New("policy: plugin output too large")
	// ErrInputTooLarge: the input document is larger than MaxInput. The
	// plugin is not at fault and its instance is kept.
	ErrInputTooLarge = errors.New("policy: input too large")
	// ErrBadInput: a raw JSON field of Input (params, state, group) is not
	// valid JSON. The plugin is not at fault and its instance is kept.
	ErrBadInput = errors.New("policy: input is not valid JSON")
	// ErrNotLoaded: the device's plugin failed to load at the last Reload
	// and there is no earlier version to fall back on.
	ErrNotLoaded = errors.New("policy: plugin not loaded")
)

// Errors of the Host's life cycle.
var (
	// ErrNotStarted: Evaluate or Reload before Start.
	ErrNotStarted = errors.New("policy: host not started")
	// ErrStarted: Start called twice.
	ErrStarted = errors.New("policy: host already started")
	// ErrClosed: any call after Close.
	ErrClosed = errors.New("policy: host closed")
	// ErrBinding: Bind with an invalid binding (empty path, bad config JSON,
	// negative limits).
	ErrBinding = errors.New("policy: invalid binding")
)

// LoadError says which plugin could not be loaded, and for which devices
// when a configuration is at fault. The CLI maps it to exit status 2.
type LoadError struct {
	Plugin  string   // the binding's plugin name (may be empty)
	Path    string   // the .wasm file
	Devices []string // devices whose policy.config was rejected (sorted), if any
	Export  string   // the missing or mistyped export, if any
	Err     error    // wraps one of the load sentinels
}

func (e *LoadError) Error() string {
	var b strings.Builder
	b.WriteString("policy: plugin ")
	if e.Plugin != "" {
		fmt.Fprintf(&b, "%s (%s)", e.Plugin, e.Path)
	} else {
		b.WriteString(e.Path)
	}
	if len(e.Devices) == 1 {
		fmt.Fprintf(&b, ", device %s", e.Devices[0])
	} else if len(e.Devices) > 1 {
		fmt.Fprintf(&b, ", devices %s", strings.Join(e.Devices, ", "))
	}
	if e.Export != "" {
		fmt.Fprintf(&b, ", export %q", e.Export)
	}
	b.WriteString(": ")
	b.WriteString(strings.TrimPrefix(e.Err.Error(), "policy: "))
	return b.String()
}

func (e *LoadError) Unwrap() error { return e.Err }

func loadErr(plugin, path string, devices []string, export string, err error) *LoadError {
	ds := append([]string(nil), devices...)
	sort.Strings(ds)
	return &LoadError{Plugin: plugin, Path: path, Devices: ds, Export: export, Err: err}
}

// EvalError says which device's plugin failed to decide, and how.
type EvalError struct {
	Device string
	Plugin string
	Err    error // wraps one of the evaluation sentinels, or the context's error
}

func (e *EvalError) Error() string {
	return fmt.Sprintf("policy: device %s, plugin %s: %s", e.Device, e.Plugin,
		strings.TrimPrefix(e.Err.Error(), "policy: "))
}

func (e *EvalError) Unwrap() error { return e.Err }
