//go:build !race

// The simulations are single-goroutine arithmetic, which the race detector
// has nothing to check in and slows some 30 times: CI runs them without it
// (.ci/run).

package limiter

import (
	"fmt"
	"testing"
	"time"
)

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
