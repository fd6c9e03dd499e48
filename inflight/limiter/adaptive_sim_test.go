//go:build !race

// The simulations are single-goroutine arithmetic, which the race detector
// has nothing to check in and slows some 30 times: CI runs them without it
// (.ci/run).

package limiter

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"time"
)

// A simulated backend and load, on a simulated clock: c workers serving a
// FIFO queue, service times S ± 20 %, Poisson arrivals and closed-loop
// clients, seeded. Poisson requests over the controller's limit are refused
// at once (no wait) unless the scenario gives them a queue, so refusals
// show where a limit is too low; clients always wait for a slot.
// Everything is deterministic.

// controller is what the simulation drives: ours, or a reference.
type controller interface {
	limit() int64
	// observe reports a response with status: admitted and answered at
	// now, with inflight requests in flight (this one included).
	observe(now, admitted time.Time, status int, inflight int64)
}

// scenario describes one run.
type scenario struct {
	workers  int           // c
	service  time.Duration // S
	load     float64       // arrival rate as a multiple of c/S
	duration time.Duration
	// at change, the backend gets changeTo workers (0: no change)
	change   time.Duration
	changeTo int
	// from starts the measured part; 0: half way, or at the change
	from time.Duration
	// waiting bounds the requests queued in front of the limit (wait);
	// 0 refuses at once.
	waiting int
	// clients are closed-loop clients: each sends its next request as its
	// previous one is answered, and waits for a slot.
	clients int
	// errorClients are closed-loop clients of a path on which the backend
	// answers errorStatus after errorService.
	errorClients int
	errorService time.Duration
	errorStatus  int
	// from failFrom to failTo, a share failShare of the responses are
	// failStatus (answered after their service time).
	failFrom, failTo time.Duration
	failShare        float64
	failStatus       int
	// reach is a limit to time: outcome.reached
	reach int64
	seed  uint64
}

// outcome is what a run measured, over its second half (or, with a change,
// after the change).
type outcome struct {
	settled     float64       // median limit
	queueing    time.Duration // median time admitted requests waited inside the backend
	throughput  float64       // completions per second / (c/S)
	refused     int           // requests refused, whole run
	refusedLate int           // requests refused in the measured part
	reaction    time.Duration // after the change, until the limit fit the new capacity; -1: never
	maxLimit    int64         // highest limit in the measured part
	peakUse     int64         // most requests in flight in the measured part
	reached     time.Duration // from the start until the limit was at least reach; -1: never
	recovered   time.Duration // from failTo until the limit was back at its level at failFrom; -1: never
	minLimit    int64         // lowest limit in the measured part
}

type simRequest struct {
	admitted, started, done time.Time
	client                  int // closed-loop client, -1: a Poisson arrival
	status                  int
}

type completions []*simRequest

func (h completions) Len() int           { return len(h) }
func (h completions) Less(i, j int) bool { return h[i].done.Before(h[j].done) }
func (h completions) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *completions) Push(x any)        { *h = append(*h, x.(*simRequest)) }
func (h *completions) Pop() any {
	old := *h
	r := old[len(old)-1]
	*h = old[:len(old)-1]
	return r
}

// simulate runs sc with ctl and measures it.
func simulate(sc scenario, ctl controller) outcome {
	rng := rand.New(rand.NewPCG(sc.seed, 1))
	workers := sc.workers
	rate := sc.load * float64(sc.workers) / sc.service.Seconds()
	end := epoch.Add(sc.duration)
	from := epoch.Add(sc.duration / 2) // start of the measured part
	switch {
	case sc.from > 0:
		from = epoch.Add(sc.from)
	case sc.changeTo > 0:
		from = epoch.Add(sc.change)
	}
	var (
		running  completions
		queue    []*simRequest
		waiting  []*simRequest // in front of the limit
		inflight int64
		out      = outcome{reaction: -1, reached: -1, recovered: -1, minLimit: math.MaxInt64}
		before   int64 // the limit at failFrom
		limits   []float64
		waits    []time.Duration
		done     int
	)
	serviceTime := func() time.Duration {
		return time.Duration(float64(sc.service) * (0.8 + 0.4*rng.Float64()))
	}
	failFrom, failTo := epoch.Add(sc.failFrom), epoch.Add(sc.failTo)
	admit := func(now time.Time, r *simRequest) {
		inflight++
		if !now.Before(from) {
			out.peakUse = max(out.peakUse, inflight)
		}
		r.admitted = now
		queue = append(queue, r)
	}
	startWork := func(now time.Time) {
		for len(waiting) > 0 && inflight < ctl.limit() {
			admit(now, waiting[0])
			waiting = waiting[1:]
		}
		for len(running) < workers && len(queue) > 0 {
			r := queue[0]
			queue = queue[1:]
			r.started = now
			switch {
			case r.client >= sc.clients:
				r.done, r.status = now.Add(sc.errorService), sc.errorStatus
			default:
				r.done, r.status = now.Add(serviceTime()), http.StatusOK
				if !now.Before(failFrom) && now.Before(failTo) && rng.Float64() < sc.failShare {
					r.status = sc.failStatus
				}
			}
			heap.Push(&running, r)
		}
	}
	// arrive admits a request, queues it in front of the limit, or refuses it.
	arrive := func(now time.Time, r *simRequest) {
		switch {
		case inflight < ctl.limit():
			admit(now, r)
		case r.client >= 0 || len(waiting) < sc.waiting:
			waiting = append(waiting, r)
		default:
			out.refused++
			if !now.Before(from) {
				out.refusedLate++
			}
		}
		startWork(now)
	}
	for i := range sc.clients + sc.errorClients {
		arrive(epoch, &simRequest{client: i})
	}
	// arrival returns the time of the Poisson arrival after now's.
	arrival := func(now time.Time) time.Time {
		if rate == 0 {
			return end.Add(time.Second) // clients only
		}
		return now.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
	}
	nextArrival := arrival(epoch)
	nextTick := epoch
	for {
		now := nextArrival
		if len(running) > 0 && running[0].done.Before(now) {
			now = running[0].done
		}
		if nextTick.Before(now) {
			now = nextTick
		}
		if now.After(end) {
			break
		}
		switch {
		case now.Equal(nextTick):
			nextTick = now.Add(100 * time.Millisecond)
			if sc.changeTo > 0 && now.Equal(epoch.Add(sc.change)) {
				workers = sc.changeTo
			}
			startWork(now)
			l := ctl.limit()
			if out.reached < 0 && sc.reach > 0 && l >= sc.reach {
				out.reached = now.Sub(epoch)
			}
			switch {
			case now.Equal(failFrom):
				before = l
			case sc.failTo > 0 && now.After(failTo) && out.recovered < 0 && l >= before:
				out.recovered = now.Sub(failTo)
			}
			if !now.Before(from) {
				out.minLimit = min(out.minLimit, l)
				limits = append(limits, float64(l))
				out.maxLimit = max(out.maxLimit, l)
				if out.reaction < 0 && sc.changeTo > 0 && fits(l, sc.workers, sc.changeTo) {
					out.reaction = now.Sub(from)
				}
			}
		case len(running) > 0 && now.Equal(running[0].done):
			r := heap.Pop(&running).(*simRequest)
			ctl.observe(now, r.admitted, r.status, inflight)
			inflight--
			if r.client >= sc.clients {
				arrive(now, &simRequest{client: r.client})
				continue // not a request of the measured load
			}
			if !r.admitted.Before(from) {
				waits = append(waits, r.started.Sub(r.admitted))
			}
			if !now.Before(from) {
				done++
			}
			if r.client >= 0 {
				arrive(now, &simRequest{client: r.client})
			}
			startWork(now)
		default:
			nextArrival = arrival(now)
			arrive(now, &simRequest{client: -1})
		}
	}
	out.settled = median(limits)
	if len(waits) > 0 {
		slices.Sort(waits)
		out.queueing = waits[len(waits)/2]
	}
	capacity := float64(workers) / sc.service.Seconds()
	out.throughput = float64(done) / end.Sub(from).Seconds() / capacity
	return out
}

// fits reports whether a limit has reacted to a capacity change from c to
// c2: down to at most 1.5 × c2 after a drop, up to at least c2 after a rise.
func fits(limit int64, c, c2 int) bool {
	if c2 < c {
		return float64(limit) <= 1.5*float64(c2)
	}
	return limit >= int64(c2)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// ours drives the controller under test.
type ours struct{ a *Adaptive }

func newOurs(initial int64) *ours {
	return &ours{NewAdaptive(AdaptiveConfig{Min: 1, Max: 1000, Initial: initial, Tolerance: defaultTestTolerance, Window: defaultTestWindow}, epoch)}
}

func (o *ours) limit() int64 { return o.a.Limit() }
func (o *ours) observe(now, admitted time.Time, status int, inflight int64) {
	o.a.Observe(now, admitted, status, inflight)
}

// fixed is a total set by hand.
type fixed int64

func (f fixed) limit() int64                         { return int64(f) }
func (fixed) observe(_, _ time.Time, _ int, _ int64) {}

// envoyGradient is Envoy's gradient controller as documented, with its
// defaults: every 100 ms, gradient = clamp((minRTT × 1.25) / sampleRTT,
// 0.5, 2) over the window's p50, limit = gradient × limit + √(gradient ×
// limit); minRTT is re-measured every 60 s by pinning the limit to 3 for
// 50 requests (and at start).
type envoyGradient struct {
	lim        float64
	minRTT     time.Duration
	measuring  bool
	rttSamples []time.Duration
	window     []time.Duration
	windowEnd  time.Time
	nextMinRTT time.Time
}

func newEnvoy() *envoyGradient {
	return &envoyGradient{lim: 3, measuring: true, windowEnd: epoch.Add(100 * time.Millisecond)}
}

func (e *envoyGradient) limit() int64 {
	if e.measuring {
		return 3
	}
	return int64(e.lim)
}

func (e *envoyGradient) observe(now, admitted time.Time, _ int, _ int64) {
	rtt := now.Sub(admitted)
	if e.measuring {
		e.rttSamples = append(e.rttSamples, rtt)
		if len(e.rttSamples) >= 50 {
			e.minRTT = percentile(e.rttSamples, 0.5)
			e.rttSamples = e.rttSamples[:0]
			e.measuring = false
			e.nextMinRTT = now.Add(60 * time.Second)
			e.window = e.window[:0]
			e.windowEnd = now.Add(100 * time.Millisecond)
		}
		return
	}
	if !now.Before(e.nextMinRTT) {
		e.measuring = true
		return
	}
	e.window = append(e.window, rtt)
	if now.Before(e.windowEnd) {
		return
	}
	sample := percentile(e.window, 0.5)
	e.window = e.window[:0]
	e.windowEnd = now.Add(100 * time.Millisecond)
	gradient := min(2, max(0.5, float64(e.minRTT)*1.25/float64(sample)))
	l := gradient * e.lim
	e.lim = min(1000, max(3, l+math.Sqrt(l)))
}

func percentile(xs []time.Duration, p float64) time.Duration {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p)]
}

// gradient2 is Netflix's Gradient2Limit with its defaults (initial 20,
// queue size 4, smoothing 0.2, long window 600) except minLimit 1 (its
// default 20 would hide the controller on small backends), updated per
// response.
type gradient2 struct {
	lim     float64
	longRTT float64 // exponential average; plain mean over the first 10 samples
	count   int
}

func newGradient2() *gradient2 { return &gradient2{lim: 20} }

func (g *gradient2) limit() int64 { return int64(g.lim) }

func (g *gradient2) observe(now, admitted time.Time, _ int, inflight int64) {
	rtt := float64(now.Sub(admitted))
	g.count++
	if g.count <= 10 {
		g.longRTT = (g.longRTT*float64(g.count-1) + rtt) / float64(g.count)
	} else {
		f := 2.0 / (600 + 1)
		g.longRTT = g.longRTT*(1-f) + rtt*f
	}
	if g.longRTT/rtt > 2 {
		g.longRTT *= 0.9
	}
	if float64(inflight) < g.lim/2 {
		return
	}
	gradient := max(0.5, min(1, g.longRTT/rtt))
	next := g.lim*gradient + 4
	next = g.lim*0.8 + next*0.2
	g.lim = max(1, min(1000, next))
}

// vegas is Netflix's VegasLimit with its defaults (initial 20, smoothing 1,
// alpha 3·log10, beta 6·log10, threshold log10, probe multiplier 30),
// updated per response; its probe jitter is drawn from a seeded source.
type vegas struct {
	lim        float64
	noLoad     time.Duration
	probeCount int
	jitter     float64
	rng        *rand.Rand
}

func newVegas(seed uint64) *vegas {
	v := &vegas{lim: 20, rng: rand.New(rand.NewPCG(seed, 2))}
	v.jitter = 0.5 + 0.5*v.rng.Float64()
	return v
}

func (v *vegas) limit() int64 { return int64(v.lim) }

func log10int(n float64) float64 { return max(1, math.Floor(math.Log10(n))) }

func (v *vegas) observe(now, admitted time.Time, _ int, inflight int64) {
	rtt := now.Sub(admitted)
	v.probeCount++
	if v.jitter*30*v.lim <= float64(v.probeCount) {
		v.jitter = 0.5 + 0.5*v.rng.Float64()
		v.probeCount = 0
		v.noLoad = rtt
		return
	}
	if v.noLoad == 0 || rtt < v.noLoad {
		v.noLoad = rtt
		return
	}
	queue := math.Ceil(v.lim * (1 - float64(v.noLoad)/float64(rtt)))
	if float64(inflight)*2 < v.lim {
		return
	}
	l := log10int(v.lim)
	switch {
	case queue <= l:
		v.lim += 6 * l
	case queue < 3*l:
		v.lim += math.Log10(v.lim)
	case queue > 6*l:
		v.lim -= math.Log10(v.lim)
	default:
		return
	}
	v.lim = max(1, min(1000, v.lim))
}
