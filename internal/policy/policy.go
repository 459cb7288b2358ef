// Package policy runs per-device validation policies as sandboxed
// WebAssembly plugins (docs/plugin-abi.md), with wazero.
package policy

import (
	"context"
	"encoding/json"
	"time"
)

// DeviceRef names the device a command is for.
type DeviceRef struct {
	ID   string `json:"id"`
	Type string `json:"type"`
}

// CommandView is the part of a command a policy sees.
type CommandView struct {
	OpID   string          `json:"op_id"`
	Fence  int64           `json:"fence"`
	Action string          `json:"action"`
	Params json.RawMessage `json:"params"`
	Holder string          `json:"holder,omitempty"`
}

// Input is the JSON document passed to policy_eval (docs/plugin-abi.md, Input).
type Input struct {
	Device    DeviceRef                  `json:"device"`
	Command   CommandView                `json:"command"`
	State     json.RawMessage            `json:"state"`
	Group     map[string]json.RawMessage `json:"group,omitempty"`
	LastFence int64                      `json:"last_fence"`
	Now       time.Time                  `json:"now"`
}

// Decision is a plugin's answer. Params is non-nil only when an allowing
// plugin replaced the command's parameters.
type Decision struct {
	Allow  bool            `json:"allow"`
	Reason string          `json:"reason,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
}

// Evaluator decides commands for devices. Evaluate returns an error when
// the policy could not decide (trap, timeout, bad output...): the caller
// must then reject the command policy_error (fail closed). A device with
// no policy bound is allowed unchanged.
type Evaluator interface {
	Evaluate(ctx context.Context, device string, in Input) (Decision, error)
}

// Binder is implemented by an Evaluator that can say whether a device has
// a policy at all: a command for a device without one is decided without
// calling Evaluate (the agent then decides it in the admission's commit).
type Binder interface {
	// Bound reports whether Evaluate could do anything but allow device's
	// commands unchanged. When unsure (not started, closed), true.
	Bound(device string) bool
}

// AllowAll is the Evaluator for an agent with no policies.
type AllowAll struct{}

// Bound is always false: no device has a policy.
func (AllowAll) Bound(string) bool { return false }

// Evaluate allows every command unchanged.
func (AllowAll) Evaluate(context.Context, string, Input) (Decision, error) {
	return Decision{Allow: true}, nil
}
