package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Faults are the failures the simulator injects into applies (docs/protocol.md
// §2, POST /v1/faults). The zero value injects none. Ops queries, state
// and the journal are never subject to faults.
type Faults struct {
	// Device limits the faults to one device; "" sets them for every device
	// (and drops every per-device setting).
	Device string `json:"device,omitempty"`
	// LatencyMS delays each apply before it takes effect. The write is
	// registered as in progress first, so an ops query or a repeat of the
	// same key arriving meanwhile waits for it. A client that gives up
	// during the delay does not stop the write.
	LatencyMS int `json:"latency_ms"`
	// ErrorRate is the fraction of applies answered 503 without applying.
	ErrorRate float64 `json:"error_rate"`
	// DropResponseRate is the fraction of applies that are carried out
	// (applied, or answered from the key's stored answer) and then have
	// their connection closed without an answer.
	DropResponseRate float64 `json:"drop_response_rate"`
	// Hang holds each apply, before it is even registered, until the fault
	// is cleared, then closes its connection unapplied. A held write never
	// takes effect, so an ops query does not wait for it.
	Hang bool `json:"hang"`
	// ResetRate is the fraction of writes whose connection is closed
	// without an answer and without applying them (a connection reset).
	ResetRate float64 `json:"reset_rate,omitempty"`
	// HangAfterApply applies each write, then holds its answer until the
	// fault is cleared, then closes the connection without answering (no
	// response after applying).
	HangAfterApply bool `json:"hang_after_apply,omitempty"`
	// Exception (Modbus only) answers each write with this exception code
	// without applying it: 1, 2, 3, 4, 5, 6, 8, 10 or 11. 0: none.
	Exception int `json:"exception,omitempty"`
}

func (f Faults) validate() error {
	if f.LatencyMS < 0 || f.LatencyMS > 3_600_000 {
		return fmt.Errorf("%w: latency_ms must be 0..3600000, got %d", ErrBadFaults, f.LatencyMS)
	}
	for _, r := range []struct {
		name string
		v    float64
	}{{"error_rate", f.ErrorRate}, {"drop_response_rate", f.DropResponseRate}, {"reset_rate", f.ResetRate}} {
		if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
			return fmt.Errorf("%w: %s must be 0..1, got %v", ErrBadFaults, r.name, r.v)
		}
	}
	switch f.Exception {
	case 0, 1, 2, 3, 4, 5, 6, 8, 10, 11:
	default:
		return fmt.Errorf("%w: exception must be a Modbus exception code (1, 2, 3, 4, 5, 6, 8, 10, 11), got %d", ErrBadFaults, f.Exception)
	}
	return nil
}

// hit draws whether a fault of this rate strikes: never at 0, always at 1.
func hit(rate float64) bool { return rate > 0 && rand.Float64() < rate }

// FaultCounts counts the faults the simulator actually injected, so that a
// test can show its fault happened.
type FaultCounts struct {
	Delayed int // applies delayed by latency_ms
	Errors  int // applies answered 503 by error_rate
	Dropped int // applies whose connection was closed by drop_response_rate
	Held    int // applies held by hang (each closed unapplied)
	// Resets: writes closed unapplied by reset_rate; HeldAfterApply:
	// writes applied and then held by hang_after_apply; Exceptions:
	// Modbus writes answered with the exception fault.
	Resets, HeldAfterApply, Exceptions int
}

// faultTable is what POST /v1/faults has set: one setting for every device
// and per-device overrides.
type faultTable struct {
	all       Faults
	perDevice map[string]Faults
}

func (t *faultTable) set(f Faults) {
	if f.Device == "" {
		t.all = f
		t.perDevice = nil
		return
	}
	if t.perDevice == nil {
		t.perDevice = map[string]Faults{}
	}
	t.perDevice[f.Device] = f
}

func (t *faultTable) of(dev string) Faults {
	if f, ok := t.perDevice[dev]; ok {
		return f
	}
	f := t.all
	f.Device = dev
	return f
}
