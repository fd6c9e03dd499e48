package core

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
	"github.com/caddy-inflight/caddy-inflight/inflight/metric"
)

// A request holds units, its cost (1 by default), in every limit and the
// total; metrics and the admin API show units beside the request counts.

// costBuckets are the request cost histogram's upper bounds, in units:
// powers of 4 from 1 to 262,144, so that one request and an LLM prompt of
// 200,000 tokens both land in a bucket of their own size.
var costBuckets = prometheus.ExponentialBuckets(1, 4, 10)

var (
	unitsDesc = prometheus.NewDesc("caddy_inflight_units",
		"Units held now by requests in flight (a request holds its cost, 1 by default), summed over keys, by zone and limit (total: the zone-wide total).",
		[]string{"zone", "limit"}, nil)

	waitingUnitsDesc = prometheus.NewDesc("caddy_inflight_waiting_units",
		"Units the requests waiting now ask for (their costs, before any clamping to a cap), by zone.",
		[]string{"zone"}, nil)

	requestCost = metric.Histogram("caddy_inflight_request_cost",
		"Units each admitted request held (its cost, clamped to the smallest cap it was checked against), by zone.",
		costBuckets, "zone")
)

// unitStats are a zone's units that the engine does not count: those its
// waiters ask for, and the costs of the requests it admitted since it was
// made, for the admin API. Only handlers with a cost count costs: without
// one every request holds one unit, and the request path writes nothing
// the whole zone shares.
type unitStats struct {
	waiting atomic.Int64
	costs   atomic.Int64 // admitted requests
	costSum atomic.Int64 // their units
}

// CostState sums up the costs of the requests a zone admitted since it was
// made: how many, and their units (sum / count is the mean cost).
type CostState struct {
	Count int64 `json:"count"`
	Sum   int64 `json:"sum"`
}

func (s *unitStats) state() CostState {
	return CostState{Count: s.costs.Load(), Sum: s.costSum.Load()}
}

// costObserver is the cost histogram of a zone, which also sums in its
// zone's stats; only handlers with a cost observe it.
type costObserver struct {
	prometheus.Observer
	s *unitStats
}

func (o costObserver) observe(units int64) {
	o.Observer.Observe(float64(units))
	o.s.costs.Add(1)
	o.s.costSum.Add(units)
}

// waitUnits counts the units of one request while it waits in its zone.
type waitUnits struct {
	zone  *unitStats
	units int64 // counted in zone.waiting; 0 while not waiting
}

// start counts req's cost as waiting.
func (w *waitUnits) start(req *limiter.Request) {
	w.units = limiter.ClampCost(req.Cost)
	w.zone.waiting.Add(w.units)
}

// end takes back what start counted, if it ran.
func (w *waitUnits) end() {
	if w.units != 0 {
		w.zone.waiting.Add(-w.units)
		w.units = 0
	}
}
