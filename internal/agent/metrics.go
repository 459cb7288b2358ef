package agent

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edge-agent/edge-agent/wire"
)

// metrics are the agent's Prometheus series. No label carries an op_id.
type metrics struct {
	commands        *prometheus.CounterVec   // by code
	fenceRejections prometheus.Counter       // stale_fence
	unknowns        prometheus.Counter       // writes whose outcome became unknown
	replays         prometheus.Counter       // dedup replays (duplicate: true)
	retained        prometheus.Counter       // RETAIN=1 deliveries ignored
	writeSeconds    *prometheus.HistogramVec // device write latency by outcome
	queueDepth      *prometheus.GaugeVec     // by worker
	published       prometheus.Counter       // Results published from the outbox
	unpublishable   prometheus.Counter       // Results dropped: their topic can never be published to
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edge_agent_commands_total", Help: "Commands answered, by result code (final and unknown Results, replays included).",
		}, []string{"code"}),
		fenceRejections: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edge_agent_fence_rejections_total", Help: "Commands and barriers rejected stale_fence.",
		}),
		unknowns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edge_agent_unknown_outcomes_total", Help: "Device writes whose outcome became unknown.",
		}),
		replays: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edge_agent_dedup_replays_total", Help: "Resends answered with the recorded outcome (duplicate: true).",
		}),
		retained: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edge_agent_retained_ignored_total", Help: "Deliveries with RETAIN=1 on a cmd topic, ignored and cleared.",
		}),
		writeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "edge_agent_device_write_seconds", Help: "Latency of one device write (all its tries), by outcome.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"outcome"}),
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "edge_agent_queue_depth", Help: "Commands in a worker's inbox (d:{device} or g:{group}).",
		}, []string{"worker"}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edge_agent_results_published_total", Help: "Results confirmed published from the outbox.",
		}),
		unpublishable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edge_agent_results_unpublishable_total", Help: "Results and answers dropped because the broker can never take them (an invalid topic).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.commands, m.fenceRejections, m.unknowns, m.replays, m.retained,
			m.writeSeconds, m.queueDepth, m.published, m.unpublishable)
	}
	for _, c := range wire.Codes {
		m.commands.WithLabelValues(string(c))
	}
	return m
}

func (m *metrics) answered(c wire.Code) {
	m.commands.WithLabelValues(string(c)).Inc()
	if c == wire.CodeStaleFence {
		m.fenceRejections.Inc()
	}
}
