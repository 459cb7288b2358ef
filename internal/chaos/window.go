package chaos

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// window is the minimal history around a violation of o at t: every
// event of o, and the events, journal entries and faults of its device
// within a second of them.
func (c *checker) window(o *opHist, t int64) []string {
	from, to := o.firstT(), t
	if from == 0 || from > t {
		from = t
	}
	from -= int64(500 * time.Millisecond)
	to += int64(500 * time.Millisecond)
	type line struct {
		t int64
		s string
	}
	var lines []line
	m := c.h.Meta
	for _, e := range c.h.Events {
		dev := e.Dev
		if e.Result != nil {
			dev = e.Result.Device
		}
		if e.Op != o.id && (dev != o.dev || e.T < from || e.T > to) {
			continue
		}
		s := fmt.Sprintf("%s %-14s %-9s %s", m.Stamp(e.T), e.Src, e.Ev, e.Op)
		switch {
		case e.Result != nil:
			s += fmt.Sprintf(" %s/%s lf=%d dup=%v at=%s %s", e.Result.Status, e.Result.Code, e.Result.LastFence, e.Result.Duplicate, m.Stamp(e.Result.At.UnixNano()), shortJSON(e.Result.Output))
		case e.Ev == EvInvoked:
			s += fmt.Sprintf(" fence=%d %s %s", e.Fence, e.Action, shortJSON(e.Params))
		case e.Err != "":
			s += " " + e.Err
		case e.Fence != 0:
			s += fmt.Sprintf(" fence=%d %s", e.Fence, e.Lock)
		}
		lines = append(lines, line{e.T, s})
	}
	for _, j := range c.h.Journal {
		at := j.At.UnixNano()
		if j.OpID == o.id || (j.Device == o.dev && at >= from && at <= to) {
			lines = append(lines, line{at, fmt.Sprintf("%s %-14s %-9s %s fence=%d seq=%d key=%s %s %s", m.Stamp(at), "firmware", "applied", j.OpID, j.Fence, j.Seq, j.Key, j.Action, shortJSON(j.Params))})
		}
	}
	for _, f := range c.h.Faults {
		if f.T >= from && f.T <= to {
			lines = append(lines, line{f.T, fmt.Sprintf("%s %-14s %-9s %s %s", m.Stamp(f.T), "fault", f.Phase, f.Kind, strings.TrimSpace(f.Target+" "+f.Detail))})
		}
	}
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].t < lines[j].t })
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		out = append(out, l.s)
	}
	if len(out) > 80 {
		out = append(out[:40], append([]string{fmt.Sprintf("... %d lines ...", len(out)-80)}, out[len(out)-40:]...)...)
	}
	return out
}
