package agent

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// metrics are the agent's Prometheus series (docs/operations.md, Metrics:
// the names are a contract). No label carries an op_id, and a device label
// carries only a configured device's ID, never one read from a message.
type metrics struct {
	commands        *prometheus.CounterVec   // by code
	outcomes        *prometheus.CounterVec   // by configured device and code
	commandSeconds  prometheus.Histogram     // arrival to outcome
	fenceRejections prometheus.Counter       // stale_fence
	unknowns        prometheus.Counter       // writes whose outcome became unknown
	replays         prometheus.Counter       // dedup replays (duplicate: true)
	retained        prometheus.Counter       // RETAIN=1 deliveries ignored
	writeSeconds    *prometheus.HistogramVec // device write latency by outcome
	queueDepth      *prometheus.GaugeVec     // by device or group
	queueLimit      *prometheus.GaugeVec     // by device or group
	published       prometheus.Counter       // Results published from the outbox
	unpublishable   prometheus.Counter       // Results dropped: their topic can never be published to
	reg             prometheus.Registerer
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edge_agent_commands_total", Help: "Results handed out, by code: a command's unknown Result and its final one count once each, and every replay (duplicate: true, also in edge_agent_dedup_replays_total) counts again.",
		}, []string{"code"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edge_agent_device_outcomes_total", Help: "Results by configured device and code (device=\"\" for a device that is not configured).",
		}, []string{"device", "code"}),
		commandSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "edge_agent_command_seconds", Help: "Time from a command's arrival to its outcome's commit (commands that entered the inbox).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
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
			Name: "edge_agent_queue_depth", Help: "Commands in a worker's inbox: a lone device's (device=ID, group=\"\") or a group's (device=\"\", group=NAME).",
		}, []string{"device", "group"}),
		queueLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "edge_agent_queue_limit", Help: "A worker's queue limit (devices[].queue; a group's is the sum of its members'); busy beyond it.",
		}, []string{"device", "group"}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edge_agent_results_published_total", Help: "Results confirmed published from the outbox.",
		}),
		unpublishable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edge_agent_results_unpublishable_total", Help: "Results and answers dropped because the broker can never take them (an invalid topic).",
		}),
		reg: reg,
	}
	if reg != nil {
		reg.MustRegister(m.commands, m.outcomes, m.commandSeconds, m.fenceRejections, m.unknowns, m.replays, m.retained,
			m.writeSeconds, m.queueDepth, m.queueLimit, m.published, m.unpublishable)
	}
	for _, c := range wire.Codes {
		m.commands.WithLabelValues(string(c))
	}
	return m
}

// workerLabels are a worker's device and group labels.
func workerLabels(id string) (dev, group string) {
	if g, ok := strings.CutPrefix(id, "g:"); ok {
		return "", g
	}
	return strings.TrimPrefix(id, "d:"), ""
}

// gauges registers the series computed at scrape time from a.
func (m *metrics) gauges(a *Agent) {
	if m.reg == nil {
		return
	}
	timeout := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "edge_agent_device_timeout_seconds", Help: "A configured device's driver.timeout (per try): what the alert on slow commits compares with.",
	}, []string{"device"})
	for id, rt := range a.devs {
		timeout.WithLabelValues(id).Set(rt.cfg.Timeout.Seconds())
		for _, c := range wire.Codes {
			m.byDeviceAdd(rt, c, 0) // every configured device's series from 0, so rate() and increase() see its first outcome
		}
	}
	m.reg.MustRegister(timeout, deviceCollector{a},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edge_agent_store_ok", Help: "1 while the store commits; 0 once a commit failed (the agent then exits 1: invariant 5).",
		}, func() float64 {
			if a.st.Err() != nil {
				return 0
			}
			return 1
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edge_agent_inbox_depth", Help: "Commands in every inbox (queued, pending or held unknown), all workers.",
		}, func() float64 {
			var n int64
			for _, w := range a.workers {
				n += w.depth.Load()
			}
			return float64(n)
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edge_agent_writes_held_unknown", Help: "Writes whose outcome is unknown now (recorded unknown, not yet final): each holds its device or group.",
		}, func() float64 { return float64(a.held.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "edge_agent_event_clients", Help: "Open GET /v1/events streams.",
		}, func() float64 { return float64(a.ev.n.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "edge_agent_event_clients_dropped_total", Help: "GET /v1/events streams dropped because they fell EventBuffer events behind.",
		}, func() float64 { return float64(a.ev.dropped.Load()) }),
	)
}

func (m *metrics) answered(c wire.Code) {
	m.commands.WithLabelValues(string(c)).Inc()
	if c == wire.CodeStaleFence {
		m.fenceRejections.Inc()
	}
}

// byDevice counts an outcome of rt's device (nil: a device that is not
// configured, labelled ""), binding each child once.
func (m *metrics) byDevice(rt *devRT, c wire.Code) {
	if rt == nil {
		m.outcomes.WithLabelValues("", string(c)).Inc()
		return
	}
	m.byDeviceAdd(rt, c, 1)
}

func (m *metrics) byDeviceAdd(rt *devRT, c wire.Code, n float64) {
	i, ok := codeIndex[c]
	if !ok {
		return
	}
	ctr := rt.outc[i].Load()
	if ctr == nil {
		cc := m.outcomes.WithLabelValues(rt.cfg.ID, string(c))
		ctr = &cc
		rt.outc[i].Store(ctr)
	}
	(*ctr).Add(n)
}

// deviceCollector computes, at scrape time, each configured device's
// last_fence and what the agent last heard from it, and the age of the
// oldest write held unknown.
type deviceCollector struct{ a *Agent }

var (
	descLastFence = prometheus.NewDesc("edge_agent_device_last_fence",
		"A configured device's last_fence: the highest fence it has accepted (what the alert on a fence jump compares with its recent values).", []string{"device"}, nil)
	descReachable = prometheus.NewDesc("edge_agent_device_reachable",
		"1 when the last try to reach the device (a write or a query) got an answer, 0 when it did not; absent before any try since the agent started.", []string{"device"}, nil)
	descLastContact = prometheus.NewDesc("edge_agent_device_last_contact_timestamp_seconds",
		"Unix time the device last answered a write or a query; absent before any answer since the agent started.", []string{"device"}, nil)
	descOldestHeld = prometheus.NewDesc("edge_agent_oldest_held_write_age_seconds",
		"Seconds since the oldest write held unknown now was recorded unknown; 0 when none is held.", nil, nil)
)

func (c deviceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLastFence
	ch <- descReachable
	ch <- descLastContact
	ch <- descOldestHeld
}

func (c deviceCollector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	for id, rt := range a.devs {
		ch <- prometheus.MustNewConstMetric(descLastFence, prometheus.GaugeValue, float64(rt.lastFence.Load()), id)
		ct, tried := rt.lastContact()
		if !tried {
			continue
		}
		up := 0.0
		if ct.reached {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(descReachable, prometheus.GaugeValue, up, id)
		if !ct.last.IsZero() {
			ch <- prometheus.MustNewConstMetric(descLastContact, prometheus.GaugeValue, float64(ct.last.UnixNano())/1e9, id)
		}
	}
	ch <- prometheus.MustNewConstMetric(descOldestHeld, prometheus.GaugeValue, a.oldestHeldAge().Seconds())
}
