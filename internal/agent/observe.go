package agent

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/clip"
)

// outcome is one Result handed out (recorded, unknown, answered on arrival
// or replayed): what its log line, the metrics and the status page's charts
// say about it.
type outcome struct {
	dev, opID, action, holder string
	fence                     int64
	code                      wire.Code
	reason                    string
	dup                       bool
	// rewritten is the params the policy rewrote the command's to (the
	// Result's rewritten_params), nil when it did not.
	rewritten []byte
	// took is the time from the command's arrival to this outcome's
	// commit; zero for an answer on arrival or a replay (no sample).
	took time.Duration
}

// observe is the one place an outcome is counted and logged: called once
// per Result, after the commit that recorded it (or when an answer on
// arrival is handed to the publisher).
func (a *Agent) observe(o *outcome) {
	a.m.answered(o.code)
	a.m.byDevice(a.devs[o.dev], o.code)
	if o.took > 0 {
		a.m.commandSeconds.Observe(o.took.Seconds())
	}
	a.stats.add(time.Now(), o.code, o.took)
	a.logOutcome(o)
}

// outcomeLevel is the level of an outcome's log line: warn for the codes an
// operator acts on (a stale controller, a forged command, a write held
// unknown, a failing plugin), info for the rest.
func outcomeLevel(c wire.Code) slog.Level {
	switch c {
	case wire.CodeStaleFence, wire.CodeUnauthorized, wire.CodeOutcomeUnknown, wire.CodePolicyError:
		return slog.LevelWarn
	}
	return slog.LevelInfo
}

// logOutcome writes the outcome's line (docs/operations.md, Logs: the keys
// are a contract). With its level off, it costs this call and one Enabled.
func (a *Agent) logOutcome(o *outcome) {
	lvl := outcomeLevel(o.code)
	if !a.log.Enabled(context.Background(), lvl) {
		return
	}
	attrs := [...]slog.Attr{
		slog.String("device", o.dev),
		slog.String("op_id", o.opID),
		slog.Int64("fence", o.fence),
		slog.String("action", o.action),
		slog.String("holder", o.holder),
		slog.String("code", string(o.code)),
		slog.Duration("duration", o.took),
		slog.Bool("duplicate", o.dup),
		{},
		{},
	}
	n := len(attrs) - 2
	if o.reason != "" {
		attrs[n] = slog.String("reason", o.reason)
		n++
	}
	if len(o.rewritten) > 0 {
		attrs[n] = slog.String("rewritten_params", string(o.rewritten))
		n++
	}
	a.log.LogAttrs(context.Background(), lvl, "outcome", attrs[:n]...)
}

// logArrival writes the debug line of a command's arrival.
func (a *Agent) logArrival(dev string, cmd *wire.Command, retained bool, size int) {
	if !a.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	a.log.LogAttrs(context.Background(), slog.LevelDebug, "arrival",
		slog.String("device", clip.String(dev, 80)), slog.String("op_id", cmd.OpID), slog.Int64("fence", cmd.Fence),
		slog.String("action", cmd.Action), slog.String("holder", cmd.Holder),
		slog.Bool("retained", retained), slog.Int("bytes", size))
}

// The status page's charts: outcomes per second over the last statSlots
// seconds, by code, with a latency histogram per second for its p99. A
// fixed ring: its memory does not grow with load.
const (
	statSlots   = 600
	latBuckets  = 30
	latFirstSec = 0.0001 // upper bound of the first latency bucket: 0.1 ms
	latFactor   = 1.5    // each bucket's bound is 1.5 times the previous one
)

type statSlot struct {
	sec   int64
	n     uint32
	codes [maxCodes]uint32
	lat   [latBuckets + 1]uint32 // the last one: above every bound
}

// maxCodes bounds the codes a slot counts (wire.Codes, in its order).
const maxCodes = 32

var codeIndex = func() map[wire.Code]int {
	if len(wire.Codes) > maxCodes {
		panic("agent: more than maxCodes result codes")
	}
	m := map[wire.Code]int{}
	for i, c := range wire.Codes {
		m[c] = i
	}
	return m
}()

type statRing struct {
	mu    sync.Mutex
	slots [statSlots]statSlot
}

func latBucket(d time.Duration) int {
	s := d.Seconds()
	if s <= latFirstSec {
		return 0
	}
	i := int(math.Ceil(math.Log(s/latFirstSec) / math.Log(latFactor)))
	return min(i, latBuckets)
}

func latBound(i int) float64 { return latFirstSec * math.Pow(latFactor, float64(i)) }

func (r *statRing) add(now time.Time, c wire.Code, took time.Duration) {
	sec := now.Unix()
	r.mu.Lock()
	s := &r.slots[sec%statSlots]
	if s.sec != sec {
		*s = statSlot{sec: sec}
	}
	s.n++
	if i, ok := codeIndex[c]; ok {
		s.codes[i]++
	}
	if took > 0 {
		s.lat[latBucket(took)]++
	}
	r.mu.Unlock()
}

// StatPoint is one second of outcomes (GET /v1/stats).
type StatPoint struct {
	T        int64          `json:"t"` // Unix seconds
	Commands int            `json:"commands"`
	Codes    map[string]int `json:"codes,omitempty"`
	Samples  int            `json:"latency_samples"`
	P50Ms    float64        `json:"p50_ms,omitempty"`
	P99Ms    float64        `json:"p99_ms,omitempty"`
}

// Stats returns the last seconds (at most statSlots) up to now, oldest
// first, one point a second, empty seconds included.
func (a *Agent) Stats(now time.Time, seconds int) []StatPoint {
	seconds = max(1, min(seconds, statSlots))
	end := now.Unix()
	out := make([]StatPoint, 0, seconds)
	r := a.stats
	r.mu.Lock()
	defer r.mu.Unlock()
	for sec := end - int64(seconds) + 1; sec <= end; sec++ {
		p := StatPoint{T: sec}
		s := &r.slots[sec%statSlots]
		if s.sec == sec {
			p.Commands = int(s.n)
			for i, n := range s.codes {
				if n > 0 {
					if p.Codes == nil {
						p.Codes = map[string]int{}
					}
					p.Codes[string(wire.Codes[i])] = int(n)
				}
			}
			p.P50Ms, p.P99Ms, p.Samples = quantileMs(&s.lat, 0.5), quantileMs(&s.lat, 0.99), count(&s.lat)
		}
		out = append(out, p)
	}
	return out
}

func count(h *[latBuckets + 1]uint32) int {
	n := 0
	for _, c := range h {
		n += int(c)
	}
	return n
}

// quantileMs estimates the q-quantile of h in milliseconds, interpolating
// linearly inside the bucket it falls in (as Prometheus's
// histogram_quantile does); 0 without samples.
func quantileMs(h *[latBuckets + 1]uint32, q float64) float64 {
	total := count(h)
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	var cum float64
	for i, c := range h {
		if c == 0 {
			continue
		}
		if cum+float64(c) >= rank {
			lo := 0.0
			if i > 0 {
				lo = latBound(i - 1)
			}
			hi := latBound(min(i, latBuckets-1))
			if i == latBuckets {
				return hi * 1000 // above every bound: the highest bound
			}
			return (lo + (hi-lo)*(rank-cum)/float64(c)) * 1000
		}
		cum += float64(c)
	}
	return latBound(latBuckets-1) * 1000
}
