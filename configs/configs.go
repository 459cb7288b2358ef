// Package configs embeds the shipped default configuration, so the agent
// runs with no file at all (`edge-agent run` without --config).
package configs

import _ "embed"

// AgentYAML is configs/agent.yaml.
//
//go:embed agent.yaml
var AgentYAML []byte

// AgentPoliciesYAML is configs/agent-policies.yaml: the demo devices with
// the example policy plugins bound.
//
//go:embed agent-policies.yaml
var AgentPoliciesYAML []byte

// AgentModbusYAML is configs/agent-modbus.yaml: Modbus TCP devices, one
// read back after an unknown write, next to an HTTP pump.
//
//go:embed agent-modbus.yaml
var AgentModbusYAML []byte
