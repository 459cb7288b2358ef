package policy

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Host's Prometheus collectors. They count whether or not
// they are registered anywhere.
type metrics struct {
	evals     *prometheus.CounterVec   // plugin, result: allow, deny, rewrite, error
	failures  *prometheus.CounterVec   // plugin, kind: timeout, trap, exit, memory, plugin_error, bad_output, output_too_large, canceled
	replaced  *prometheus.CounterVec   // plugin
	failing   *prometheus.GaugeVec     // plugin: 1 while it keeps failing
	reloads   *prometheus.CounterVec   // plugin, result: ok, error
	compile   *prometheus.GaugeVec     // plugin: seconds the last load of the compiled code took
	instances *prometheus.GaugeVec     // plugin: live instances
	seconds   *prometheus.HistogramVec // plugin: time of one evaluation, waiting for an instance included
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		evals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edge_policy_evaluations_total",
			Help: "Policy evaluations by plugin and result (allow, deny, rewrite, error).",
		}, []string{"plugin", "result"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edge_policy_failures_total",
			Help: "Policy calls that failed (the command is rejected policy_error), by plugin and kind.",
		}, []string{"plugin", "kind"}),
		replaced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edge_policy_instances_replaced_total",
			Help: "Plugin instances thrown away after a failure.",
		}, []string{"plugin"}),
		failing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "edge_policy_failing",
			Help: "1 while a plugin has failed its last calls in a row (HostOptions.FailureThreshold).",
		}, []string{"plugin"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edge_policy_reloads_total",
			Help: "Plugin reloads by result (ok, error).",
		}, []string{"plugin", "result"}),
		compile: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "edge_policy_compile_seconds",
			Help: "Time the last compilation of a plugin took (small when it came from the on-disk cache).",
		}, []string{"plugin"}),
		instances: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "edge_policy_instances",
			Help: "Live plugin instances.",
		}, []string{"plugin"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "edge_policy_evaluation_seconds",
			Help:    "Time of one policy evaluation by plugin (waiting for a warm instance included; failures included).",
			Buckets: prometheus.ExponentialBuckets(0.00001, 2.5, 14),
		}, []string{"plugin"}),
	}
	if reg != nil {
		m.evals = register(reg, m.evals)
		m.failures = register(reg, m.failures)
		m.replaced = register(reg, m.replaced)
		m.failing = register(reg, m.failing)
		m.reloads = register(reg, m.reloads)
		m.compile = register(reg, m.compile)
		m.instances = register(reg, m.instances)
		m.seconds = register(reg, m.seconds)
	}
	return m
}

// register registers c, or returns the collector already registered under
// its name (two Hosts on one registry share their metrics).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
	}
	return c
}

// poolMetrics are the children of one plugin's metrics, bound once so the
// hot path does no label lookups.
type poolMetrics struct {
	allow, deny, rewrite, errs prometheus.Counter
	replaced                   prometheus.Counter
	failing                    prometheus.Gauge
	instances                  prometheus.Gauge
	seconds                    prometheus.Observer
	m                          *metrics
	plugin                     string
}

// failureKinds are the kind labels of edge_policy_failures_total
// (failureKind, and "init" for an instance that could not be made). Each
// plugin's series start at zero, so rate() and alerts see the first one.
var failureKinds = []string{"timeout", "memory", "exit", "trap", "plugin_error", "output_too_large", "bad_output", "other", "init"}

func (m *metrics) forPlugin(plugin string) *poolMetrics {
	for _, k := range failureKinds {
		m.failures.WithLabelValues(plugin, k)
	}
	return &poolMetrics{
		allow:     m.evals.WithLabelValues(plugin, "allow"),
		deny:      m.evals.WithLabelValues(plugin, "deny"),
		rewrite:   m.evals.WithLabelValues(plugin, "rewrite"),
		errs:      m.evals.WithLabelValues(plugin, "error"),
		replaced:  m.replaced.WithLabelValues(plugin),
		failing:   m.failing.WithLabelValues(plugin),
		instances: m.instances.WithLabelValues(plugin),
		seconds:   m.seconds.WithLabelValues(plugin),
		m:         m,
		plugin:    plugin,
	}
}

func (pm *poolMetrics) failure(kind string) {
	pm.errs.Inc()
	pm.m.failures.WithLabelValues(pm.plugin, kind).Inc()
}
