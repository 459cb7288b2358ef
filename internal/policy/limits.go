package policy

import (
	"fmt"
	"time"
)

// The ABI's default limits (docs/plugin-abi.md, "Failure is a denial").
const (
	DefaultTimeout     = 50 * time.Millisecond
	DefaultMemory      = 64 << 20
	DefaultMaxInput    = 1 << 20
	DefaultMaxOutput   = 64 << 10
	DefaultInstances   = 4
	DefaultInitTimeout = time.Second
)

const pageSize = 64 << 10

// Limits bound one plugin binding. A zero field means "inherit": from
// HostOptions.Defaults for a binding, and from the ABI's defaults above for
// HostOptions.Defaults itself.
type Limits struct {
	// Timeout is the deadline of one policy_eval call (and of the
	// policy_buffer call before it). Zero: 50ms.
	Timeout time.Duration
	// Memory caps the guest's linear memory, in bytes, rounded up to whole
	// 64 KiB pages. Zero: 64 MiB.
	Memory int64
	// MaxInput caps the input document, in bytes. Zero: 1 MiB.
	MaxInput int
	// MaxOutput caps the output document, in bytes. Zero: 64 KiB.
	MaxOutput int
	// Instances caps the warm instances of one pool (an instance serves
	// one call at a time; a call that finds them all busy waits). Zero: 4.
	Instances int
	// InitTimeout bounds instantiation: the start function, _initialize
	// and policy_init together. Zero: 1s.
	InitTimeout time.Duration
}

// DefaultLimits returns the ABI's defaults.
func DefaultLimits() Limits {
	return Limits{
		Timeout:     DefaultTimeout,
		Memory:      DefaultMemory,
		MaxInput:    DefaultMaxInput,
		MaxOutput:   DefaultMaxOutput,
		Instances:   DefaultInstances,
		InitTimeout: DefaultInitTimeout,
	}
}

// or fills l's zero fields from d.
func (l Limits) or(d Limits) Limits {
	if l.Timeout == 0 {
		l.Timeout = d.Timeout
	}
	if l.Memory == 0 {
		l.Memory = d.Memory
	}
	if l.MaxInput == 0 {
		l.MaxInput = d.MaxInput
	}
	if l.MaxOutput == 0 {
		l.MaxOutput = d.MaxOutput
	}
	if l.Instances == 0 {
		l.Instances = d.Instances
	}
	if l.InitTimeout == 0 {
		l.InitTimeout = d.InitTimeout
	}
	return l
}

func (l Limits) validate() error {
	switch {
	case l.Timeout < 0:
		return fmt.Errorf("timeout %v is negative", l.Timeout)
	case l.Memory < 0 || l.Memory > 4<<30:
		return fmt.Errorf("memory %d is not between 0 and 4 GiB", l.Memory)
	case l.MaxInput < 0:
		return fmt.Errorf("max_input %d is negative", l.MaxInput)
	case l.MaxOutput < 0:
		return fmt.Errorf("max_output %d is negative", l.MaxOutput)
	case l.Instances < 0:
		return fmt.Errorf("instances %d is negative", l.Instances)
	case l.InitTimeout < 0:
		return fmt.Errorf("init_timeout %v is negative", l.InitTimeout)
	}
	return nil
}

// pages is Memory in 64 KiB pages, rounded up.
func (l Limits) pages() uint32 {
	return uint32((l.Memory + pageSize - 1) / pageSize)
}
