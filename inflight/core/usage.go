package core

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// A unit whose cost is an estimate in tokens (an LLM request) may learn,
// once it ends, how many tokens the model reported it used. The zone then
// counts the reports (metrics, the admin API), sets the request's fair
// charge to them (the edge sets limiter.Request.Used), and, where the
// request named no output limit, learns from its output count the output
// estimate of the requests that name none (OutputEstimate).

// Learning the output estimate: the outputQuantile of the output counts
// of the zone's last outputWindow reports, once it has learnAfter of them,
// recomputed every relearnEvery reports, and never above the edge's
// ceiling.
const (
	outputWindow   = 1000
	learnAfter     = 100
	relearnEvery   = 16
	outputQuantile = 0.9
)

// usageRatioBuckets are the bounds of reported ÷ estimated tokens: an
// estimate ten times too high lands at 0.1, one twice too low at 2.
var usageRatioBuckets = []float64{0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1, 1.1, 1.5, 2, 4}

var (
	reportedTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "caddy",
		Subsystem: "inflight",
		Name:      "reported_tokens_total",
		Help:      "Tokens the model reported using, for requests with cost tokens, by zone and kind: input (the prompt, cached tokens included), cached (prompt tokens read from a cache), output.",
	}, []string{"zone", "kind"})

	usageRatio = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy",
		Subsystem: "inflight",
		Name:      "usage_ratio",
		Help:      "Tokens the model reported (input + output) ÷ the tokens the request was estimated to hold (its cost), per request that reported its usage, by zone: below 1 the estimate held back room, above 1 the backend held more than was reserved.",
		Buckets:   usageRatioBuckets,
	}, []string{"zone"})

	outputEstimateDesc = prometheus.NewDesc("caddy_inflight_output_estimate_tokens",
		"Output tokens counted now for a request that names no max_tokens, by zone, for zones whose handlers learn it (cost tokens with default_output auto): the learned estimate, or default_output until learnt.",
		[]string{"zone"}, nil)
)

// TokenUsage is the tokens a model reported for one request: Input
// counts the whole prompt, Cached the part of it read from a cache.
type TokenUsage struct {
	Input, Output, Cached int64
}

// Total is the tokens the request held at its end: input and output.
func (u TokenUsage) Total() int64 {
	if u.Input > math.MaxInt64-u.Output {
		return math.MaxInt64
	}
	return u.Input + u.Output
}

// outputLearner learns a zone's output estimate from the output counts
// its requests reported, and sums up how far estimates were from the
// reports. The window is fixed-size: a zone's memory does not grow with
// its traffic.
type outputLearner struct {
	mu     sync.Mutex
	recent [outputWindow]int32 // output counts, a ring; saturated at MaxInt32
	n      int                 // counts in recent, up to outputWindow
	next   int                 // where the next count goes
	since  int                 // counts since the estimate was computed
	sorted [outputWindow]int32 // scratch for the quantile

	learned atomic.Int64 // the quantile; 0 until learnAfter counts
	ceiling atomic.Int64 // the latest learning gate's; 0: nobody learns

	reports, reported, estimated, over atomic.Int64
}

// learn adds one output count to the window, and recomputes the estimate
// when due.
func (l *outputLearner) learn(output int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recent[l.next] = int32(min(output, math.MaxInt32))
	l.next = (l.next + 1) % outputWindow
	l.n = min(l.n+1, outputWindow)
	l.since++
	if l.n < learnAfter || (l.n > learnAfter && l.since < relearnEvery) {
		return
	}
	l.since = 0
	s := l.sorted[:l.n]
	copy(s, l.recent[:l.n])
	slices.Sort(s)
	rank := int(math.Ceil(outputQuantile*float64(l.n))) - 1 // nearest rank
	l.learned.Store(max(int64(s[rank]), 1))
}

// estimate is the output estimate with the given ceiling: the learned
// one, within it, or the ceiling until learnt.
func (l *outputLearner) estimate(ceiling int64) int64 {
	if e := l.learned.Load(); e > 0 {
		return min(e, ceiling)
	}
	return ceiling
}

// count sums up one report against the estimate the request was admitted
// with.
func (l *outputLearner) count(reported, estimated int64) {
	l.reports.Add(1)
	l.reported.Add(reported)
	l.estimated.Add(estimated)
	if reported > estimated {
		l.over.Add(1)
	}
}

// UsageState sums up, for the admin API and the live page, the usage the
// zone's requests reported since it was made against their estimates,
// and the output estimate with default_output auto.
type UsageState struct {
	// Reports is the requests that reported their usage; Reported the
	// tokens they reported (input + output) and Estimated the tokens they
	// were estimated at; Over how many reported more than their estimate.
	Reports   int64 `json:"reports"`
	Reported  int64 `json:"reported_tokens"`
	Estimated int64 `json:"estimated_tokens"`
	Over      int64 `json:"over_estimate"`
	// OutputEstimate is the output tokens a request naming none counts
	// now, and Learned whether it is learnt (else default_output); with
	// default_output auto only.
	OutputEstimate int64 `json:"output_estimate,omitempty"`
	Learned        bool  `json:"learned,omitempty"`
}

func (l *outputLearner) state() *UsageState {
	st := &UsageState{Reports: l.reports.Load(), Reported: l.reported.Load(), Estimated: l.estimated.Load(), Over: l.over.Load()}
	if c := l.ceiling.Load(); c > 0 {
		st.OutputEstimate, st.Learned = l.estimate(c), l.learned.Load() > 0
	}
	if st.Reports == 0 && st.OutputEstimate == 0 {
		return nil
	}
	return st
}

// OutputEstimate returns the output tokens to count for a request of the
// gate's zone that names none: the zone's learned estimate, within
// ceiling, or ceiling until it is learnt; and the learned one (0 until
// learnt), the most a request naming more counts.
func (g *Gate) OutputEstimate(ceiling int64) (estimate, learned int64) {
	if l := g.zone.outputs.learned.Load(); l > 0 {
		learned = min(l, ceiling)
		return learned, learned
	}
	return ceiling, 0
}

// ReportUsage records the usage the model reported for a unit of the gate
// that was estimated at estimated tokens (its cost), and sets its fair
// charge to it. With learn, its output count teaches the zone's output
// estimate, if the gate learns one: its request's output was not bounded
// below the estimate's ceiling. Only gates with costs report usage.
func (g *Gate) ReportUsage(t *Ticket, u TokenUsage, estimated int64, learn bool) {
	total := u.Total()
	t.Req.Used = total
	g.usage.input.Add(float64(u.Input))
	g.usage.cached.Add(float64(u.Cached))
	g.usage.output.Add(float64(u.Output))
	g.usage.ratio.Observe(float64(total) / float64(max(estimated, 1)))
	g.zone.outputs.count(total, estimated)
	if learn && g.learns {
		g.zone.outputs.learn(u.Output)
	}
}

// usageMetrics are a gate's children of the usage metrics.
type usageMetrics struct {
	input, cached, output prometheus.Counter
	ratio                 prometheus.Observer
}

// collectOutputEstimate sends the output estimate of a zone that learns
// one, once per zone name.
func collectOutputEstimate(ch chan<- prometheus.Metric, z *zone, seen map[string]bool) {
	c := z.outputs.ceiling.Load()
	if c == 0 || seen[z.label] {
		return
	}
	seen[z.label] = true
	ch <- prometheus.MustNewConstMetric(outputEstimateDesc, prometheus.GaugeValue, float64(z.outputs.estimate(c)), z.label)
}
