package app

import (
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edge-agent/edge-agent/internal/admin"
)

// processMetrics are the series of the process as a whole
// (docs/operations.md, Metrics): what it is, its broker session, its group
// commit.
type processMetrics struct {
	commitSeconds prometheus.Histogram
	commitUpdates prometheus.Histogram
}

func newProcessMetrics(reg prometheus.Registerer, gateway, version, revision string, connected func() bool) *processMetrics {
	m := &processMetrics{
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "edge_agent_store_commit_seconds", Help: "Time of one group commit of the store, fsync included.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		commitUpdates: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "edge_agent_store_commit_updates", Help: "Updates in one group commit (0: a commit of deferred deletions only).",
			Buckets: []float64{0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096},
		}),
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "edge_agent_build_info", Help: "1, labelled with the agent's version, the commit it was built from and the Go version that built it.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "goversion": runtime.Version()},
	})
	info.Set(1)
	gw := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "edge_agent_gateway_info", Help: "1, labelled with the agent's gateway_id: join it on instance to name a fleet's gateways.",
		ConstLabels: prometheus.Labels{"gateway": gateway},
	})
	gw.Set(1)
	reg.MustRegister(m.commitSeconds, m.commitUpdates, info, gw,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edge_agent_mqtt_connected", Help: "1 while the agent's MQTT session is connected and subscribed, else 0.",
		}, func() float64 {
			if connected() {
				return 1
			}
			return 0
		}))
	return m
}

// commit is the store's ObserveCommit.
func (m *processMetrics) commit(updates int, took time.Duration) {
	m.commitSeconds.Observe(took.Seconds())
	m.commitUpdates.Observe(float64(updates))
}

// plugins lists the policy plugins for GET /v1/status.
func (a *App) plugins() []admin.PluginStatus {
	if a.host == nil {
		return nil
	}
	var out []admin.PluginStatus
	for _, p := range a.host.Plugins() {
		out = append(out, admin.PluginStatus{Name: p.Name, Devices: p.Devices, State: p.State})
	}
	return out
}

func (a *App) mqttConnected() bool {
	mc := a.pub.c.Load()
	return a.boot.done() && mc != nil && mc.Subscribed()
}
