package limiter

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func costly(lim *Limits, cost int64, keys ...string) *Request {
	r := req(lim, keys...)
	r.Cost = cost
	return r
}

// TestCostMixedSharesCap: requests of costs 1 to 40 share a key's cap of
// 100 units and a total of 150 under contention: no cap is ever exceeded in
// units, and every count is back at zero afterwards.
func TestCostMixedSharesCap(t *testing.T) {
	z := NewZone(1, true, nil)
	lim := &Limits{Max: []int64{100}, Total: 150}
	var held [2]atomic.Int64 // key "a", total
	var peak [2]atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range 3000 {
				key := []string{"a", "b"}[rng.IntN(2)]
				r := costly(lim, 1+rng.Int64N(40), key)
				if slot, _ := z.TryAcquire(r); slot == nil {
					continue
				}
				if r.slot.Units() != r.Cost {
					t.Errorf("cost %d took %d units", r.Cost, r.slot.Units())
				}
				if key == "a" {
					notePeak(&peak[0], held[0].Add(r.slot.Units()))
				}
				notePeak(&peak[1], held[1].Add(r.slot.Units()))
				if key == "a" {
					held[0].Add(-r.slot.Units())
				}
				held[1].Add(-r.slot.Units())
				r.slot.Release()
			}
		})
	}
	wg.Wait()
	if peak[0].Load() > 100 || peak[1].Load() > 150 {
		t.Fatalf("peak units: key %d (cap 100), total %d (cap 150)", peak[0].Load(), peak[1].Load())
	}
	for _, d := range []int{0, TotalDim} {
		if u, n := countIn(z, d); u != 0 || n != 0 {
			t.Fatalf("dimension %d: %d units, %d requests left", d, u, n)
		}
	}
	t.Logf("peak units: key a %d of 100, total %d of 150", peak[0].Load(), peak[1].Load())
}

// TestCostAboveCapAdmittedAlone: a cost above the smallest cap counts as
// that cap: refused while anything holds it, admitted once it is free, and
// what it gives back is what it took, even after a reload lowered the cap.
func TestCostAboveCapAdmittedAlone(t *testing.T) {
	z := NewZone(1, true, nil)
	lim := &Limits{Max: []int64{10}, Total: 100}
	small := costly(lim, 1, "a")
	mustAdmit(t, z, small)
	big := costly(lim, 1_000_000, "a")
	mustRefuse(t, z, big, 0)
	small.slot.Release()
	mustAdmit(t, z, big)
	if big.slot.Units() != 10 {
		t.Fatalf("cost 1e6 under a cap of 10 took %d units, want 10", big.slot.Units())
	}
	if u, n := countIn(z, TotalDim); u != 10 || n != 1 {
		t.Fatalf("total holds %d units of %d requests, want 10 of 1", u, n)
	}
	lower := &Limits{Max: []int64{4}, Total: 100}
	z.Adopt(lower)
	z.Retire(lim)
	big.slot.Release()
	for _, d := range []int{0, TotalDim} {
		if u, n := countIn(z, d); u != 0 || n != 0 {
			t.Fatalf("after release across a reload, dimension %d: %d units, %d requests", d, u, n)
		}
	}
	huge := costly(lower, math.MaxInt64, "b")
	mustAdmit(t, z, huge)
	if huge.slot.Units() != 4 {
		t.Fatalf("cost MaxInt64 took %d units, want the cap 4", huge.slot.Units())
	}
	huge.slot.Release()
}

// store is what the tests below drive: a zone, or a shared queue over a
// ledger in memory (see sharedqueue_test.go).
type store struct {
	acquire func(ctx context.Context, r *Request, opt WaitOptions) Result
	release func(r *Request)
}

func zoneStore() store {
	z := NewZone(1, true, nil)
	return store{acquire: z.Acquire, release: func(r *Request) { r.slot.Release() }}
}

// bigWaiterWait runs a steady stream of requests of cost 1 (20 clients,
// each always waiting for the next, held 0.9-1.09 s) through s, whose
// total is 10, then a request of cost 10, and returns how it ended.
func bigWaiterWait(s store) Result {
	lim := &Limits{Max: []int64{1000}, Total: 10}
	opt := WaitOptions{Wait: time.Hour}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for c := range 20 {
		wg.Go(func() {
			for ctx.Err() == nil {
				r := costly(lim, 1, "small")
				if s.acquire(ctx, r, opt).Outcome != Admitted {
					return
				}
				time.Sleep(time.Duration(900+10*c) * time.Millisecond) // staggered releases
				s.release(r)
			}
		})
	}
	time.Sleep(10 * time.Second)
	big := costly(lim, 10, "big")
	res := s.acquire(context.Background(), big, opt)
	if res.Outcome == Admitted {
		s.release(big)
	}
	stop()
	wg.Wait()
	return res
}

// TestBigWaiterNotStarved: under a steady stream of requests of cost 1, a
// waiter of cost 10 on a total of 10 is admitted once the waiters ahead of
// it and the requests holding the total are through (about two service
// times of 0.9-1.09 s), not when its wait runs out: freed units are held
// for it.
func TestBigWaiterNotStarved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		res := bigWaiterWait(zoneStore())
		if res.Outcome != Admitted || res.Waited > 2200*time.Millisecond {
			t.Fatalf("big request: outcome %d after %s, want admitted within two service times (2.2s)", res.Outcome, res.Waited)
		}
		t.Logf("cost-10 request admitted after %s among 20 clients of cost 1", res.Waited)
	})
}

// TestBigWaiterHoldsOnlyItsConstraint: a big waiter held by its key's cap
// does not hold back waiters of other keys, nor newcomers of other keys.
func TestBigWaiterHoldsOnlyItsConstraint(t *testing.T) {
	z := NewZone(1, true, newFakeClock())
	lim := &Limits{Max: []int64{10}, Total: 100}
	holdA := costly(lim, 5, "a")
	mustAdmit(t, z, holdA)
	ctx := context.Background()
	opt := WaitOptions{Wait: time.Hour}
	bigA := enqueue(t, ctx, z, "bigA", costly(lim, 10, "a"), opt)
	mustRefuse(t, z, costly(lim, 1, "a"), 0) // a's room is held for bigA
	mustAdmit(t, z, costly(lim, 9, "b"))     // b's is not
	holdA.slot.Release()
	if r := <-bigA.res; r.Outcome != Admitted {
		t.Fatalf("bigA outcome %d, want admitted", r.Outcome)
	}
}

// unitSecondShares runs two tenants of weights 2 and 1 whose requests cost
// 3 and 1 units (16 clients each, requests held 1 s, for 2000 s) through
// s, whose total is 12, and returns the first tenant's share of the
// unit-seconds.
func unitSecondShares(t *testing.T, s store) float64 {
	lim := &Limits{Max: []int64{1000}, Total: 12}
	tenants := []struct {
		key    string
		weight float64
		cost   int64
	}{{"a", 2, 3}, {"b", 1, 1}}
	var mu sync.Mutex
	var unitSeconds [2]float64
	start := time.Now()
	var wg sync.WaitGroup
	for i, tn := range tenants {
		for range 16 {
			wg.Go(func() {
				for time.Since(start) < 2000*time.Second {
					r := costly(lim, tn.cost, tn.key)
					if res := s.acquire(context.Background(), r, WaitOptions{Wait: time.Hour, Fair: true, Weight: tn.weight}); res.Outcome != Admitted {
						t.Errorf("outcome %d", res.Outcome)
						return
					}
					time.Sleep(time.Second)
					mu.Lock()
					unitSeconds[i] += float64(r.slot.Units())
					mu.Unlock()
					s.release(r)
				}
			})
		}
	}
	wg.Wait()
	return unitSeconds[0] / (unitSeconds[0] + unitSeconds[1])
}

// TestFairSharesInUnits: two tenants of weights 2 and 1 whose requests
// cost 3 and 1 units share a total of 12 units in proportion to their
// weights in unit-seconds, within 5%.
func TestFairSharesInUnits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		share := unitSecondShares(t, zoneStore())
		if math.Abs(share/(2.0/3)-1) > 0.05 {
			t.Fatalf("tenant a (weight 2, cost 3) has %.4f of the unit-seconds, want 2/3 ± 5%%", share)
		}
		t.Logf("unit-second shares %.4f / %.4f (want 2/3, 1/3)", share, 1-share)
	})
}

// A per-request max of 2^63-1 (an "unlimited" map value) admits, split
// between replicas or not: a cap above the unit range counts as MaxCost.
func TestUnlimitedPlaceholderMaxAdmits(t *testing.T) {
	for _, div := range []int64{0, 2, 3} {
		z := NewZone(1, false, nil)
		lim := &Limits{Max: []int64{0}, Divisor: div}
		r := &Request{Keys: []string{"tenant"}, Max: []int64{math.MaxInt64}, Limits: lim, Cost: 7}
		if slot, d := z.TryAcquire(r); slot == nil {
			t.Errorf("replicas %d: refused by dimension %d in an empty zone, want admitted", div, d)
			continue
		}
		if r.slot.Units() != 7 {
			t.Errorf("replicas %d: took %d units, want its cost 7", div, r.slot.Units())
		}
		r.slot.Release()
	}
}

// split is ceil(n/div) for every positive int64, never negative.
func TestSplitNeverOverflows(t *testing.T) {
	for _, c := range []struct{ n, div, want int64 }{
		{math.MaxInt64, 2, 1 << 62},
		{math.MaxInt64, 3, math.MaxInt64/3 + 1},
		{math.MaxInt64 - 1, 2, 1<<62 - 1},
		{5, 2, 3}, {4, 2, 2}, {1, 1000, 1}, {7, 1, 7}, {7, 0, 7},
	} {
		if got := split(c.n, c.div); got != c.want {
			t.Errorf("split(%d, %d) = %d, want %d", c.n, c.div, got, c.want)
		}
	}
}

// A total above the unit range counts as MaxCost: requests of MaxCost
// units each are admitted one at a time, and the total's request count is
// never touched by units.
func TestTotalAboveUnitRangeNeverOverflows(t *testing.T) {
	z := NewZone(1, true, nil)
	lim := &Limits{Max: []int64{0}, Total: 1 << 41}
	var admitted []*Request
	for i := range 3 {
		r := &Request{Keys: []string{fmt.Sprint("key", i)}, Max: []int64{math.MaxInt64}, Limits: lim, Cost: MaxCost}
		if slot, _ := z.TryAcquire(r); slot != nil {
			admitted = append(admitted, r)
		}
	}
	units, requests := countIn(z, TotalDim)
	if len(admitted) != 1 || units != MaxCost || requests != 1 {
		t.Errorf("three requests of MaxCost under a total of 2^41: %d admitted, total holds %d units in %d requests; want 1 admitted holding %d units",
			len(admitted), units, requests, int64(MaxCost))
	}
	for _, r := range admitted {
		r.slot.Release()
	}
	if units, requests := countIn(z, TotalDim); units != 0 || requests != 0 {
		t.Errorf("after every release: %d units in %d requests, want 0", units, requests)
	}
}
