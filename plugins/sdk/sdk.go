// Package sdk hides the edge_policy_v1 ABI (docs/plugin-abi.md) from a policy
// plugin written in Go. A plugin is a main package that registers itself
// in init and is built as a WASI reactor:
//
//	package main
//
//	import "github.com/edge-agent/edge-agent/plugins/sdk"
//
//	func init() { sdk.Register(sdk.Plugin{Init: setup, Decide: decide}) }
//
//	func main() {} // never called in a reactor
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o p.wasm ./plugins/p
//
// The SDK exports policy_abi_version, policy_buffer, policy_init and
// policy_eval, parses the input (without encoding/json, to keep plugins
// small and fast), recovers a panic in Decide (the host then rejects the
// command policy_error and replaces the instance) and writes the output.
//
// Everything a decision needs is in the Input: the hot path makes no host
// calls. Values (Object, Value) are views into the host's buffer, valid
// during the call only; copy what you keep.
package sdk

import (
	"errors"
	"time"

	"github.com/edge-agent/edge-agent/plugins/sdk/jsonscan"
)

// Plugin is what a plugin registers.
type Plugin struct {
	// Init receives the device's policy.config (an object; {} when the
	// binding has none) once per instance, before any Decide. A non-nil
	// error rejects the configuration: the agent refuses to start and
	// names the device. Nil Init accepts only an empty config.
	Init func(config Object) error
	// Decide decides one command. It must not keep in across calls.
	Decide func(in *Input) Decision
}

// Register installs the plugin. Call it from an init function.
func Register(p Plugin) {
	registered = p
}

//lint:ignore U1000 read by the ABI functions of abi_wasip1.go (wasip1 only)
var registered Plugin

// Device is the device the command is for.
type Device struct {
	ID   string
	Type string
}

// Command is the part of the command a policy sees.
type Command struct {
	OpID   string
	Fence  int64
	Action string
	Params Object
	Holder string
}

// Input is the document the host passes for one decision. Its strings
// and Objects are views into the host's buffer, valid during Decide only:
// strings.Clone what you keep.
type Input struct {
	Device  Device
	Command Command
	// State is the device's last confirmed state ({} before the first write).
	State Object
	// Group maps every member of the device's group to its state; empty
	// when the device is in no group. Use Member.
	Group     Object
	LastFence int64
	// Raw is the whole input document.
	Raw []byte

	now    []byte
	nowT   time.Time
	parsed bool
}

// Now is the agent's time of the decision.
func (in *Input) Now() time.Time {
	if !in.parsed {
		in.parsed = true
		s, _ := unquote(in.now)
		in.nowT, _ = time.Parse(time.RFC3339Nano, s)
	}
	// time.Parse keeps no reference to s.
	return in.nowT
}

// Member returns the state of a member of the device's group.
func (in *Input) Member(id string) (Object, bool) {
	return in.Group.Obj(id)
}

// Decision is a plugin's answer.
type Decision struct {
	allow   bool
	reason  string
	params  Object
	rewrite bool
}

// Allow lets the command through unchanged.
func Allow() Decision { return Decision{allow: true} }

// Deny refuses the command; reason goes to the controller in the Result.
func Deny(reason string) Decision { return Decision{reason: reason} }

// Rewrite lets the command through with params replacing its parameters
// (e.g. a value clamped to its bound). The agent records the rewrite.
func Rewrite(params Object) Decision {
	return Decision{allow: true, params: params, rewrite: true}
}

// Allowed reports whether the decision allows the command (for tests).
func (d Decision) Allowed() bool { return d.allow }

// Reason returns a denial's reason (for tests).
func (d Decision) Reason() string { return d.reason }

// Params returns a rewrite's parameters (for tests).
func (d Decision) Params() (Object, bool) { return d.params, d.rewrite }

// AppendJSON appends the output document of the ABI.
func (d Decision) AppendJSON(b []byte) []byte {
	if !d.allow {
		b = append(b, `{"allow":false,"reason":`...)
		b = jsonscan.AppendString(b, d.reason)
		return append(b, '}')
	}
	if d.rewrite {
		b = append(b, `{"allow":true,"params":`...)
		b = d.params.AppendJSON(b)
		return append(b, '}')
	}
	return append(b, `{"allow":true}`...)
}

var errInput = errors.New("sdk: malformed input")

// ParseInput reads an input document. The plugin's exports call it; it is
// exported for tests of Decide functions on the host. It trusts b to be
// valid JSON (the host validates every input it builds); Objects are
// scanned only when the plugin asks for a member.
func ParseInput(b []byte) (Input, error) {
	var in Input
	in.Raw = b
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return in, errInput
	}
	top := Object{raw: b}.members()
	for {
		k, _, v, ok := top.next()
		if !ok {
			break
		}
		switch string(k) {
		case "device":
			m := Object(v).members()
			for {
				k, _, v, ok := m.next()
				if !ok {
					break
				}
				switch string(k) {
				case "id":
					in.Device.ID = v.str()
				case "type":
					in.Device.Type = v.str()
				}
			}
		case "command":
			m := Object(v).members()
			for {
				k, _, v, ok := m.next()
				if !ok {
					break
				}
				switch string(k) {
				case "op_id":
					in.Command.OpID = v.str()
				case "fence":
					in.Command.Fence, _ = v.Int()
				case "action":
					in.Command.Action = v.str()
				case "params":
					in.Command.Params, _ = v.Object()
				case "holder":
					in.Command.Holder = v.str()
				}
			}
		case "state":
			in.State, _ = v.Object()
		case "group":
			in.Group, _ = v.Object()
		case "last_fence":
			in.LastFence, _ = v.Int()
		case "now":
			in.now = v.raw
		}
	}
	return in, nil
}

// Level is the level of a log line.
type Level int32

// Log levels of edge.log.
const (
	Debug Level = 0
	Info  Level = 1
	Warn  Level = 2
	Error Level = 3
)

// Log sends a line to the agent's log (truncated and rate-limited by the
// host). It is a host call: keep it off the hot path.
func Log(level Level, msg string) {
	hostLog(level, msg)
}
