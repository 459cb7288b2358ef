// Command time-window is a policy plugin: the listed actions may run only
// inside a daily time window (e.g. noisy maintenance at night). Other
// actions are not affected. The window is [start, end) and may wrap past
// midnight. Times are UTC unless utc_offset is given ("+02:00"): a WASI
// guest has no time zone database.
//
// Config: {"actions": ["flush"], "start": "22:00", "end": "06:00", "utc_offset": "+00:00"}
package main

import (
	"errors"
	"time"

	"github.com/edge-agent/edge-agent/plugins/sdk"
)

func init() { sdk.Register(sdk.Plugin{Init: setup, Decide: decide}) }

func main() {}

var (
	actions      []string
	start, end   int // minutes after midnight
	offset       int // minutes east of UTC
	startS, endS string
)

func clock(s string) (int, bool) {
	t, err := time.Parse("15:04", s)
	if err != nil {
		return 0, false
	}
	return t.Hour()*60 + t.Minute(), true
}

func setup(cfg sdk.Object) error {
	if err := cfg.Only("actions", "start", "end", "utc_offset"); err != nil {
		return err
	}
	v, ok := cfg.Get("actions")
	if !ok {
		return errors.New(`"actions" is required`)
	}
	if actions, ok = v.Strings(); !ok {
		return errors.New(`"actions" must be an array of strings`)
	}
	if startS, ok = cfg.Str("start"); !ok {
		return errors.New(`"start" is required ("HH:MM")`)
	}
	if start, ok = clock(startS); !ok {
		return errors.New(`"start" must be "HH:MM"`)
	}
	if endS, ok = cfg.Str("end"); !ok {
		return errors.New(`"end" is required ("HH:MM")`)
	}
	if end, ok = clock(endS); !ok {
		return errors.New(`"end" must be "HH:MM"`)
	}
	if start == end {
		return errors.New(`"start" and "end" are equal: the window would be empty`)
	}
	if s, found := cfg.Str("utc_offset"); found {
		t, err := time.Parse("-07:00", s)
		if err != nil {
			return errors.New(`"utc_offset" must be "+HH:MM" or "-HH:MM"`)
		}
		_, off := t.Zone()
		offset = off / 60
	}
	return nil
}

func inside(m int) bool {
	if start < end {
		return m >= start && m < end
	}
	return m >= start || m < end // wraps past midnight
}

func decide(in *sdk.Input) sdk.Decision {
	listed := false
	for _, a := range actions {
		if a == in.Command.Action {
			listed = true
			break
		}
	}
	if !listed {
		return sdk.Allow()
	}
	now := in.Now()
	if now.IsZero() {
		return sdk.Deny("no valid \"now\" in the input")
	}
	local := now.Add(time.Duration(offset) * time.Minute)
	if inside(local.Hour()*60 + local.Minute()) {
		return sdk.Allow()
	}
	return sdk.Deny("action " + in.Command.Action + " is allowed only between " + startS + " and " + endS)
}
