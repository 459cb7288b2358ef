package policy

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"
)

// TestExamplePlugins runs each example plugin at Host level: allow, deny
// with its reason, and rewrite. range-limit and range-limit-c (Go and C)
// share their cases: the ABI is language-neutral.
func TestExamplePlugins(t *testing.T) {
	type tc struct {
		name       string
		plugin     string
		config     string
		device     string
		action     string
		params     string
		state      string
		group      map[string]string
		now        time.Time
		wantAllow  bool
		wantReason string
		wantParams string
	}
	night := time.Date(2026, 11, 30, 23, 30, 0, 0, time.UTC)
	noon := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	rangeCfg := `{"param":"rpm","min":0,"max":3000}`
	clampCfg := `{"param":"rpm","min":100,"max":3000.5,"clamp":true}`
	var cases []tc
	for _, p := range []string{"range-limit", "range-limit-c"} {
		cases = append(cases,
			tc{name: "inside", plugin: p, config: rangeCfg, params: `{"rpm":1200}`, wantAllow: true},
			tc{name: "at max", plugin: p, config: rangeCfg, params: `{"rpm":3000}`, wantAllow: true},
			tc{name: "above", plugin: p, config: rangeCfg, params: `{"rpm":4000}`, wantReason: "rpm 4000 above max 3000"},
			tc{name: "below", plugin: p, config: rangeCfg, params: `{"rpm":-5.5}`, wantReason: "rpm -5.5 below min 0"},
			tc{name: "exponent", plugin: p, config: rangeCfg, params: `{"rpm":4e3}`, wantReason: "rpm 4e3 above max 3000"},
			tc{name: "other param", plugin: p, config: rangeCfg, params: `{"mode":"auto"}`, wantAllow: true},
			tc{name: "no params", plugin: p, config: rangeCfg, wantAllow: true},
			tc{name: "not a number", plugin: p, config: rangeCfg, params: `{"rpm":"fast"}`, wantReason: "rpm is not a number"},
			tc{name: "clamp above", plugin: p, config: clampCfg, params: `{"mode":"auto","rpm":9000,"x":[1,{"y":2}]}`, wantAllow: true,
				wantParams: `{"mode":"auto","rpm":3000.5,"x":[1,{"y":2}]}`},
			tc{name: "clamp below", plugin: p, config: clampCfg, params: `{"rpm":0}`, wantAllow: true, wantParams: `{"rpm":100}`},
			tc{name: "clamp inside", plugin: p, config: clampCfg, params: `{"rpm":150}`, wantAllow: true},
		)
	}
	rampCfg := `{"param":"rpm","max_step":200}`
	cases = append(cases,
		tc{name: "small step", plugin: "ramp-limit", config: rampCfg, params: `{"rpm":1250}`, state: `{"rpm":1100}`, wantAllow: true},
		tc{name: "big step up", plugin: "ramp-limit", config: rampCfg, params: `{"rpm":1500}`, state: `{"rpm":1100}`,
			wantReason: "rpm change 1100 -> 1500 is 400, above max_step 200"},
		tc{name: "big step down", plugin: "ramp-limit", config: rampCfg, params: `{"rpm":0}`, state: `{"rpm":1100}`,
			wantReason: "rpm change 1100 -> 0 is 1100, above max_step 200"},
		tc{name: "no state yet", plugin: "ramp-limit", config: rampCfg, params: `{"rpm":3000}`, wantAllow: true},
		tc{name: "clamped step", plugin: "ramp-limit", config: `{"param":"rpm","max_step":200,"clamp":true}`,
			params: `{"rpm":0,"mode":"auto"}`, state: `{"rpm":1100}`, wantAllow: true, wantParams: `{"rpm":900,"mode":"auto"}`},
	)
	ilCfg := `{"pump":"pump-1","valve":"valve-1"}`
	cases = append(cases,
		tc{name: "valve opens, pump runs", plugin: "interlock", config: ilCfg, device: "valve-1", params: `{"open":1}`,
			group:      map[string]string{"pump-1": `{"rpm":1200}`, "valve-1": `{"open":0}`},
			wantReason: "valve-1 may not open while pump-1 runs (rpm 1200)"},
		tc{name: "valve opens, pump stopped", plugin: "interlock", config: ilCfg, device: "valve-1", params: `{"open":true}`,
			group: map[string]string{"pump-1": `{"rpm":0}`, "valve-1": `{"open":0}`}, wantAllow: true},
		tc{name: "valve closes, pump runs", plugin: "interlock", config: ilCfg, device: "valve-1", params: `{"open":0}`,
			group: map[string]string{"pump-1": `{"rpm":1200}`}, wantAllow: true},
		tc{name: "pump command", plugin: "interlock", config: ilCfg, device: "pump-1", params: `{"rpm":1500}`,
			group: map[string]string{"pump-1": `{"rpm":1200}`, "valve-1": `{"open":1}`}, wantAllow: true},
		tc{name: "pump unknown", plugin: "interlock", config: ilCfg, device: "valve-1", params: `{"open":1}`,
			wantReason: "valve-1 may not open: the state of pump-1 is unknown (not in the group view)"},
	)
	alCfg := `{"actions":["set","stop"]}`
	cases = append(cases,
		tc{name: "listed", plugin: "allowlist", config: alCfg, action: "stop", wantAllow: true},
		tc{name: "unlisted", plugin: "allowlist", config: alCfg, action: "self_destruct", wantReason: "action self_destruct is not allowed on pump-7"},
	)
	twCfg := `{"actions":["flush"],"start":"22:00","end":"06:00"}`
	cases = append(cases,
		tc{name: "inside window", plugin: "time-window", config: twCfg, action: "flush", now: night, wantAllow: true},
		tc{name: "outside window", plugin: "time-window", config: twCfg, action: "flush", now: noon,
			wantReason: "action flush is allowed only between 22:00 and 06:00"},
		tc{name: "unlisted action", plugin: "time-window", config: twCfg, action: "set", now: noon, wantAllow: true},
		tc{name: "offset", plugin: "time-window", config: `{"actions":["flush"],"start":"22:00","end":"06:00","utc_offset":"+11:00"}`,
			action: "flush", now: noon, wantAllow: true},
	)

	h := newTestHost(t, HostOptions{CacheDir: sharedCache(t)})
	for i, c := range cases {
		dev := c.device
		if dev == "" {
			dev = "pump-7"
		}
		cases[i].device = dev + "#" + c.plugin + "#" + c.name // one binding per case
		h.bind(t, cases[i].device, c.plugin, c.config)
	}
	h.start(t)
	for _, c := range cases {
		t.Run(c.plugin+"/"+c.name, func(t *testing.T) {
			action := c.action
			if action == "" {
				action = "set"
			}
			in := cmd(c.device, action, c.params)
			in.Device.ID = c.device[:indexOf(c.device, '#')]
			if c.state != "" {
				in.State = json.RawMessage(c.state)
			}
			if c.group != nil {
				in.Group = map[string]json.RawMessage{}
				for k, v := range c.group {
					in.Group[k] = json.RawMessage(v)
				}
			}
			if !c.now.IsZero() {
				in.Now = c.now
			}
			d, err := h.Evaluate(context.Background(), c.device, in)
			if err != nil {
				t.Fatalf("Evaluate: %v", err)
			}
			wantAllow := c.wantAllow || c.wantParams != ""
			if d.Allow != wantAllow || d.Reason != c.wantReason {
				t.Fatalf("got allow=%v reason=%q, want allow=%v reason=%q", d.Allow, d.Reason, wantAllow, c.wantReason)
			}
			if string(d.Params) != c.wantParams {
				t.Fatalf("params = %s, want %s", d.Params, c.wantParams)
			}
		})
	}
	if got := h.counter(t, h.m.evals, "range-limit", "rewrite"); got != 2 {
		t.Errorf("range-limit rewrites counted %v, want 2", got)
	}
}

func indexOf(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return len(s)
}

// TestConfigRejected: each example plugin refuses a bad policy.config, and
// Start fails with a *LoadError that names the device.
func TestConfigRejected(t *testing.T) {
	cases := []struct{ plugin, config string }{
		{"range-limit", `{"param":"rpm"}`},
		{"range-limit", `{"param":"rpm","max":3000,"typo":1}`},
		{"range-limit-c", `{"param":"rpm","min":"zero","max":3000}`},
		{"range-limit-c", `{"param":"rpm","max":3000,"typo":1}`},
		{"ramp-limit", `{"param":"rpm","max_step":-1}`},
		{"interlock", `{"pump":"pump-1"}`},
		{"allowlist", `{"actions":"set"}`},
		{"time-window", `{"actions":["flush"],"start":"25:00","end":"06:00"}`},
		{"init_reject", `{}`},
		{"loop", `{"a":1}`}, // no policy_init, but a config
	}
	for _, c := range cases {
		t.Run(c.plugin+c.config, func(t *testing.T) {
			h := newTestHost(t, HostOptions{CacheDir: sharedCache(t)})
			h.bind(t, "valve-9", c.plugin, c.config)
			err := h.Start(context.Background())
			var le *LoadError
			if !errors.As(err, &le) || !errors.Is(err, ErrConfigRejected) {
				t.Fatalf("Start = %v, want a *LoadError wrapping ErrConfigRejected", err)
			}
			if len(le.Devices) != 1 || le.Devices[0] != "valve-9" {
				t.Fatalf("devices = %v", le.Devices)
			}
			mustContain(t, err.Error(), "device valve-9")
			mustContain(t, err.Error(), pluginPath(t, c.plugin))
			if _, err := h.Evaluate(context.Background(), "valve-9", cmd("valve-9", "set", "")); !errors.Is(err, ErrNotStarted) {
				t.Fatalf("Evaluate after a failed Start = %v, want ErrNotStarted", err)
			}
		})
	}
}
