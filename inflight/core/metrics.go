package core

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
	"github.com/caddy-inflight/caddy-inflight/inflight/metric"
	"github.com/caddy-inflight/caddy-inflight/inflight/storestatus"
)

// The families are declared as package metric says; those read from the
// live zones at scrape time (stateCollector) with their full names too.
var (
	rejectedTotal = metric.Counter("caddy_inflight_rejected_total",
		"Requests refused by an inflight limit, by zone, limit and reason (full, timeout, queue_full, keys_full, store_error, dry_run).",
		"zone", "limit", "reason")

	waitSeconds = metric.Histogram("caddy_inflight_wait_seconds",
		"Time requests spent waiting for an inflight slot, by zone and outcome (admitted, timeout, aborted).",
		waitBuckets[:], "zone", "outcome")

	requestsDesc = prometheus.NewDesc("caddy_inflight_requests",
		"Requests in flight now, summed over keys, by zone and limit (total: the zone-wide total); see caddy_inflight_units for the units they hold.",
		[]string{"zone", "limit"}, nil)

	waitingDesc = prometheus.NewDesc("caddy_inflight_waiting",
		"Requests waiting for an inflight slot now, by zone.",
		[]string{"zone"}, nil)
)

// stateCollector reads the live zones at scrape time, so the request path
// updates no shared gauge: requests and units in flight are the engine's
// counts, and waiting its queues. An admitted request that did not wait,
// without a cost, per-key metrics or an adaptive total, writes only its
// keys' counts (and the total's, with a total): no metric, no tally of the
// zone (its units are its requests), so requests on different keys and
// cores share no cache line. A cost adds the cost histogram and the
// zone's cost sums; a refusal
// counts in caddy_inflight_rejected_total only (the admin API reads it
// back); a wait that ends, in the wait histograms and the zone's window
// of recent waits.
type stateCollector struct{}

func (stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- requestsDesc
	ch <- unitsDesc
	ch <- waitingDesc
	ch <- waitingUnitsDesc
	ch <- keyWaitingDesc
	for _, d := range adaptiveDescs {
		ch <- d
	}
}

func (stateCollector) Collect(ch chan<- prometheus.Metric) {
	type series struct{ zone, limit string }
	type load struct{ units, requests int64 }
	held := map[series]load{}
	waiting := map[string]load{}
	keyWaiting := map[[3]string]int64{}
	adaptive := map[string]*limiter.Adaptive{}
	now := time.Now()
	eachZone(func(z *zone, retired bool) {
		st := z.State(limiter.Look{Dims: true, WaitingKeys: z.keyDisplay.Load() != keysAnonymous})
		keys := z.waitingKeys(st)
		z.sweepKeyWaits(now, keys)
		if a := z.adaptive.current(); a != nil && !retired && adaptive[z.label] == nil {
			adaptive[z.label] = a
		}
		add := func(name string, c limiter.Count) {
			s := held[series{z.label, name}]
			held[series{z.label, name}] = load{s.units + c.Units, s.requests + c.Requests}
		}
		for d, name := range z.limits {
			add(name, st.Dims[d].Count)
		}
		if st.HasTotal {
			add(totalName, st.Total)
		}
		w := waiting[z.label]
		waiting[z.label] = load{w.units + z.units.waiting.Load(), w.requests + st.Waiting}
		addKeyWaiting(keyWaiting, z, keys)
	})
	for s, n := range held {
		ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.GaugeValue, float64(n.requests), s.zone, s.limit)
		ch <- prometheus.MustNewConstMetric(unitsDesc, prometheus.GaugeValue, float64(n.units), s.zone, s.limit)
	}
	for label, n := range waiting {
		ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(n.requests), label)
		ch <- prometheus.MustNewConstMetric(waitingUnitsDesc, prometheus.GaugeValue, float64(n.units), label)
	}
	sendKeyWaiting(ch, keyWaiting)
	for label, a := range adaptive {
		collectAdaptive(ch, label, a)
	}
}

// registerMetrics adds the collectors, and the edge's, to a config's
// registry; the same collectors registered twice in one config (two
// handlers) is not an error.
func registerMetrics(reg *prometheus.Registry, edge []prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range append(append(storestatus.Collectors(), edge...), rejectedTotal, waitSeconds, requestCost, keyRequests, keyWaitSeconds, keyGivenSeconds, stateCollector{}) {
		if err := reg.Register(c); err != nil {
			if _, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); !ok {
				return err
			}
		}
	}
	return nil
}

// Refusal reasons, as metrics and logs name them.
const (
	reasonFull      = "full"
	reasonTimeout   = "timeout"
	reasonQueueFull = "queue_full"
	reasonKeysFull  = "keys_full"
	reasonStore     = "store_error"
	// ReasonDryRun is the reason of a unit let through by dry_run that
	// would have been refused.
	ReasonDryRun = "dry_run"
)

func reasonFor(o limiter.Outcome) string {
	switch o {
	case limiter.Timeout:
		return reasonTimeout
	case limiter.QueueFull:
		return reasonQueueFull
	case limiter.KeysFull:
		return reasonKeysFull
	case limiter.Unavailable:
		return reasonStore
	}
	return reasonFull
}

// waitOutcomes are the ends of a wait, as the wait histograms count them.
var waitOutcomes = [...]limiter.Outcome{limiter.Admitted, limiter.Timeout, limiter.Aborted}

// outcomeLabel names a wait's end in the wait histogram.
func outcomeLabel(o limiter.Outcome) string {
	switch o {
	case limiter.Admitted:
		return "admitted"
	case limiter.Aborted:
		return "aborted"
	}
	return "timeout"
}
