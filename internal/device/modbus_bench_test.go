package device_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/device"
)

// BenchmarkModbusApply: one pump's writes through the Modbus driver to an
// in-process firmware-sim, one at a time (as the agent's worker sends
// them): a write of holding register 0 and the read of the state points
// (rpm, running), so three requests per op. Over tcp:// and rtuovertcp://
// side by side: the difference is RTU's framing and the library's RTU
// client, which paces its frames as on a 19200 bps serial line.
func BenchmarkModbusApply(b *testing.B) {
	for _, scheme := range []string{"tcp", "rtuovertcp"} {
		b.Run("url="+scheme, func(b *testing.B) {
			s := sim.StartForTestWith(b, sim.Options{Devices: map[string]string{"pump-7": "pump"}, Logger: slog.New(slog.DiscardHandler)}, "")
			var addr string
			if scheme == "tcp" {
				if err := s.StartModbus("127.0.0.1:0"); err != nil {
					b.Fatal(err)
				}
				addr = s.ModbusAddr()
			} else {
				if err := s.StartModbusRTU("127.0.0.1:0"); err != nil {
					b.Fatal(err)
				}
				addr = s.ModbusRTUAddr()
			}
			cfg := pumpConfig(s, "pump-7")
			cfg.URL = scheme + "://" + addr
			m, err := device.NewModbus(device.ModbusOptions{Devices: map[string]device.ModbusDevice{"pump-7": cfg}})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if r := m.Apply(context.Background(), write("k", fmt.Sprintf(`{"rpm":%d}`, 1+i%6000))); r.Outcome != device.Applied {
					b.Fatalf("write %d: %s %s", i, r.Outcome, r.Reason)
				}
			}
		})
	}
}
