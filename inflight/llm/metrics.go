package llm

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
)

// usageRatioBuckets are the bounds of reported ÷ estimated tokens: an
// estimate ten times too high lands at 0.1, one twice too low at 2.
var usageRatioBuckets = []float64{0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1, 1.1, 1.5, 2, 4}

// The collectors are made once per process so their values outlive
// reloads, and registered in every config's registry with the zones' (see
// Collectors). Their names are written whole, as core's are.
var (
	reportedTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "caddy_inflight_reported_tokens_total",
		Help: "Tokens the model reported using, for requests with cost tokens, by zone and kind: input (the prompt, cached tokens included), cached (prompt tokens read from a cache), output.",
	}, []string{"zone", "kind"})

	usageRatio = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "caddy_inflight_usage_ratio",
		Help:    "Tokens the model reported (input + output) ÷ the tokens the request was estimated to hold (its cost), per request that reported its usage, by zone: below 1 the estimate held back room, above 1 the backend held more than was reserved.",
		Buckets: usageRatioBuckets,
	}, []string{"zone"})

	outputEstimateDesc = prometheus.NewDesc("caddy_inflight_output_estimate_tokens",
		"Output tokens counted now for a request that names no max_tokens, by zone and model, for zones whose handlers learn it (cost tokens with default_output auto): the learned estimate, or default_output until learnt. model is empty for the zone's own, which models without an estimate of their own count; a model has a series from its 20th report, at most 64 models per zone.",
		[]string{"zone", "model"}, nil)
)

// Collectors are the LLM metrics, for the edge to register with its
// gate's (core.Edge.Metrics).
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{reportedTokens, usageRatio, estimateCollector{}}
}

// usageMetrics are a handler's children of the usage metrics.
type usageMetrics struct {
	input, cached, output prometheus.Counter
	ratio                 prometheus.Observer
}

// usageMetricsFor returns the children of the usage metrics for zone.
func usageMetricsFor(zone string) usageMetrics {
	return usageMetrics{
		input:  reportedTokens.WithLabelValues(zone, "input"),
		cached: reportedTokens.WithLabelValues(zone, "cached"),
		output: reportedTokens.WithLabelValues(zone, "output"),
		ratio:  usageRatio.WithLabelValues(zone),
	}
}

// estimateCollector reads the zones' output estimates at scrape time.
type estimateCollector struct{}

func (estimateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- outputEstimateDesc }

// Collect sends the output estimates of the zones that learn them, their
// own and their models', once per zone name.
func (estimateCollector) Collect(ch chan<- prometheus.Metric) {
	seen := map[string]bool{}
	core.EachExtension(func(zone string, x core.Extension) {
		l, ok := x.(*outputLearner)
		if !ok || seen[zone] {
			return
		}
		st := l.state()
		if st == nil || st.OutputEstimate == 0 {
			return
		}
		seen[zone] = true
		ch <- prometheus.MustNewConstMetric(outputEstimateDesc, prometheus.GaugeValue, float64(st.OutputEstimate), zone, "")
		for _, m := range st.Models {
			ch <- prometheus.MustNewConstMetric(outputEstimateDesc, prometheus.GaugeValue, float64(m.OutputEstimate), zone, m.Model)
		}
	})
}
