package policy

import (
	"context"
	"encoding/json"

	"io"
	"log/slog"
	"os"
	"testing"
	"time"
)

// The figures and the command that produced them are in
// BENCHMARKS.md ("Policy plugins").

// benchInput is a ~200-byte command, as the agent passes it.
func benchInput(dev string) Input {
	return Input{
		Device:    DeviceRef{ID: dev, Type: "pump"},
		Command:   CommandView{OpID: "op-01HZX3K9Q2W8E7R6T5Y4U3I2O1", Fence: 742, Action: "set", Params: json.RawMessage(`{"rpm":1200,"mode":"auto"}`), Holder: "ctl-a"},
		State:     json.RawMessage(`{"rpm":1100,"mode":"auto"}`),
		LastFence: 741,
		Now:       time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC),
	}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

const rangeConfig = `{"param":"rpm","min":0,"max":3000}`

// benchDeadline is the per-call deadline of the benchmarks: armed on
// every call like the default 50ms, but long enough that a loaded machine
// does not turn a slow call into a failure.
const benchDeadline = time.Second

func benchHost(b *testing.B, plugin, mode string) *Host {
	b.Helper()
	benchNoDeadline = mode == "none"
	b.Cleanup(func() { benchNoDeadline = false })
	h := NewHost(HostOptions{CacheDir: sharedCache(b), Logger: quiet,
		CloseOnContextDone: mode == "closeOnDone", Defaults: Limits{Timeout: benchDeadline}})
	cfg := json.RawMessage(rangeConfig)
	if plugin == "gonop" || plugin == "gorawnop" {
		cfg = nil
	}
	if err := h.Bind("pump-7", Binding{Path: pluginPath(b, plugin), Config: cfg}); err != nil {
		b.Fatal(err)
	}
	if err := h.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { h.Close(context.Background()) })
	return h
}

// goRangeLimit is the range-limit rule as plain Go in the agent's
// process: the floor a wasm plugin is compared with. It gets the same
// deadline treatment a Go policy could have (a context with a timeout it
// checks); it still has to parse the params.
type goRangeLimit struct {
	param    string
	min, max float64
}

func (g goRangeLimit) Evaluate(ctx context.Context, _ string, in Input) (Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, benchDeadline)
	defer cancel()
	var params map[string]json.RawMessage
	if err := json.Unmarshal(in.Command.Params, &params); err != nil {
		return Decision{}, err
	}
	raw, ok := params[g.param]
	if !ok {
		return Decision{Allow: true}, nil
	}
	var x float64
	if err := json.Unmarshal(raw, &x); err != nil {
		return Decision{Reason: g.param + " is not a number"}, nil
	}
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	if x > g.max || x < g.min {
		return Decision{Reason: "out of range"}, nil
	}
	return Decision{Allow: true}, nil
}

// BenchmarkEvaluate: one ~200-byte command through the range-limit rule,
// per call, with each way of bounding a call:
//
//	interrupt    the host's injected fuel/interrupt check + a timer (the default)
//	closeOnDone  wazero's WithCloseOnContextDone + a context deadline
//	none         no deadline at all (unsafe: for reference only)
func BenchmarkEvaluate(b *testing.B) {
	ctx := context.Background()
	b.Run("plain-go", func(b *testing.B) {
		var ev Evaluator = goRangeLimit{param: "rpm", min: 0, max: 3000}
		in := benchInput("pump-7")
		b.ReportAllocs()
		for b.Loop() {
			if d, err := ev.Evaluate(ctx, "pump-7", in); err != nil || !d.Allow {
				b.Fatal(d, err)
			}
		}
	})
	for _, plugin := range []string{"range-limit-c", "range-limit", "gorawnop", "gonop"} {
		for _, mode := range []string{"interrupt", "closeOnDone", "none"} {
			b.Run(plugin+"/"+mode, func(b *testing.B) {
				h := benchHost(b, plugin, mode)
				in := benchInput("pump-7")
				b.ReportAllocs()
				for b.Loop() {
					d, err := h.Evaluate(ctx, "pump-7", in)
					if err != nil || !d.Allow {
						b.Fatal(d, err)
					}
				}
			})
		}
	}
}

// BenchmarkEvaluateParallel: 8 devices sharing one Go plugin pool, from
// as many goroutines as GOMAXPROCS.
func BenchmarkEvaluateParallel(b *testing.B) {
	for _, plugin := range []string{"range-limit-c", "range-limit"} {
		b.Run(plugin, func(b *testing.B) {
			h := NewHost(HostOptions{CacheDir: sharedCache(b), Logger: quiet, Defaults: Limits{Timeout: benchDeadline}})
			devs := []string{"d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7"}
			for _, d := range devs {
				h.Bind(d, Binding{Path: pluginPath(b, plugin), Config: json.RawMessage(rangeConfig)})
			}
			if err := h.Start(context.Background()); err != nil {
				b.Fatal(err)
			}
			defer h.Close(context.Background())
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					dev := devs[i%len(devs)]
					i++
					if _, err := h.Evaluate(context.Background(), dev, benchInput(dev)); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkInstance: instantiating one warm instance (instantiate,
// _initialize, policy_abi_version, policy_init), the first call on a fresh
// instance, and the memory a Go instance holds (reported as mem-bytes:
// its linear memory after init and after 1000 calls).
func BenchmarkInstance(b *testing.B) {
	ctx := context.Background()
	for _, plugin := range []string{"range-limit-c", "range-limit"} {
		h := benchHost(b, plugin, "interrupt")
		p := h.table.Load().pools["pump-7"]
		in := benchInput("pump-7")
		b.Run(plugin+"/instantiate", func(b *testing.B) {
			var mem uint32
			for b.Loop() {
				inst, err := h.eng.newInstance(ctx, p.plugin, p.config, p.sink, p.lim)
				if err != nil {
					b.Fatal(err)
				}
				mem = inst.mem.Size()
				inst.close()
			}
			b.ReportMetric(float64(mem), "mem-bytes")
		})
		b.Run(plugin+"/first-call", func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				inst, err := h.eng.newInstance(ctx, p.plugin, p.config, p.sink, p.lim)
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if _, _, err := inst.evaluate(ctx, &in, &p.lim); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				inst.close()
				b.StartTimer()
			}
		})
		b.Run(plugin+"/mem-after-1000-calls", func(b *testing.B) {
			var mem uint32
			for b.Loop() {
				inst, err := h.eng.newInstance(ctx, p.plugin, p.config, p.sink, p.lim)
				if err != nil {
					b.Fatal(err)
				}
				for i := 0; i < 1000; i++ {
					if _, _, err := inst.evaluate(ctx, &in, &p.lim); err != nil {
						b.Fatal(err)
					}
				}
				mem = inst.mem.Size()
				inst.close()
			}
			b.ReportMetric(float64(mem), "mem-bytes")
		})
	}
}

// BenchmarkStartup: Start with all the example plugins (5 Go, 1 C), with
// an empty compilation cache (cold) and with a populated one (warm: what a
// restart sees).
func BenchmarkStartup(b *testing.B) {
	start := func(b *testing.B, cache string) {
		h := &testHost{Host: NewHost(HostOptions{CacheDir: cache, Logger: quiet})}
		bindExamples(b, h)
		if err := h.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		if err := h.Close(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			dir, err := os.MkdirTemp("", "edge-bench-cache-")
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			start(b, dir)
			b.StopTimer()
			os.RemoveAll(dir)
			b.StartTimer()
		}
	})
	b.Run("warm", func(b *testing.B) {
		dir := b.TempDir()
		start(b, dir) // populate
		for b.Loop() {
			start(b, dir)
		}
	})
}
