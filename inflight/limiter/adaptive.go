package limiter

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Adaptive is a zone-wide total that finds a backend's capacity from the
// latency of the requests it admits: the time to first byte (response
// headers) of each, compared with a baseline, the latency of the backend
// without a queue.
//
// The controller works in windows. A window gathers the samples of requests
// admitted after it began (so every sample saw the current limit) until
// Window has passed and it holds fullWindowSamples of them; a window that
// has not filled by longWindows × Window closes as soon as it holds
// minWindowSamples (a slow backend answers few requests per window, and
// the limit must still move). Then:
//
//   - The window's sample is the median of its samples (the mean of the
//     middle two for an even count: the upper one biased few-sample
//     windows towards a queue): one slow outlier or one lucky fast request
//     does not move it.
//   - The baseline is the lowest window sample of the last baselineWindows
//     windows: a median, never a single request, and it follows a backend
//     that got slower once the windows that saw it faster have aged out.
//   - If some responses were overload statuses (Overload: by default 429,
//     502, 503, 504, which is also how a proxy reports a timeout or a
//     connection error), the limit shrinks in proportion, whatever the
//     latency said. Other 5xx are an application's errors: they say nothing
//     of the backend's capacity, and a fast error would drag the latency
//     down, so they are ignored.
//   - If the sample exceeds the baseline by more than Tolerance in two
//     windows in a row, requests queue in the backend (one such window may
//     be a burst of a load the backend carries): by Little's law the backend completes
//     inflight/sample requests per unit of time and would serve each in
//     baseline without its queue, so it has about inflight × baseline /
//     sample workers; the limit becomes that, at most halving per window.
//   - After a window without a queue the limit grows, doubling until the first sign of a queue
//     (slow start) and by Tolerance/2 a window after that.
//
// A window in which the load used less than half the limit changes nothing
// (the app-limited guard): the limit did not shape its latency, so it says
// nothing about the limit; and the limit never grows beyond twice the most
// requests a window had in flight, headroom for the load's bursts that a
// burst cannot inflate further.
//
// Nothing pins the limit low to re-measure the baseline: the limit comes
// down to the backend's capacity after each queue it sees, and windows at
// that level show the latency without a queue.
//
// Invariants: Limit is within [Min, Max] at all times; every field below mu
// is read and written with mu held; limit, baseline and sample are written
// with mu held and read without it.
type Adaptive struct {
	limit    atomic.Int64
	baseline atomic.Int64 // nanoseconds; 0 until the first window
	sample   atomic.Int64 // nanoseconds, the last window's median

	mu        sync.Mutex
	cfg       AdaptiveConfig
	estimate  float64 // the limit, unrounded
	slowStart bool
	queued    bool // the last window's sample was over the tolerance
	window    window
	history   [baselineWindows]time.Duration // window samples, a ring
	next      int                            // where the next window sample goes in history
}

// AdaptiveConfig are an adaptive limit's bounds and reflexes.
type AdaptiveConfig struct {
	Min, Max, Initial int64
	// Tolerance is how much slower than the baseline a window may be
	// before the limit shrinks, as a fraction (0.2: 20 %).
	Tolerance float64
	// Window is the shortest time between two changes of the limit.
	Window time.Duration
	// Overload are the response statuses that mean the backend is
	// overloaded. Default (nil): defaultOverload.
	Overload []int
}

// defaultOverload are the statuses that mean overload unless configured:
// an upstream's 429, and 502, 503 and 504, with which a proxy also reports
// a connection error, no upstream available and a timeout.
var defaultOverload = []int{429, 502, 503, 504}

const (
	// fullWindowSamples is how many samples a window waits for, Window
	// passed, before its median is trusted.
	fullWindowSamples = 32
	// longWindows × Window is how long a window waits to fill before it
	// makes do with minWindowSamples.
	longWindows = 4
	// minWindowSamples is the fewest samples a window closes with.
	minWindowSamples = 4
	// maxWindowSamples bounds the samples a window keeps; it keeps the
	// newest.
	maxWindowSamples = 64
	// baselineWindows is how many windows the baseline remembers.
	baselineWindows = 32
	// baselineRank picks the baseline among the remembered window samples,
	// lowest first: not the lowest, which is low by chance as often as not.
	baselineRank = 2
)

// window gathers one window's observations.
type window struct {
	start       time.Time
	samples     [maxWindowSamples]time.Duration
	n           int   // samples seen, some overwritten beyond maxWindowSamples
	drops       int   // responses with an overload status
	peak        int64 // most requests in flight seen
	inflightSum int64 // over the samples, for their mean
}

// NewAdaptive returns a controller starting at cfg.Initial, in slow start.
func NewAdaptive(cfg AdaptiveConfig, now time.Time) *Adaptive {
	a := &Adaptive{slowStart: true}
	a.window.start = now
	a.Configure(cfg)
	a.mu.Lock()
	a.estimate = float64(cfg.Initial)
	a.publish()
	a.mu.Unlock()
	return a
}

// Configure applies new bounds (a reload), keeping what was learned.
func (a *Adaptive) Configure(cfg AdaptiveConfig) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if cfg.Overload == nil {
		cfg.Overload = defaultOverload
	}
	a.cfg = cfg
	a.publish()
}

// Limit returns the current limit.
func (a *Adaptive) Limit() int64 { return a.limit.Load() }

// Baseline returns the latency the backend shows without a queue, as
// learned so far (0 before the first window).
func (a *Adaptive) Baseline() time.Duration { return time.Duration(a.baseline.Load()) }

// Sample returns the last window's median latency (0 before the first).
func (a *Adaptive) Sample() time.Duration { return time.Duration(a.sample.Load()) }

// Observe records the response to a request admitted at admitted: its
// headers, with status, came at now, while inflight requests (this one
// included) were in flight. An overload status is a failure, another 5xx
// is ignored, any other status is a latency sample. It reports whether
// the limit went up, which may admit waiters.
func (a *Adaptive) Observe(now, admitted time.Time, status int, inflight int64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := &a.window
	w.peak = max(w.peak, inflight)
	switch {
	case slices.Contains(a.cfg.Overload, status):
		w.drops++
	case status >= 500 || admitted.Before(w.start):
		return false // an application's error, or it saw an older limit
	default:
		w.samples[w.n%maxWindowSamples] = now.Sub(admitted)
		w.n++
		w.inflightSum += inflight
	}
	return a.maybeClose(now)
}

// Fail records a request that failed at now before any response header,
// with the status it is answered with (a proxy's 502 for a connection
// error, 504 for a timeout): a failure if that is an overload status,
// nothing otherwise. A failure cannot raise the limit.
func (a *Adaptive) Fail(now time.Time, status int, inflight int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !slices.Contains(a.cfg.Overload, status) {
		return
	}
	a.window.peak = max(a.window.peak, inflight)
	a.window.drops++
	a.maybeClose(now)
}

// maybeClose ends the window if it is long and full enough, and adjusts
// the limit.
func (a *Adaptive) maybeClose(now time.Time) bool {
	w := &a.window
	n, age := w.n+w.drops, now.Sub(w.start)
	if age < a.cfg.Window || n < minWindowSamples || n < fullWindowSamples && age < longWindows*a.cfg.Window {
		return false
	}
	before := a.limit.Load()
	switch {
	case w.drops > 0:
		failed := float64(w.drops) / float64(w.n+w.drops)
		a.estimate *= max(0.5, 1-failed)
		a.slowStart = false
	default:
		a.adjust(w)
	}
	a.publish()
	*w = window{start: now}
	return a.limit.Load() > before
}

// adjust moves the estimate from a window without failures.
func (a *Adaptive) adjust(w *window) {
	n := min(w.n, maxWindowSamples)
	sorted := w.samples[:n]
	slices.Sort(sorted)
	median := (sorted[(n-1)/2] + sorted[n/2]) / 2
	a.sample.Store(int64(median))
	a.history[a.next] = median
	a.next = (a.next + 1) % baselineWindows
	baseline := a.lowHistory()
	a.baseline.Store(int64(baseline))

	if 2*float64(w.peak) < a.estimate {
		return // app-limited: the limit is not what shapes the latency
	}
	queued, wasQueued := float64(median) > float64(baseline)*(1+a.cfg.Tolerance), a.queued
	a.queued = queued
	switch {
	case queued && wasQueued:
		meanInflight := float64(w.inflightSum) / float64(w.n)
		workers := meanInflight * float64(baseline) / float64(median)
		a.estimate = max(a.estimate/2, min(a.estimate, workers))
		a.slowStart = false
		return
	case queued:
		return // perhaps a burst the backend carries: see the next window
	}
	grown := a.estimate + max(1, a.estimate*a.cfg.Tolerance/2)
	if a.slowStart {
		grown = a.estimate * 2
	}
	// Never beyond twice what the load used: headroom for its bursts.
	a.estimate = max(a.estimate, min(grown, 2*float64(w.peak)))
}

// lowHistory returns a low window sample from history: the lowest of the
// first windows, then, with baselineWindows of them, the baselineRank-th
// lowest.
func (a *Adaptive) lowHistory() time.Duration {
	var sorted [baselineWindows]time.Duration
	n := 0
	for _, m := range a.history {
		if m > 0 {
			sorted[n] = m
			n++
		}
	}
	slices.Sort(sorted[:n])
	return sorted[baselineRank*n/baselineWindows]
}

// publish clamps the estimate to the bounds and makes it the limit.
func (a *Adaptive) publish() {
	a.estimate = min(max(a.estimate, float64(a.cfg.Min)), float64(a.cfg.Max))
	a.limit.Store(int64(math.Round(a.estimate)))
}
