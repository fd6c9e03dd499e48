package limiter

import (
	"context"
	"fmt"
	"testing"
	"time"
)

const service = 50 * time.Millisecond

func TestAdaptiveSettlesUnderOverload(t *testing.T) {
	for _, c := range []int{4, 16, 64} {
		for _, load := range []float64{4, 6} {
			for _, waiting := range []int{0, 1000} {
				for _, seed := range []uint64{uint64(c)} {
					sc := scenario{workers: c, service: service, load: load, duration: 60 * time.Second, waiting: waiting, seed: seed}
					o := simulate(sc, newOurs(4))
					name := fmt.Sprintf("c=%d load=%gx waiting=%d seed=%d", c, load, waiting, seed)
					if o.settled < float64(c) || o.settled > 1.5*float64(c) {
						t.Errorf("%s: limit settled at %g, want within [%d, %g]", name, o.settled, c, 1.5*float64(c))
					}
					if o.queueing > service/4 {
						t.Errorf("%s: backend queueing median %v, want at most %v", name, o.queueing, service/4)
					}
					// Refusing at once, a small backend idles a little
					// between a release and the next arrival, whatever
					// the limit; a fixed total of c measures the same.
					want := 0.95
					if waiting == 0 {
						want = 0.95 * simulate(sc, fixed(c)).throughput
					}
					if o.throughput < want {
						t.Errorf("%s: throughput %.3f of capacity, want at least %.3f", name, o.throughput, want)
					}
				}
			}
		}
	}
}

// Below capacity the limit refuses nothing once started, and grows no
// further than the headroom the load's bursts need (twice the most in
// flight), at 30 % load as at 50 %; at 80 % it refuses no more than a
// total set by hand to c.
func TestAdaptiveBelowCapacity(t *testing.T) {
	for _, c := range []int{4, 16, 64} {
		for _, load := range []float64{0.3, 0.5, 0.8} {
			sc := scenario{workers: c, service: service, load: load, duration: 70 * time.Second, seed: 1}
			o := simulate(sc, newOurs(4))
			name := fmt.Sprintf("c=%d load=%gx", c, load)
			if load < 0.8 && o.refusedLate > 0 {
				t.Errorf("%s: %d requests refused after the start, want none", name, o.refusedLate)
			}
			if hand := simulate(sc, fixed(c)); o.refusedLate > hand.refusedLate {
				t.Errorf("%s: %d requests refused after the start, more than total %d (%d)", name, o.refusedLate, c, hand.refusedLate)
			}
			if limit := 5 * o.peakUse / 2; o.maxLimit > limit {
				t.Errorf("%s: limit grew to %d with at most %d in flight, want at most %d", name, o.maxLimit, o.peakUse, limit)
			}
		}
	}
}

func TestAdaptiveFollowsCapacityChange(t *testing.T) {
	for _, tc := range []struct {
		c, to  int
		load   float64
		within time.Duration
	}{
		{16, 8, 5, 5 * time.Second},
		{64, 32, 5, 5 * time.Second},
		{8, 16, 10, 10 * time.Second},
		{32, 64, 10, 10 * time.Second},
	} {
		sc := scenario{workers: tc.c, service: service, load: tc.load, duration: 60 * time.Second,
			change: 30 * time.Second, changeTo: tc.to, waiting: 1000, seed: 1}
		o := simulate(sc, newOurs(4))
		if o.reaction < 0 || o.reaction > tc.within {
			t.Errorf("c %d→%d: limit fit the new capacity after %v, want within %v", tc.c, tc.to, o.reaction, tc.within)
		}
		if o.settled < float64(tc.to) || o.settled > 1.5*float64(tc.to) {
			t.Errorf("c %d→%d: limit settled at %g, want within [%d, %g]", tc.c, tc.to, o.settled, tc.to, 1.5*float64(tc.to))
		}
	}
}

// feed gives a the windows of a saturated backend with c workers and
// service time s at limit a.Limit(): every response after s × max(1,
// limit/c), starting at now; it returns the time after the last.
func feed(a *Adaptive, now time.Time, windows, c int, s time.Duration) time.Time {
	for range windows {
		l := a.Limit()
		latency := time.Duration(float64(s) * max(1, float64(l)/float64(c)))
		oneWindow(a, now, l, func(int) time.Duration { return latency })
		now = now.Add(latency + defaultTestWindow)
	}
	return now
}

// oneWindow gives a one window's responses, the i-th after latency(i),
// starting at start with inflight in flight; it reports whether the limit
// went up.
func oneWindow(a *Adaptive, start time.Time, inflight int64, latency func(i int) time.Duration) bool {
	raised := false
	for i := range minWindowSamples {
		l := latency(i)
		done := start.Add(l + time.Duration(i)*defaultTestWindow/minWindowSamples)
		raised = a.Observe(done, done.Add(-l), inflight)
	}
	return raised
}

func steady(int) time.Duration { return service }

func newTestAdaptive(initial int64) *Adaptive {
	return NewAdaptive(AdaptiveConfig{Min: 1, Max: 1000, Initial: initial, Tolerance: defaultTestTolerance, Window: defaultTestWindow}, epoch)
}

func TestAdaptiveSlowOutlierDoesNotCollapse(t *testing.T) {
	a := newTestAdaptive(4)
	now := feed(a, epoch, 40, 16, service)
	before := a.Limit()
	if before < 16 {
		t.Fatalf("limit %d before the outlier, want at least 16", before)
	}
	// One window in which one response took 20 × S.
	oneWindow(a, now, a.Limit(), func(i int) time.Duration {
		if i == 0 {
			return 20 * service
		}
		return service
	})
	if a.Limit() < before {
		t.Errorf("limit fell from %d to %d after one slow response", before, a.Limit())
	}
}

func TestAdaptiveLuckyFastSampleIsNotTheBaseline(t *testing.T) {
	a := newTestAdaptive(4)
	now := feed(a, epoch, 2, 16, service) // a short history: the lowest window sample is the baseline
	oneWindow(a, now, a.Limit(), func(i int) time.Duration {
		if i == 0 {
			return service / 10
		}
		return service
	})
	if b := a.Baseline(); b < service*9/10 {
		t.Errorf("baseline %v after one fast response, want about %v", b, service)
	}
}

func TestAdaptiveFailuresShrinkIt(t *testing.T) {
	a := newTestAdaptive(4)
	now := feed(a, epoch, 40, 16, service)
	if a.Limit() < 16 {
		t.Fatalf("limit %d, want at least 16", a.Limit())
	}
	// Every request fails (5xx, timeouts): the limit goes to its minimum
	// and stays there.
	for range 20 {
		for range minWindowSamples {
			now = now.Add(defaultTestWindow / minWindowSamples)
			a.Drop(now, a.Limit())
		}
	}
	if a.Limit() != 1 {
		t.Errorf("limit %d after every request failed, want the minimum 1", a.Limit())
	}
}

// A load that uses little of the limit neither grows it beyond twice what
// it uses nor, when the backend slows for reasons of its own, shrinks it.
func TestAdaptiveAppLimited(t *testing.T) {
	a := newTestAdaptive(4)
	now := epoch
	for range 50 {
		oneWindow(a, now, 3, steady)
		now = now.Add(service + defaultTestWindow)
	}
	if a.Limit() != 6 {
		t.Errorf("limit %d after 50 windows with 3 in flight, want 6 (twice the use)", a.Limit())
	}
	for range 10 {
		oneWindow(a, now, 2, func(int) time.Duration { return 2 * service })
		now = now.Add(2*service + defaultTestWindow)
	}
	if a.Limit() != 6 {
		t.Errorf("limit %d after slow windows with 2 of 6 in flight, want it unchanged at 6", a.Limit())
	}
}

func TestAdaptiveReportsRaise(t *testing.T) {
	a := newTestAdaptive(4)
	raised := oneWindow(a, epoch, 4, steady)
	if !raised || a.Limit() != 8 {
		t.Errorf("after a first window at the limit: raised %v, limit %d; want raised, 8 (slow start)", raised, a.Limit())
	}
}

func TestAdaptiveStaysWithinBounds(t *testing.T) {
	a := NewAdaptive(AdaptiveConfig{Min: 3, Max: 10, Initial: 4, Tolerance: 0.2, Window: defaultTestWindow}, epoch)
	now := feed(a, epoch, 20, 100, service)
	if a.Limit() != 10 {
		t.Errorf("limit %d on a large backend, want the max 10", a.Limit())
	}
	feed(a, now, 20, 1, service)
	if a.Limit() != 3 {
		t.Errorf("limit %d on a one-worker backend, want the min 3", a.Limit())
	}
}

// The zone's total reads the adaptive limit on every admission, and a
// raised limit admits the waiters it now has room for.
func TestAdaptiveTotalInZone(t *testing.T) {
	a := newTestAdaptive(2)
	lim := &Limits{Adaptive: a}
	z := NewZone(0, true, newFakeClock())
	z.Adopt(lim)
	held := []*Request{{Limits: lim}, {Limits: lim}}
	for _, r := range held {
		mustAdmit(t, z, r)
	}
	if ok, d := z.TryAcquire(&Request{Limits: lim}); ok || d != TotalDim {
		t.Fatalf("third request at limit 2: admitted %v, dim %d; want refused by the total", ok, d)
	}
	w := enqueue(t, context.Background(), z, "waiter", &Request{Limits: lim}, WaitOptions{Wait: time.Hour})
	// A first window at the limit, no queue: slow start doubles it.
	raised := oneWindow(a, epoch, 2, steady)
	if !raised || a.Limit() != 4 {
		t.Fatalf("raised %v, limit %d; want raised to 4", raised, a.Limit())
	}
	z.Kick()
	select {
	case r := <-w.res:
		if r.Outcome != Admitted {
			t.Fatalf("waiter: outcome %d after the limit rose, want admitted", r.Outcome)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter still waiting after the limit rose")
	}
	if n := z.Held(TotalDim); n != 3 {
		t.Fatalf("total holds %d, want 3", n)
	}
}
