package core

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-inflight/caddy-inflight/inflight/storestatus"
)

// zoneView is what the latest handler provisioned for a zone says about
// it, for the admin API: its caps and its store.
type zoneView struct {
	max   []int64 // per limit as configured; 0: each request's own (a placeholder)
	total int64   // fixed total cap; 0: none, or adaptive
	// adaptive is set when the adaptive limit caps the total (not dry_run).
	adaptive bool
	store    Store
}

func (g *Gate) view() *zoneView {
	return &zoneView{max: g.limits.Max, total: g.limits.Total, adaptive: g.limits.Adaptive != nil, store: g.store}
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
// the buckets of the wait histogram as Prometheus' histogram_quantile does.
type WaitState struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
}

// zoneStats counts a zone's refusals by reason, since the zone was made,
// and the durations of its recent waits, for the admin API. The handler's
// metrics feed it (see teeCounter, teeObserver), so the request path gains
// no call of its own.
type zoneStats struct {
	refused [len(reasons)]atomic.Int64
	waits   waitWindow
}

// reasons are the refusal reasons, in the order zoneStats counts them.
var reasons = [...]string{reasonFull, reasonTimeout, reasonQueueFull, reasonKeysFull, reasonStore, ReasonDryRun}

// refusedByReason returns the nonzero refusal counts by reason.
func (s *zoneStats) refusedByReason() map[string]int64 {
	out := map[string]int64{}
	for i, r := range reasons {
		if n := s.refused[i].Load(); n > 0 {
			out[r] = n
		}
	}
	return out
}

// waitWindow is a histogram of wait durations over a window that moves on
// every minute: the current minute and the one before.
type waitWindow struct {
	mu        sync.Mutex
	cur, prev [len(waitBuckets) + 1]int64 // the last counts waits beyond the buckets
	started   time.Time                   // of cur
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
	w.cur[i]++
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
		w.prev = [len(waitBuckets) + 1]int64{}
	}
	w.cur = [len(waitBuckets) + 1]int64{}
	w.started = now
}

func (w *waitWindow) state(now time.Time) WaitState {
	var counts [len(waitBuckets) + 1]int64
	w.mu.Lock()
	w.roll(now)
	for i := range counts {
		counts[i] = w.cur[i] + w.prev[i]
	}
	w.mu.Unlock()
	var st WaitState
	for _, n := range counts {
		st.Count += n
	}
	st.P50, st.P90, st.P99 = quantile(0.5, counts[:], st.Count), quantile(0.9, counts[:], st.Count), quantile(0.99, counts[:], st.Count)
	return st
}

// quantile estimates the q-quantile of a histogram by linear interpolation
// within the bucket it falls in; beyond the last bound it is that bound.
func quantile(q float64, counts []int64, total int64) float64 {
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	var seen float64
	for i, n := range counts {
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
		v := lower + (waitBuckets[i]-lower)*(rank-seen)/float64(n)
		return math.Round(v*1e6) / 1e6
	}
	return waitBuckets[len(waitBuckets)-1]
}

// teeCounter is a refusal counter that also counts in its zone's stats.
type teeCounter struct {
	prometheus.Counter
	n *atomic.Int64
}

func (c teeCounter) Inc() {
	c.Counter.Inc()
	c.n.Add(1)
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
	st.Refused = z.stats.refusedByReason()
	st.Wait = z.stats.waits.state(time.Now())
	a := z.adaptive.current()
	if a != nil {
		st.Adaptive = &AdaptiveState{Limit: a.Limit(), BaselineSeconds: a.Baseline().Seconds(), SampleSeconds: a.Sample().Seconds()}
	}
	v := z.view.Load()
	if v == nil {
		return
	}
	for i := range st.Limits {
		if i < len(v.max) {
			st.Limits[i].Max = v.max[i]
		}
	}
	switch {
	case v.adaptive && a != nil:
		st.TotalMax = ptr(a.Limit())
	case v.total > 0 && z.HasTotal():
		st.TotalMax = ptr(v.total)
	}
	if hr, ok := v.store.(storestatus.Reporter); ok {
		h := hr.Health()
		st.Store = &h
	}
}

func ptr[T any](v T) *T { return &v }

// Interface guards
var (
	_ prometheus.Counter  = teeCounter{}
	_ prometheus.Observer = teeObserver{}
)
