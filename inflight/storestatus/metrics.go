// Package storestatus is how a shared store (such as redisstore) reports on
// itself, without depending on the HTTP handler's package: the metrics of
// its operations, which the handler registers in Caddy's registry, and its
// health, which the admin API shows.
package storestatus

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-inflight/caddy-inflight/inflight/metric"
)

var (
	errorsTotal = metric.Counter("caddy_inflight_store_errors_total",
		"Failed operations on a shared store, by store, zone and operation (acquire, release, renew).",
		"store", "zone", "op")

	seconds = metric.Histogram("caddy_inflight_store_seconds",
		"Latency of shared store operations, by store, zone and operation.",
		[]float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1}, "store", "zone", "op")
)

// Collectors returns the metrics, for registering.
func Collectors() []prometheus.Collector { return []prometheus.Collector{errorsTotal, seconds} }

// Observe records one shared store operation (acquire, release, renew) for
// one zone (its name, as in the other metrics): its latency, and whether it
// failed.
func Observe(store, zone, op string, took time.Duration, failed bool) {
	seconds.WithLabelValues(store, zone, op).Observe(took.Seconds())
	if failed {
		errorsTotal.WithLabelValues(store, zone, op).Inc()
	}
}
