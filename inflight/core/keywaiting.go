package core

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

var keyWaitingDesc = prometheus.NewDesc("caddy_inflight_key_waiting",
	"Requests waiting now per key (hashed unless plain_keys), for handlers with per_key_metrics; at most 1000 keys per zone, the rest under key _overflow.",
	[]string{"zone", "limit", "key"}, nil)

// How a zone's keys are shown, as its handlers' per_key_metrics and
// plain_keys say (the latest provisioned handler's).
const (
	keysAnonymous int32 = iota // #-prefixed keyed hashes, as the admin API shows keys without per_key_metrics
	keysHashed                 // short SHA-256 hashes, as in logs and events
	keysPlain                  // raw
)

func (g *Gate) keyDisplay() int32 {
	switch {
	case !g.cfg.PerKeyMetrics:
		return keysAnonymous
	case g.cfg.PlainKeys:
		return keysPlain
	}
	return keysHashed
}

// keyWaiting is a key with requests waiting, as metrics and the admin API
// show it.
type keyWaiting struct {
	Limit   string `json:"limit"`
	Key     string `json:"key"`
	Waiting int64  `json:"waiting"`
	// Wait sums up the key's waits that ended in the last one to two
	// minutes, with per_key_metrics; absent if none did.
	Wait *WaitState `json:"wait,omitempty"`
	// Share is the key's share of the unit-seconds (slot-seconds with
	// cost 1) its limit's requests that ended in the last one to two
	// minutes held, with per_key_metrics; absent if none ended. Weight is
	// its weight under fair, in the fair limit.
	Share  *float64 `json:"share,omitempty"`
	Weight float64  `json:"weight,omitempty"`
}

// waitingKeys returns the zone's keys with requests waiting in every
// limit, as st read them (limiter.Look.WaitingKeys), most waiting first;
// beyond maxKeySeries keys, the rest are summed under overflowKey per
// limit.
func (z *zone) waitingKeys(st limiter.State) []keyWaiting {
	display := z.keyDisplay.Load()
	var out []keyWaiting
	for d, name := range z.limits {
		for _, kw := range st.Dims[d].Waiting {
			label := fmt.Sprintf("#%016x", kw.Hash)
			switch display {
			case keysHashed:
				label = redact(kw.Key)
			case keysPlain:
				label = LabelValue(kw.Key)
			}
			out = append(out, keyWaiting{Limit: name, Key: label, Waiting: kw.Waiting})
		}
	}
	slices.SortFunc(out, func(a, b keyWaiting) int { return cmp.Compare(b.Waiting, a.Waiting) })
	if len(out) <= maxKeySeries {
		return out
	}
	overflow := map[string]int64{}
	for _, kw := range out[maxKeySeries:] {
		overflow[kw.Limit] += kw.Waiting
	}
	out = out[:maxKeySeries]
	for _, name := range z.limits {
		if n := overflow[name]; n > 0 {
			out = append(out, keyWaiting{Limit: name, Key: overflowKey, Waiting: n})
		}
	}
	return out
}

// sweepKeyWaits removes the wait series of the zone's keys that have been
// idle for keyWaitIdle (see keySeries.sweep); keys are its keys waiting
// now.
func (z *zone) sweepKeyWaits(now time.Time, keys []keyWaiting) {
	waiting := map[seriesKey]bool{}
	if z.keyDisplay.Load() != keysAnonymous {
		for _, kw := range keys {
			waiting[seriesKey{kw.Limit, kw.Key}] = true
		}
	}
	z.series.sweep(z.label, now, waiting)
}

// addKeyWaiting adds z's keys waiting (keys) to sum, by zone label, limit
// and key, if its handlers asked for per-key metrics. Zones without a
// name can share a label, so the gauges are summed before they are sent.
func addKeyWaiting(sum map[[3]string]int64, z *zone, keys []keyWaiting) {
	if z.keyDisplay.Load() == keysAnonymous {
		return
	}
	for _, kw := range keys {
		sum[[3]string{z.label, kw.Limit, kw.Key}] += kw.Waiting
	}
}

func sendKeyWaiting(ch chan<- prometheus.Metric, sum map[[3]string]int64) {
	for l, n := range sum {
		ch <- prometheus.MustNewConstMetric(keyWaitingDesc, prometheus.GaugeValue, float64(n), l[0], l[1], l[2])
	}
}
