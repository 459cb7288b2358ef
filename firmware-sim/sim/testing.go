package sim

import (
	"context"
	"testing"
)

// StartForTest starts a simulator of devices (ID -> type) on a free
// loopback port and closes it in t.Cleanup. Other packages' tests use it as
// their device.
func StartForTest(t testing.TB, devices map[string]string) *Sim {
	t.Helper()
	return StartForTestWith(t, Options{Devices: devices}, "")
}

// StartForTestWith is StartForTest with every option, on addr ("" means a
// free loopback port). Starting a second simulator with the first one's
// JournalPath and Addr, after closing the first, is a restart of the
// firmware.
func StartForTestWith(t testing.TB, opts Options, addr string) *Sim {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	s, err := New(opts)
	if err != nil {
		t.Fatalf("sim.New: %v", err)
	}
	if err := s.Start(context.Background(), addr); err != nil {
		t.Fatalf("sim.Start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("sim.Close: %v", err)
		}
	})
	return s
}
