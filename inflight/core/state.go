package core

import (
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/caddy-inflight/caddy-inflight/inflight/storestatus"
)

// zoneView is what the latest handler provisioned for a zone says about
// it, for the admin API: its caps.
type zoneView struct {
	max   []int64 // per limit as configured; 0: each request's own (a placeholder)
	total int64   // fixed total cap; 0: none, or adaptive
	// adaptive is set when the adaptive limit caps the total (not dry_run).
	adaptive bool
	// costs is set when units hold their cost: units are not requests.
	costs bool
}

func (g *Gate) view() *zoneView {
	return &zoneView{max: g.limits.Max, total: g.limits.Total, adaptive: g.limits.Adaptive != nil, costs: g.costed}
}

// StoreHealth is a shared store's state, as the admin API shows it.
type StoreHealth = storestatus.Health

// AdaptiveState is the adaptive total's state in the admin API.
type AdaptiveState struct {
	Limit           int64   `json:"limit"`
	BaselineSeconds float64 `json:"baseline_seconds"`
	SampleSeconds   float64 `json:"sample_seconds"`
}

// WaitState sums up the waits that ended recently (in the last one to two
// minutes): how many, and their percentiles in seconds, interpolated within
// the buckets of the wait histogram as Prometheus' histogram_quantile does,
// but only up to the longest wait each bucket saw: a percentile never
// exceeds the longest wait.
type WaitState struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
}

// zoneStats is what the admin API shows of a zone's past that its metrics
// do not: the refusals counted under its name before it was made, which
// its own count starts from, and the durations of its recent waits. The
// handler's wait histogram feeds it (see teeObserver); a refusal counts in
// its metric only.
type zoneStats struct {
	began         sync.Once
	refusedBefore [len(reasons)]float64
	waits         waitWindow
}

// reasons are the refusal reasons, in the order zoneStats counts them.
var reasons = [...]string{reasonFull, reasonTimeout, reasonQueueFull, reasonKeysFull, reasonStore, ReasonDryRun}

// startStats notes, once, the refusals counted under the zone's name and
// limits so far: by a zone of the same name made before this one.
func (z *zone) startStats() {
	z.stats.began.Do(func() { z.stats.refusedBefore = z.refusedSoFar() })
}

// refusedSoFar reads caddy_inflight_rejected_total of the zone's name by
// reason, summed over its limits and the total.
func (z *zone) refusedSoFar() (n [len(reasons)]float64) {
	for i, r := range reasons {
		n[i] = counterValue(rejectedTotal.WithLabelValues(z.label, totalName, r))
		for _, l := range z.limits {
			n[i] += counterValue(rejectedTotal.WithLabelValues(z.label, l, r))
		}
	}
	return n
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	c.Write(&m)
	return m.GetCounter().GetValue()
}

// refusedByReason returns the zone's nonzero refusal counts by reason,
// since it was made.
func (z *zone) refusedByReason() map[string]int64 {
	z.startStats()
	now := z.refusedSoFar()
	out := map[string]int64{}
	for i, r := range reasons {
		if n := int64(now[i] - z.stats.refusedBefore[i]); n > 0 {
			out[r] = n
		}
	}
	return out
}

// waitWindow is a histogram of wait durations over a window that moves on
// every minute: the current minute and the one before.
type waitWindow struct {
	mu        sync.Mutex
	cur, prev waitCounts
	started   time.Time // of cur
}

// waitCounts counts waits in the buckets of waitBuckets, the last beyond
// them, and keeps each bucket's longest wait.
type waitCounts struct {
	n       [len(waitBuckets) + 1]int64
	longest [len(waitBuckets) + 1]float64
}

// waitBuckets are the wait histogram's upper bounds, in seconds.
var waitBuckets = [...]float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

const waitWindowStep = time.Minute

func (w *waitWindow) observe(now time.Time, seconds float64) {
	i := len(waitBuckets)
	for j, le := range waitBuckets {
		if seconds <= le {
			i = j
			break
		}
	}
	w.mu.Lock()
	w.roll(now)
	w.cur.n[i]++
	w.cur.longest[i] = max(w.cur.longest[i], seconds)
	w.mu.Unlock()
}

// roll moves the window on to now. mu must be held.
func (w *waitWindow) roll(now time.Time) {
	switch elapsed := now.Sub(w.started); {
	case elapsed < waitWindowStep:
		return
	case elapsed < 2*waitWindowStep:
		w.prev = w.cur
	default:
		w.prev = waitCounts{}
	}
	w.cur = waitCounts{}
	w.started = now
}

func (w *waitWindow) state(now time.Time) WaitState {
	var c waitCounts
	w.mu.Lock()
	w.roll(now)
	for i := range c.n {
		c.n[i] = w.cur.n[i] + w.prev.n[i]
		c.longest[i] = max(w.cur.longest[i], w.prev.longest[i])
	}
	w.mu.Unlock()
	var st WaitState
	for _, n := range c.n {
		st.Count += n
	}
	st.P50, st.P90, st.P99 = c.quantile(0.5, st.Count), c.quantile(0.9, st.Count), c.quantile(0.99, st.Count)
	return st
}

// quantile estimates the q-quantile of c's total waits by linear
// interpolation within the bucket it falls in, from the bucket's lower
// bound up to its longest wait; beyond the last bound it is that bound.
func (c *waitCounts) quantile(q float64, total int64) float64 {
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	var seen float64
	for i, n := range c.n {
		if n == 0 || seen+float64(n) < rank {
			seen += float64(n)
			continue
		}
		if i == len(waitBuckets) {
			return waitBuckets[i-1]
		}
		lower := 0.0
		if i > 0 {
			lower = waitBuckets[i-1]
		}
		v := lower + (c.longest[i]-lower)*(rank-seen)/float64(n)
		return math.Round(v*1e6) / 1e6
	}
	return waitBuckets[len(waitBuckets)-1]
}

// teeObserver is a wait histogram that also records in its zone's stats.
type teeObserver struct {
	prometheus.Observer
	w *waitWindow
}

func (o teeObserver) Observe(seconds float64) {
	o.Observer.Observe(seconds)
	o.w.observe(time.Now(), seconds)
}

// extendState adds to st what the live page shows besides the counts.
func extendState(st *ZoneState, z *zone) {
	st.Refused = z.refusedByReason()
	st.Wait = z.stats.waits.state(time.Now())
	a := z.adaptive.current()
	if a != nil {
		st.Adaptive = &AdaptiveState{Limit: a.Limit(), BaselineSeconds: a.Baseline().Seconds(), SampleSeconds: a.Sample().Seconds()}
	}
	v := z.view.Load()
	if v == nil {
		return
	}
	if v.costs {
		st.Cost = ptr(z.units.state())
		if x := z.extension.get(); x != nil {
			st.Usage = x.State()
		}
	}
	for i := range st.Limits {
		if i < len(v.max) {
			st.Limits[i].Max = v.max[i]
		}
	}
	switch {
	case v.adaptive && a != nil:
		st.TotalMax = ptr(a.Limit())
	case v.total > 0 && st.Total != nil:
		st.TotalMax = ptr(v.total)
	}
	if hr, ok := z.currentLedger().(storestatus.Reporter); ok {
		h := hr.Health()
		st.Store = &h
	}
}

func ptr[T any](v T) *T { return &v }

// Interface guard
var _ prometheus.Observer = teeObserver{}
