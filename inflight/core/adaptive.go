package core

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// adaptiveState is a zone's adaptive controller, made by the first handler
// that wants one and kept across reloads with what it learned.
type adaptiveState struct {
	mu    sync.Mutex
	a     *limiter.Adaptive
	users int // handlers using it; a reload overlaps the old and the new
}

// adaptive returns the zone's controller with cfg applied, for one more
// handler.
func (s *adaptiveState) adaptive(cfg limiter.AdaptiveConfig) *limiter.Adaptive {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users++
	if s.a == nil {
		s.a = limiter.NewAdaptive(cfg, time.Now())
	} else {
		s.a.Configure(cfg)
	}
	return s.a
}

// leave drops a handler's use of the controller.
func (s *adaptiveState) leave() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users--
}

// current returns the zone's controller, nil if no handler uses one (a
// reload replaced total adaptive with a fixed total: its gauges go).
func (s *adaptiveState) current() *limiter.Adaptive {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.users == 0 {
		return nil
	}
	return s.a
}

// ObserveAnswer tells the adaptive total that a unit admitted at admitted
// was answered, now, with code: an overload, an application's error
// (ignored) or a latency sample. A window that closes with a higher limit
// lets waiters in. Only for a gate with an adaptive total.
func (g *Gate) ObserveAnswer(admitted time.Time, code int) {
	if g.adaptive.Observe(time.Now(), admitted, code, g.zone.State(limiter.Look{}).Total.Units) {
		g.zone.Kick()
	}
}

// ObserveFailure tells the adaptive total that a unit failed, now, before
// it was answered, and is answered with status: an overload if status is
// one. Only for a gate with an adaptive total.
func (g *Gate) ObserveFailure(status int) {
	g.adaptive.Fail(time.Now(), status, g.zone.State(limiter.Look{}).Total.Units)
}

var (
	adaptiveLimitDesc = prometheus.NewDesc("caddy_inflight_adaptive_limit",
		"The adaptive total's current limit, by zone (the first zone of a name that has one).",
		[]string{"zone"}, nil)
	adaptiveBaselineDesc = prometheus.NewDesc("caddy_inflight_adaptive_baseline_seconds",
		"The adaptive total's baseline: the backend's time to first byte without a queue, as learned, by zone.",
		[]string{"zone"}, nil)
	adaptiveSampleDesc = prometheus.NewDesc("caddy_inflight_adaptive_sample_seconds",
		"The adaptive total's latest sample: the median time to first byte of its last window, by zone.",
		[]string{"zone"}, nil)
	adaptiveDescs = []*prometheus.Desc{adaptiveLimitDesc, adaptiveBaselineDesc, adaptiveSampleDesc}
)

func collectAdaptive(ch chan<- prometheus.Metric, label string, a *limiter.Adaptive) {
	ch <- prometheus.MustNewConstMetric(adaptiveLimitDesc, prometheus.GaugeValue, float64(a.Limit()), label)
	ch <- prometheus.MustNewConstMetric(adaptiveBaselineDesc, prometheus.GaugeValue, a.Baseline().Seconds(), label)
	ch <- prometheus.MustNewConstMetric(adaptiveSampleDesc, prometheus.GaugeValue, a.Sample().Seconds(), label)
}
