package agent

import (
	"time"

	"github.com/edge-agent/edge-agent/internal/device"
)

// What the agent last heard from a device (GET /v1/devices/{dev}'s
// reachable and last_contact_at, the edge_agent_device_reachable and
// edge_agent_device_last_contact_timestamp_seconds series): kept in
// memory, so unknown until the first write or query since the start.

// contactState is a device's last try to reach it.
type contactState struct {
	tried   time.Time // when the last try (a write or a query) ended
	reached bool      // it got an answer that decided it
	// last is when the device last answered (zero: not since the start).
	last time.Time
}

// contacted records a try that ended now: reached when the device
// answered it.
func (rt *devRT) contacted(now time.Time, reached bool) {
	c := contactState{tried: now, reached: reached}
	if p := rt.contact.Load(); p != nil {
		c.last = p.last
	}
	if reached {
		c.last = now
	}
	rt.contact.Store(&c)
}

// wroteWith records a write's try: the device answered when it applied or
// refused the write. A timeout, a dropped connection, a 5xx or a refused
// connection left the write undecided by the device: not reached.
func (rt *devRT) wroteWith(now time.Time, o device.Outcome) {
	rt.contacted(now, o == device.Applied || o == device.Refused)
}

// lastContact returns rt's device's contact: tried is false before any
// try since the start.
func (rt *devRT) lastContact() (c contactState, tried bool) {
	if p := rt.contact.Load(); p != nil {
		return *p, true
	}
	return contactState{}, false
}
