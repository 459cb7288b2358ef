package controller

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a controller process's Prometheus series (docs/controller.md,
// Metrics): how long acquiring a lock takes, how long ownership lasts,
// renewal latency, losses of ownership and stale results. One Metrics is
// shared by every Holder and Sender of a process (LockOptions.Metrics,
// SendOptions.Metrics). Labels are bounded: no lock name, device or op_id.
type Metrics struct {
	acquireWait   *prometheus.HistogramVec // result: acquired, timeout
	hold          prometheus.Histogram
	renew         prometheus.Histogram
	renewFailures prometheus.Counter
	losses        *prometheus.CounterVec // cause: newer_fence, lease
	staleResults  prometheus.Counter
}

// NewMetrics makes the series and registers them with reg (nil: not
// registered, e.g. for a test that reads them directly). It panics when
// reg already holds series of these names, as prometheus.MustRegister
// does.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		acquireWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "edge_controller_acquire_wait_seconds", Help: "Time from Acquire to ACTIVE (result=acquired) or to giving up (result=timeout).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 14),
		}, []string{"result"}),
		hold: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "edge_controller_hold_seconds", Help: "Time a holder was ACTIVE, until it released or was LOST.",
			Buckets: prometheus.ExponentialBuckets(0.1, 3, 12),
		}),
		renew: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "edge_controller_renew_seconds", Help: "Latency of a confirmed lease renewal (keepalive).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 12),
		}),
		renewFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edge_controller_renew_failures_total", Help: "Lease renewals that failed or timed out.",
		}),
		losses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edge_controller_losses_total", Help: "Holders that became LOST: cause=newer_fence (a device reported a newer owner), lease (renewal overdue, session ended).",
		}, []string{"cause"}),
		staleResults: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edge_controller_stale_results_total", Help: "Results that showed a newer owner: stale_fence, or a last_fence above the command's fence.",
		}),
	}
	for _, r := range []string{"acquired", "timeout"} {
		m.acquireWait.WithLabelValues(r)
	}
	for _, c := range []string{"newer_fence", "lease"} {
		m.losses.WithLabelValues(c)
	}
	if reg != nil {
		reg.MustRegister(m.acquireWait, m.hold, m.renew, m.renewFailures, m.losses, m.staleResults)
	}
	return m
}

// The methods below accept a nil *Metrics (no metrics configured).

func (m *Metrics) acquired(since time.Time, ok bool) {
	if m == nil || since.IsZero() {
		return
	}
	r := "acquired"
	if !ok {
		r = "timeout"
	}
	m.acquireWait.WithLabelValues(r).Observe(time.Since(since).Seconds())
}

func (m *Metrics) held(since time.Time) {
	if m != nil && !since.IsZero() {
		m.hold.Observe(time.Since(since).Seconds())
	}
}

func (m *Metrics) renewed(took time.Duration, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.renewFailures.Inc()
		return
	}
	m.renew.Observe(took.Seconds())
}

func (m *Metrics) lost(cause error) {
	if m == nil {
		return
	}
	c := "lease"
	if errors.Is(cause, ErrNewerFence) {
		c = "newer_fence"
	}
	m.losses.WithLabelValues(c).Inc()
}

func (m *Metrics) stale() {
	if m != nil {
		m.staleResults.Inc()
	}
}
