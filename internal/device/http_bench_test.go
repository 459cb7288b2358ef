package device_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/device"
)

// BenchmarkApply: writes through the HTTP driver to an in-process
// firmware-sim, D devices written concurrently (one write in flight each,
// as the agent's workers do). ns/op is the CPU of both ends on this
// machine's cores, so compare drivers side by side in one run.
func BenchmarkApply(b *testing.B) {
	for _, devs := range []int{1, 64} {
		b.Run(fmt.Sprintf("devices=%d", devs), func(b *testing.B) {
			types := map[string]string{}
			for i := range devs {
				types[fmt.Sprintf("d%d", i)] = "generic"
			}
			s := sim.StartForTestWith(b, sim.Options{Devices: types, Logger: slog.New(slog.DiscardHandler)}, "")
			cfgs := map[string]device.HTTPDevice{}
			for id := range types {
				cfgs[id] = device.HTTPDevice{URL: s.URL(), Idempotent: true, Queryable: true}
			}
			drv, err := device.NewHTTP(device.HTTPOptions{Devices: cfgs})
			if err != nil {
				b.Fatal(err)
			}
			defer drv.Close()
			params := json.RawMessage(`{"seq":1,"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`)
			var next atomic.Int64
			var failed atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			for i := range devs {
				wg.Add(1)
				go func(dev string) {
					defer wg.Done()
					for {
						n := next.Add(1)
						if n > int64(b.N) {
							return
						}
						key := fmt.Sprintf("k-%s-%d", dev, n)
						r := drv.Apply(context.Background(), device.Write{Device: dev, OpID: key, Key: key, Fence: 1, Action: "set", Params: params})
						if r.Outcome != device.Applied {
							failed.Add(1)
						}
					}
				}(fmt.Sprintf("d%d", i))
			}
			wg.Wait()
			if f := failed.Load(); f > 0 {
				b.Fatalf("%d writes not applied", f)
			}
		})
	}
}
