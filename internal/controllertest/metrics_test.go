package controllertest

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/etcdtest"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// The controller's series (docs/controller.md, Metrics) against a real
// etcd and a real broker: an acquire, renewals, the hold time and the loss
// a stale Result causes, and the stale Result itself.
func TestControllerMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := controller.NewMetrics(reg)
	c := etcdtest.Start(t, 1)
	cli := newClient(t, c.Endpoints()...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := controller.Acquire(ctx, cli, []string{"locks/m"}, &controller.LockOptions{TTL: 2 * time.Second, RenewInterval: 100 * time.Millisecond, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := testutil.GatherAndCount(reg, "edge_controller_acquire_wait_seconds"); err != nil || got != 2 {
		t.Fatalf("%d acquire series, want 2 (acquired, timeout)", got)
	}
	testkit.Eventually(t, 10*time.Second, "a renewal observed", func() bool {
		return histCount(t, reg, "edge_controller_renew_seconds") > 0
	})
	if n := histCount(t, reg, "edge_controller_acquire_wait_seconds"); n != 1 {
		t.Fatalf("acquire_wait observations %d, want 1", n)
	}

	// A Result showing a newer owner: counted stale, and the holder is lost.
	broker := mqtttest.StartMosquitto(t).URL()
	startResponder(t, broker, "gw-m", func(cmd wire.Command, _ int) []delayed {
		return []delayed{{0, result(cmd, wire.CodeStaleFence, cmd.Fence+10)}}
	})
	s := controller.NewSender(dial(t, broker, "gw-m"), h, &controller.SendOptions{Metrics: m})
	if _, err := s.Send(ctx, "pump-7", "set", nil); err == nil {
		t.Fatal("a stale_fence send succeeded")
	}
	if h.State() != controller.StateLost {
		t.Fatalf("holder %s after a stale Result, want LOST", h.State())
	}
	if v := counterValue(t, reg, "edge_controller_stale_results_total", ""); v != 1 {
		t.Fatalf("stale results %v, want 1", v)
	}
	if v := counterValue(t, reg, "edge_controller_losses_total", "newer_fence"); v != 1 {
		t.Fatalf("losses{newer_fence} %v, want 1", v)
	}
	if n := histCount(t, reg, "edge_controller_hold_seconds"); n != 1 {
		t.Fatalf("hold observations %d, want 1", n)
	}
}

// counterValue is the value of the counter name in reg whose one label
// has the value label ("" for a counter without labels).
func counterValue(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if l := m.GetLabel(); (label == "" && len(l) == 0) || (len(l) == 1 && l[0].GetValue() == label) {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no counter %s{%s} in the registry", name, label)
	return 0
}

// histCount is the number of observations of the histogram name in reg.
func histCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			n += m.GetHistogram().GetSampleCount()
		}
	}
	return n
}
