package limiter

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// waterFill returns the weighted max-min shares of capacity among keys of
// weights w and caps c (0: none): each key gets w × level, at most its
// cap, the level raised until the capacity is given out or every key is
// at its cap.
func waterFill(capacity float64, w, c []float64) []float64 {
	out := make([]float64, len(w))
	open := make([]int, len(w))
	for i := range open {
		open[i] = i
	}
	for left := capacity; len(open) > 0 && left > 1e-12; {
		var weights float64
		for _, i := range open {
			weights += w[i]
		}
		level := left / weights
		// The keys whose cap the level passes take their cap; the rest
		// share what remains at the next round.
		sort.Slice(open, func(a, b int) bool {
			return headroom(c, out, open[a])/w[open[a]] < headroom(c, out, open[b])/w[open[b]]
		})
		i := open[0]
		if c[i] == 0 || headroom(c, out, i) >= w[i]*level {
			for _, j := range open {
				out[j] += w[j] * level
			}
			break
		}
		step := headroom(c, out, i) / w[i]
		for _, j := range open {
			out[j] += w[j] * step
			left -= w[j] * step
		}
		open = open[1:]
	}
	return out
}

// nearCap reports whether a max-min share comes within a unit of its cap.
func nearCap(cap, share float64) bool { return cap > 0 && cap-share < 1 }

func headroom(c, out []float64, i int) float64 {
	if c[i] == 0 {
		return math.Inf(1)
	}
	return c[i] - out[i]
}

// TestFairSharesAreMaxMinWithCaps: random tenants (2–5, weights 0.5–3,
// some capped below their share of the total, some not; in every other
// case with requests of 1–3 units), each with more clients than it can
// hold, share a total of 6–20 for 1,000 s of virtual time. Each gets its
// weighted max-min share of the unit-seconds (a key at its own cap takes
// its cap, the rest is shared by weight), within 0.02 of the total or 5 %
// of its share, whichever is larger, and the keys hold all the total they
// can, within 2 %. Two things widen that, both by whole requests: a key
// whose share comes within a unit of its cap may fall short by a unit,
// which the others share (it can never run above its cap to make up for a
// moment below it); with requests of more than one unit, each key by the
// largest request's units less one, and the total holds that much less
// at most (units held for the head of the queue while it does not fit).
func TestFairSharesAreMaxMinWithCaps(t *testing.T) {
	for seed := range 12 {
		rng := rand.New(rand.NewPCG(uint64(seed), 38))
		total := 6 + rng.IntN(15)
		n := 2 + rng.IntN(4)
		weights, caps, costs := make([]float64, n), make([]float64, n), make([]int64, n)
		for i := range n {
			weights[i] = []float64{0.5, 1, 2, 3}[rng.IntN(4)]
			if rng.IntN(2) == 0 {
				caps[i] = float64(1 + rng.IntN(total/2))
			}
			costs[i] = 1
			if seed%2 == 1 {
				costs[i] = int64(1 + rng.IntN(3))
			}
		}
		// A key takes whole requests: its cap, in effect, is the units of
		// the most requests that fit in it.
		held := make([]float64, n)
		for i := range n {
			held[i] = caps[i]
			if c := float64(costs[i]); caps[i] > 0 && c <= caps[i] {
				held[i] = math.Floor(caps[i]/c) * c
			}
		}
		want := waterFill(float64(total), weights, held)
		lumps := float64(slices.Max(costs) - 1)
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				got, busy := maxMinRun(t, int64(total), weights, caps, costs, 1000*time.Second)
				short, open := 0.0, 0.0 // units the keys near their caps may lack; weights of the others
				for i := range n {
					if nearCap(held[i], want[i]) {
						short++
					} else {
						open += weights[i]
					}
				}
				for i := range n {
					tol := max(0.02*float64(total), 0.05*want[i]) + lumps
					low, high := tol, tol
					if nearCap(held[i], want[i]) {
						low++
					} else {
						high += short * weights[i] / open
					}
					if got[i] < want[i]-low || got[i] > want[i]+high {
						t.Errorf("total %d, weights %v, caps %v, costs %v: key %d holds %.3f on average, want %.3f (-%.3f, +%.3f; all: %.3f, want %.3f)",
							total, weights, caps, costs, i, got[i], want[i], low, high, got, want)
					}
				}
				var all float64 // the total, or less if every key is at its cap
				for _, w := range want {
					all += w
				}
				if busy < 0.98*all-lumps {
					t.Errorf("the keys held %.2f of %d on average, want %.2f", busy, total, all)
				}
			})
		})
	}
}

// maxMinRun runs the tenants (key i capped at caps[i], 0: by the total
// alone, its requests costing costs[i]) under fair for the duration after
// a warm-up, and returns the units each held on average, and their sum.
func maxMinRun(t *testing.T, total int64, weights, caps []float64, costs []int64, duration time.Duration) ([]float64, float64) {
	const warmUp = 20 * time.Second
	z := NewZone(1, true, nil)
	lim := &Limits{Max: []int64{0}, Total: total}
	start := time.Now()
	from, to := start.Add(warmUp), start.Add(warmUp+duration)
	held := make([]float64, len(weights))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, w := range weights {
		capped := int64(caps[i])
		if capped == 0 {
			capped = total
		}
		for c := range int(total) + 2 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(c), uint64(i)))
				opt := WaitOptions{Wait: time.Hour, Fair: true, Weight: w}
				for time.Now().Before(to) {
					r := &Request{Keys: []string{string(rune('a' + i))}, Max: []int64{capped}, Cost: costs[i], Limits: lim}
					if res := z.Acquire(context.Background(), r, opt); res.Outcome != Admitted {
						t.Errorf("outcome %d", res.Outcome)
						return
					}
					began := time.Now()
					time.Sleep(500*time.Millisecond + time.Duration(rng.IntN(1000))*time.Millisecond)
					overlap := minTime(time.Now(), to).Sub(maxTime(began, from)).Seconds()
					mu.Lock()
					held[i] += max(overlap, 0) * float64(r.slot.Units())
					mu.Unlock()
					r.slot.Release()
				}
			})
		}
	}
	wg.Wait()
	var sum float64
	for i := range held {
		held[i] /= duration.Seconds()
		sum += held[i]
	}
	return held, sum
}
