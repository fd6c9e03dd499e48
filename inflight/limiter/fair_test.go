package limiter

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// Fair sharing is checked by simulation in a synctest bubble: time is
// virtual, so a service time is exact and the run deterministic enough to
// assert shares, and a 2,000 s run takes a moment.

// tenantLoad is a tenant's closed-loop clients: each sends a request,
// holds its slot for a service time, and sends the next.
type tenantLoad struct {
	key     string
	weight  float64 // 0: the class weight
	clients int
}

// shares runs loads against one zone (a tenant limit with the given max,
// and a total) for the duration, and returns each tenant's share of the
// slot-time served.
func shares(t *testing.T, fair bool, max, total int64, loads []tenantLoad, duration time.Duration) []float64 {
	t.Helper()
	return sharesIn(t, NewZone(1, true, nil), &Limits{Max: []int64{max}, Total: total}, fair, loads, duration)
}

// sharesIn is shares in zone z under lim.
func sharesIn(t *testing.T, z *Zone, lim *Limits, fair bool, loads []tenantLoad, duration time.Duration) []float64 {
	t.Helper()
	busy := make([]time.Duration, len(loads))
	var mu sync.Mutex
	start := time.Now()
	var wg sync.WaitGroup
	for i, l := range loads {
		for c := range l.clients {
			wg.Go(func() {
				// Service times 0.5–1.5 s, the same sequence for every
				// tenant's n-th client, so no tenant is luckier.
				rng := rand.New(rand.NewPCG(uint64(c), 7))
				opt := WaitOptions{Wait: time.Hour, Fair: fair, Weight: l.weight}
				for time.Since(start) < duration {
					r := req(lim, l.key)
					if res := z.Acquire(context.Background(), r, opt); res.Outcome != Admitted {
						t.Errorf("%s: outcome %d", l.key, res.Outcome)
						return
					}
					service := 500*time.Millisecond + time.Duration(rng.IntN(1000))*time.Millisecond
					time.Sleep(service)
					mu.Lock()
					busy[i] += service
					mu.Unlock()
					r.slot.Release()
				}
			})
		}
	}
	wg.Wait()
	if waitingIn(z) != 0 || unitsIn(z, 0) != 0 || unitsIn(z, TotalDim) != 0 {
		t.Fatalf("left behind: waiting %d held %d total %d", waitingIn(z), unitsIn(z, 0), unitsIn(z, TotalDim))
	}
	var sum time.Duration
	for _, b := range busy {
		sum += b
	}
	out := make([]float64, len(busy))
	for i, b := range busy {
		out[i] = float64(b) / float64(sum)
	}
	return out
}

// TestFairLightTenantOvertakesFlood: 500 requests of one tenant queue for
// 10 slots of 1 s each; a single request of another tenant arriving behind
// them is served at the next freed slot with fair, after the whole flood
// without.
func TestFairLightTenantOvertakesFlood(t *testing.T) {
	for _, tc := range []struct {
		fair     bool
		min, max time.Duration
	}{
		{fair: true, max: time.Second},
		{fair: false, min: 40 * time.Second, max: time.Hour},
	} {
		t.Run(fmt.Sprint("fair=", tc.fair), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				z := NewZone(1, true, nil)
				lim := &Limits{Max: []int64{1000}, Total: 10}
				opt := WaitOptions{Wait: time.Hour, Fair: tc.fair}
				var wg sync.WaitGroup
				for range 510 { // 10 hold the slots, 500 wait
					wg.Go(func() {
						r := req(lim, "flood")
						if res := z.Acquire(context.Background(), r, opt); res.Outcome == Admitted {
							time.Sleep(time.Second)
							r.slot.Release()
						}
					})
				}
				synctest.Wait()
				if waitingIn(z) != 500 {
					t.Fatalf("%d waiting, want 500", waitingIn(z))
				}
				time.Sleep(500 * time.Millisecond)
				r := req(lim, "light")
				res := z.Acquire(context.Background(), r, opt)
				if res.Outcome != Admitted || res.Waited > tc.max || res.Waited < tc.min {
					t.Fatalf("light tenant: outcome %d after %s, want admitted after %s to %s", res.Outcome, res.Waited, tc.min, tc.max)
				}
				t.Logf("light tenant waited %s behind 500 queued requests", res.Waited)
				r.slot.Release()
				wg.Wait()
			})
		})
	}
}

// TestFairWeightedShares: three tenants with weights 2, 1 and 0.5, each
// with more clients than the total, share the slot-time 4/7, 2/7, 1/7
// within 5%.
func TestFairWeightedShares(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		loads := []tenantLoad{{"a", 2, 12}, {"b", 1, 12}, {"c", 0.5, 12}}
		got := shares(t, true, 1000, 10, loads, 2000*time.Second)
		for i, want := range []float64{4.0 / 7, 2.0 / 7, 1.0 / 7} {
			if math.Abs(got[i]/want-1) > 0.05 {
				t.Errorf("tenant %s: share %.4f, want %.4f ± 5%%", loads[i].key, got[i], want)
			}
		}
		t.Logf("shares %.4f (want 4/7, 2/7, 1/7)", got)
	})
}

// TestFairSurvivesExtremeWeights: a key that waits with extreme weights
// (tiny, huge, not a number, infinite, negative, zero) beside a flood
// leaves fair sharing intact: three tenants with weights 2, 1 and 0.5
// still share the slot-time 4/7, 2/7, 1/7 within 5% afterwards.
func TestFairSurvivesExtremeWeights(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := NewZone(1, true, nil)
		lim := &Limits{Max: []int64{1000}, Total: 10}
		poison := []tenantLoad{{"flood", 1, 12}}
		for _, w := range []float64{1e-17, 5e-324, 1e300, math.NaN(), math.Inf(1), math.Inf(-1), -1, 0} {
			poison = append(poison, tenantLoad{"poison", w, 2})
		}
		sharesIn(t, z, lim, true, poison, 200*time.Second)
		z.mu.Lock()
		vtime := z.vclock.vtime
		z.mu.Unlock()
		if math.IsNaN(vtime) || vtime < 0 || vtime >= rebaseAt {
			t.Errorf("virtual time %v after the poison, want within [0, %v)", vtime, float64(rebaseAt))
		}
		loads := []tenantLoad{{"a", 2, 12}, {"b", 1, 12}, {"c", 0.5, 12}}
		got := sharesIn(t, z, lim, true, loads, 2000*time.Second)
		for i, want := range []float64{4.0 / 7, 2.0 / 7, 1.0 / 7} {
			if math.Abs(got[i]/want-1) > 0.05 {
				t.Errorf("tenant %s: share %.4f, want %.4f ± 5%%", loads[i].key, got[i], want)
			}
		}
		t.Logf("virtual time %v after the poison; shares %.4f (want 4/7, 2/7, 1/7)", vtime, got)
	})
}

// TestVirtualTimeRebases: a key of the least weight granted without end
// moves virtual time back before it loses precision, and tags keep their
// distance to it.
func TestVirtualTimeRebases(t *testing.T) {
	var c virtualClock
	other := uint64(2)
	c.charge(other, 1, 1, defaultHold)
	for range 3 * rebaseAt / 1000 { // 1/MinWeight a grant: three rebases
		c.charge(1, 1, MinWeight, defaultHold)
		if c.vtime >= rebaseAt || math.Abs(c.tags[1]-c.vtime-1/MinWeight) > 1e-6 {
			t.Fatalf("virtual time %v, tag %v: want below %v and one step of %v apart", c.vtime, c.tags[1], float64(rebaseAt), 1/MinWeight)
		}
	}
	if _, ok := c.tags[other]; ok {
		t.Fatal("a tag left behind by virtual time was kept")
	}
}

// TestFairJainIndex: ten tenants of equal weight, some with many more
// clients than others, share 8 slots with Jain's fairness index ≥ 0.99.
func TestFairJainIndex(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var loads []tenantLoad
		for i := range 10 {
			loads = append(loads, tenantLoad{key: fmt.Sprint("t", i), clients: 2 + 3*i})
		}
		got := shares(t, true, 1000, 8, loads, 2000*time.Second)
		var sum, squares float64
		for _, x := range got {
			sum += x
			squares += x * x
		}
		jain := sum * sum / (float64(len(got)) * squares)
		t.Logf("Jain's index %.4f over shares %.3f", jain, got)
		if jain < 0.99 {
			t.Errorf("Jain's index %.4f, want ≥ 0.99", jain)
		}
	})
}

// TestFairLowWeightNotStarved: a tenant of weight 0.25 against one of
// weight 1 with three times its clients gets its share, 1/5, not nothing.
func TestFairLowWeightNotStarved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		loads := []tenantLoad{{"heavy", 1, 30}, {"low", 0.25, 10}}
		got := shares(t, true, 1000, 10, loads, 2000*time.Second)
		if math.Abs(got[1]/0.2-1) > 0.05 {
			t.Errorf("low-weight tenant: share %.4f, want 0.2 ± 5%%", got[1])
		}
	})
}

// TestFairClassIsWeight: without a weight, a tenant's class is its share:
// high (2) against low (0.5) is 4:1.
func TestFairClassIsWeight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := NewZone(1, true, nil)
		lim := &Limits{Max: []int64{1000}, Total: 10}
		busy := map[Class]time.Duration{}
		var mu sync.Mutex
		start := time.Now()
		var wg sync.WaitGroup
		for _, c := range []Class{High, Low} {
			for range 15 {
				wg.Go(func() {
					for time.Since(start) < 1000*time.Second {
						r := req(lim, c.String())
						z.Acquire(context.Background(), r, WaitOptions{Wait: time.Hour, Fair: true, Class: c})
						time.Sleep(time.Second)
						mu.Lock()
						busy[c] += time.Second
						mu.Unlock()
						r.slot.Release()
					}
				})
			}
		}
		wg.Wait()
		if share := float64(busy[High]) / float64(busy[High]+busy[Low]); math.Abs(share/0.8-1) > 0.05 {
			t.Errorf("high share %.4f, want 0.8 ± 5%%", share)
		}
	})
}

// TestFairNoHeadOfLineBlocking: with fair, a tenant whose own cap is full
// does not hold back another that fits, however light its load.
func TestFairNoHeadOfLineBlocking(t *testing.T) {
	z := NewZone(1, true, newFakeClock())
	lim := &Limits{Max: []int64{1}, Total: 2}
	holdA, holdB := req(lim, "a"), req(lim, "b")
	mustAdmit(t, z, holdA)
	mustAdmit(t, z, holdB)
	opt := WaitOptions{Wait: time.Hour, Fair: true}
	waitA := enqueue(t, context.Background(), z, "a", req(lim, "a"), opt)
	waitB := enqueue(t, context.Background(), z, "b", req(lim, "b"), opt)
	holdB.slot.Release()
	if r := <-waitB.res; r.Outcome != Admitted {
		t.Fatalf("b outcome %d, want admitted", r.Outcome)
	}
	holdA.slot.Release()
	if r := <-waitA.res; r.Outcome != Admitted {
		t.Fatalf("a outcome %d, want admitted", r.Outcome)
	}
}

// TestMaxWaitingPerKey: a key at its bound of waiting places is refused
// with QueueFull on the bounded dimension; other keys still wait.
func TestMaxWaitingPerKey(t *testing.T) {
	z := NewZone(2, true, newFakeClock())
	lim := &Limits{Max: []int64{100, 100}, Total: 1}
	mustAdmit(t, z, req(lim, "c0", "x"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opt := WaitOptions{Wait: time.Hour, Fair: true, KeyDim: 1, MaxWaitingPerKey: 2}
	enqueue(t, ctx, z, "1", req(lim, "c1", "x"), opt)
	enqueue(t, ctx, z, "2", req(lim, "c2", "x"), opt)
	if r := z.Acquire(ctx, req(lim, "c3", "x"), opt); r.Outcome != QueueFull || r.Dim != 1 {
		t.Fatalf("third waiter of key x: %+v, want queue full on dimension 1", r)
	}
	enqueue(t, ctx, z, "y", req(lim, "c4", "y"), opt)
	got := map[string]int64{}
	for _, kw := range z.State(Look{WaitingKeys: true}).Dims[1].Waiting {
		got[kw.Key] = kw.Waiting
	}
	if fmt.Sprint(got) != "map[x:2 y:1]" {
		t.Fatalf("waiting keys %v, want x 2 and y 1", got)
	}
	cancel()
	waitFor(t, func() bool { return waitingIn(z) == 0 })
	z.mu.Lock()
	defer z.mu.Unlock()
	if len(z.perKey) != 0 || len(z.byID) != 0 || len(z.blocked) != 0 || z.onTotal != nil {
		t.Fatalf("index left behind: perKey %d flows %d blocked %d total %v", len(z.perKey), len(z.byID), len(z.blocked), z.onTotal != nil)
	}
}

// TestFairTimeoutAbortReload: fair waiters time out, abort and follow a
// reload as any waiter does.
func TestFairTimeoutAbortReload(t *testing.T) {
	z, old, clock := oneSlot()
	z.Adopt(old)
	holder := req(old, "k")
	mustAdmit(t, z, holder)
	opt := WaitOptions{Wait: 10 * time.Second, Fair: true}
	timed := enqueue(t, context.Background(), z, "timed", req(old, "k"), opt)
	waitFor(t, func() bool { return clock.timersSet() == 1 })
	clock.Advance(10 * time.Second)
	if r := <-timed.res; r.Outcome != Timeout || r.Waited != 10*time.Second {
		t.Fatalf("timed: %+v, want timeout after 10s", r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	aborted := enqueue(t, ctx, z, "aborted", req(old, "k"), opt)
	cancel()
	if r := <-aborted.res; r.Outcome != Aborted {
		t.Fatalf("aborted: %+v", r)
	}
	opt.Wait = time.Hour
	as := []*arrival{
		enqueue(t, context.Background(), z, "1", req(old, "k"), opt),
		enqueue(t, context.Background(), z, "2", req(old, "k"), opt),
	}
	z.Adopt(&Limits{Max: []int64{3}})
	z.Retire(old)
	for _, a := range as {
		if r := <-a.res; r.Outcome != Admitted {
			t.Fatalf("%s after reload: %+v, want admitted", a.name, r)
		}
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if waitingIn(z) != 0 || z.pending.Load() != 0 || len(z.byID) != 0 {
		t.Fatalf("left behind: waiting %d pending %d flows %d", waitingIn(z), z.pending.Load(), len(z.byID))
	}
}
