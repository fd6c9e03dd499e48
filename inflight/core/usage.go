package core

import (
	"math"
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
		"Output tokens counted now for a request that names no max_tokens, by zone and model, for zones whose handlers learn it (cost tokens with default_output auto): the learned estimate, or default_output until learnt. model is empty for the zone's own, which models without an estimate of their own count; a model has a series from its 20th report, at most 64 models per zone.",
		[]string{"zone", "model"}, nil)
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

// outputLearner learns a zone's output estimate, and one per model its
// requests name (see outputSeries and modelEstimates), from the output
// counts they reported, and sums up how far estimates were from the
// reports.
type outputLearner struct {
	mu      sync.Mutex
	zone    outputSeries
	models  modelEstimates
	scratch [outputWindow]int32 // for the quantile

	ceiling atomic.Int64 // the latest learning gate's; 0: nobody learns

	reports, reported, estimated, over atomic.Int64
}

// learn adds one output count of a request naming model to the zone's
// series and the model's.
func (l *outputLearner) learn(model string, output int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.zone.add(output, &l.scratch)
	l.models.learn(model, output, &l.scratch)
}

// learned is the estimate a request naming model counts, before its
// ceiling: the model's own, else the zone's; 0 until learnt.
func (l *outputLearner) learned(model string) int64 {
	if e := l.models.learned(model); e > 0 {
		return e
	}
	return l.zone.learned.Load()
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
	// now, and Learned whether it is learnt (else default_output), for
	// the zone: for requests naming a model without an estimate of its
	// own; with default_output auto only.
	OutputEstimate int64 `json:"output_estimate,omitempty"`
	Learned        bool  `json:"learned,omitempty"`
	// Models are the models with 20 reports or more, most reports first,
	// each with the estimate its requests count.
	Models []ModelEstimate `json:"models,omitempty"`
}

func (l *outputLearner) state() *UsageState {
	st := &UsageState{Reports: l.reports.Load(), Reported: l.reported.Load(), Estimated: l.estimated.Load(), Over: l.over.Load()}
	if c := l.ceiling.Load(); c > 0 {
		st.OutputEstimate, st.Learned = l.zone.estimate(c), l.zone.learned.Load() > 0
		l.mu.Lock()
		st.Models = l.models.shown(c, st.OutputEstimate)
		l.mu.Unlock()
	}
	if st.Reports == 0 && st.OutputEstimate == 0 {
		return nil
	}
	return st
}

// OutputEstimate returns the output tokens to count for a request of the
// gate's zone that names model and no output: the model's learned
// estimate, or the zone's for a model without one, within ceiling, or
// ceiling until one is learnt; and the learned one (0 until learnt), the
// most a request naming more counts.
func (g *Gate) OutputEstimate(model string, ceiling int64) (estimate, learned int64) {
	if l := g.zone.outputs.learned(model); l > 0 {
		learned = min(l, ceiling)
		return learned, learned
	}
	return ceiling, 0
}

// ReportUsage records the usage the model reported for a unit of the gate
// that named model and was estimated at estimated tokens (its cost), and
// sets its fair charge to it. With learn, its output count teaches the
// zone's output estimate and the model's, if the gate learns them: its
// request's output was not bounded below the estimate's ceiling. Only
// gates with costs report usage.
func (g *Gate) ReportUsage(t *Ticket, model string, u TokenUsage, estimated int64, learn bool) {
	total := u.Total()
	t.Req.Used = total
	g.usage.input.Add(float64(u.Input))
	g.usage.cached.Add(float64(u.Cached))
	g.usage.output.Add(float64(u.Output))
	g.usage.ratio.Observe(float64(total) / float64(max(estimated, 1)))
	g.zone.outputs.count(total, estimated)
	if learn && g.learns {
		g.zone.outputs.learn(model, u.Output)
	}
}

// usageMetrics are a gate's children of the usage metrics.
type usageMetrics struct {
	input, cached, output prometheus.Counter
	ratio                 prometheus.Observer
}

// collectOutputEstimate sends the output estimates of a zone that learns
// them, its own and its models', once per zone name.
func collectOutputEstimate(ch chan<- prometheus.Metric, z *zone, seen map[string]bool) {
	st := z.outputs.state()
	if st == nil || st.OutputEstimate == 0 || seen[z.label] {
		return
	}
	seen[z.label] = true
	ch <- prometheus.MustNewConstMetric(outputEstimateDesc, prometheus.GaugeValue, float64(st.OutputEstimate), z.label, "")
	for _, m := range st.Models {
		ch <- prometheus.MustNewConstMetric(outputEstimateDesc, prometheus.GaugeValue, float64(m.OutputEstimate), z.label, m.Model)
	}
}
