package agent

import (
	"errors"
	"fmt"
	"time"
)

// The resolve settle (docs/operations.md, "Unknown outcomes"). A write the
// agent stopped waiting for (a timeout, a dropped connection) may still be
// on its way through the device and land later. The read-back path waits a
// settle time for exactly this; an operator's answer must too: were "not
// applied" accepted while the write can still land, the next write
// (perhaps a newer owner's, with a higher fence) could be applied first,
// and the late landing would then overtake it (invariant 1). So Resolve
// refuses any answer until the device's resolve_settle has passed since
// the last write to the device ended in this process (or since the
// process began, for a write interrupted by a restart): by then the write
// in question can no longer land, and what the operator sees on the
// device is final.

// ErrTooEarly is returned by Resolve while the held write may still land
// on its device (resolve_settle has not passed since its last try ended).
var ErrTooEarly = errors.New("agent: the write may still land on the device")

// wroteNow records that a write to rt's device has just ended.
func (rt *devRT) wroteNow() {
	now := time.Now()
	rt.wrote.Store(&now)
}

// settled is nil once rt's device's resolve_settle has passed since its
// last write ended; otherwise ErrTooEarly, saying how long to wait.
func (a *Agent) settled(rt *devRT) error {
	settle := rt.cfg.ResolveSettle
	since := a.begun
	if p := rt.wrote.Load(); p != nil {
		since = *p
	}
	if left := settle - time.Since(since); left > 0 {
		return fmt.Errorf("%w: its last try ended %v ago and %s's driver.resolve_settle is %v: look at the device again after %v, then answer",
			ErrTooEarly, time.Since(since).Round(time.Millisecond), rt.cfg.ID, settle, left.Round(100*time.Millisecond))
	}
	return nil
}
