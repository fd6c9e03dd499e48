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

// Fair sharing in what the backend gives: each tenant's share of the
// unit-seconds its requests held, whatever their lengths, checked in
// virtual time (synctest) through the zone's queue and a shared store's.

// tenantRun is a tenant's closed-loop clients in a slot-seconds run.
type tenantRun struct {
	weight  float64
	clients int
	// hold is how long the c-th client's n-th request holds its slot,
	// given the time since the run started.
	hold func(rng *rand.Rand, since time.Duration) time.Duration
	cost func(rng *rand.Rand) int64 // nil: 1
	// used is the units a request reports it used once it ends, given
	// its units (Slot.Used); nil: its units.
	used func(rng *rand.Rand, units int64) int64
	// key is the key of a request; nil: the tenant's name.
	key func(c, n int) string
	// cancel, if set, is how long a client keeps a request before
	// cancelling it, waiting or held.
	cancel func(rng *rand.Rand) time.Duration
}

// unitSeconds runs tenants against s (a tenant limit of 1000 and a total
// of total units) for the duration, and returns each tenant's share of
// the unit-seconds held within the run.
func unitSeconds(t *testing.T, s store, total int64, tenants []tenantRun, duration time.Duration) []float64 {
	t.Helper()
	lim := &Limits{Max: []int64{1000}, Total: total}
	held := make([]float64, len(tenants))
	var mu sync.Mutex
	start := time.Now()
	end := start.Add(duration)
	var wg sync.WaitGroup
	for i, tn := range tenants {
		for c := range tn.clients {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(c), uint64(i)))
				for n := 0; time.Now().Before(end); n++ {
					key := fmt.Sprint(i)
					if tn.key != nil {
						key = tn.key(c, n)
					}
					r := req(lim, key)
					if tn.cost != nil {
						r.Cost = tn.cost(rng)
					}
					ctx, stop := context.Background(), context.CancelFunc(func() {})
					if tn.cancel != nil {
						ctx, stop = context.WithTimeout(ctx, tn.cancel(rng))
					}
					res := s.acquire(ctx, r, WaitOptions{Wait: time.Hour, Fair: true, Weight: tn.weight})
					if res.Outcome == Aborted {
						stop()
						continue
					}
					if res.Outcome != Admitted {
						t.Errorf("tenant %d: outcome %d", i, res.Outcome)
						stop()
						return
					}
					from := time.Now()
					select {
					case <-time.After(tn.hold(rng, from.Sub(start))):
					case <-ctx.Done():
					}
					stop()
					to := time.Now()
					if to.After(end) {
						to = end
					}
					used := r.slot.Units()
					if tn.used != nil {
						used = tn.used(rng, used)
						r.slot.Used = used
					}
					mu.Lock()
					held[i] += float64(used) * max(0, to.Sub(from).Seconds())
					mu.Unlock()
					s.release(r)
				}
			})
		}
	}
	wg.Wait()
	var sum float64
	for _, h := range held {
		sum += h
	}
	for i := range held {
		held[i] /= sum
	}
	return held
}

// holdFor holds every request for d.
func holdFor(d time.Duration) func(*rand.Rand, time.Duration) time.Duration {
	return func(*rand.Rand, time.Duration) time.Duration { return d }
}

// around holds requests for d ± 50 %, uniformly.
func around(d time.Duration) func(*rand.Rand, time.Duration) time.Duration {
	return func(rng *rand.Rand, _ time.Duration) time.Duration {
		return d/2 + time.Duration(rng.Int64N(int64(d)))
	}
}

// jain is Jain's fairness index of the shares relative to the weights: 1
// when every tenant's share is its weight's.
func jain(shares, weights []float64) float64 {
	var wsum float64
	for _, w := range weights {
		wsum += w
	}
	var sum, sq float64
	for i, s := range shares {
		x := s / (weights[i] / wsum)
		sum += x
		sq += x * x
	}
	return sum * sum / (float64(len(shares)) * sq)
}

// checkShares fails unless each share is within 3 % of its weight's (the
// absolute share: 0.5 ± 0.03) and Jain's index is at least 0.99.
func checkShares(t *testing.T, what string, shares, weights []float64) {
	t.Helper()
	var wsum float64
	for _, w := range weights {
		wsum += w
	}
	j := jain(shares, weights)
	t.Logf("%s: shares %.3f, weights %v, Jain's index %.4f", what, shares, weights, j)
	for i, s := range shares {
		if want := weights[i] / wsum; math.Abs(s-want) > 0.03 {
			t.Errorf("%s: tenant %d has %.3f of the unit-seconds, want %.3f ± 0.03", what, i, s, want)
		}
	}
	if j < 0.99 {
		t.Errorf("%s: Jain's index %.4f, want at least 0.99", what, j)
	}
}

// stores are the queues fair sharing runs in: the zone's own, and a
// shared store's over a ledger of the given total.
func stores(t *testing.T) map[string]store {
	return map[string]store{"zone": zoneStore(), "shared": sharedStore(t)}
}

// TestFairSharesSlotSeconds: tenants whose requests hold their slots for
// different times share the backend's slot-seconds by weight, within 3 %
// of their weights' shares, with Jain's index at least 0.99: equal
// weights with requests of 1 s against 100 ms, and weights 2 : 1 : 1 with
// requests of 1 s, 100 ms and 500 ms (each ± 50 %).
func TestFairSharesSlotSeconds(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tenants []tenantRun
	}{
		{"1s-vs-100ms", []tenantRun{
			{weight: 1, clients: 8, hold: holdFor(time.Second)},
			{weight: 1, clients: 8, hold: holdFor(100 * time.Millisecond)},
		}},
		{"weights-2-1-1", []tenantRun{
			{weight: 2, clients: 8, hold: around(time.Second)},
			{weight: 1, clients: 8, hold: around(100 * time.Millisecond)},
			{weight: 1, clients: 8, hold: around(500 * time.Millisecond)},
		}},
	} {
		for _, name := range []string{"zone", "shared"} {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					shares := unitSeconds(t, stores(t)[name], 4, tc.tenants, 600*time.Second)
					checkShares(t, tc.name, shares, weightsOf(tc.tenants))
				})
			})
		}
	}
}

// TestFairSharesReportedUnitSeconds: requests that reserve the same units
// but report using different amounts (tokens a model reported, through
// Request.Used) share in what they used × the time held: a tenant whose
// requests use a fifth of what they reserve gets five times the grants.
func TestFairSharesReportedUnitSeconds(t *testing.T) {
	reserve := func(*rand.Rand) int64 { return 100 }
	tenants := []tenantRun{
		{weight: 1, clients: 8, hold: around(time.Second), cost: reserve},
		{weight: 1, clients: 8, hold: around(time.Second), cost: reserve,
			used: func(rng *rand.Rand, units int64) int64 { return units/10 + rng.Int64N(units/5) }},
	}
	for _, name := range []string{"zone", "shared"} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				shares := unitSeconds(t, stores(t)[name], 400, tenants, 600*time.Second)
				checkShares(t, "used 100 vs 10-30 of 100", shares, weightsOf(tenants))
			})
		})
	}
}

// TestFairSharesUnitSeconds: with costs of 1-3 units a request, the shares
// are of unit-seconds: units × the time held.
func TestFairSharesUnitSeconds(t *testing.T) {
	costs := func(rng *rand.Rand) int64 { return 1 + rng.Int64N(3) }
	tenants := []tenantRun{
		{weight: 1, clients: 8, hold: around(time.Second), cost: costs},
		{weight: 1, clients: 8, hold: around(100 * time.Millisecond), cost: costs},
	}
	for _, name := range []string{"zone", "shared"} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				shares := unitSeconds(t, stores(t)[name], 12, tenants, 600*time.Second)
				checkShares(t, "costs 1-3", shares, weightsOf(tenants))
			})
		})
	}
}

func weightsOf(tenants []tenantRun) []float64 {
	w := make([]float64, len(tenants))
	for i, tn := range tenants {
		w[i] = tn.weight
	}
	return w
}

// TestFairSharesResistGaming: a tenant gains no more than its share of the
// slot-seconds against an honest one (equal weights, 1 s requests) by
// making its requests short then long (100 ms for a minute, then 2 s: its
// charge is estimated from the short ones), or by cancelling them (each
// cancelled after 0-2 s, waiting or held, and sent again).
func TestFairSharesResistGaming(t *testing.T) {
	honest := tenantRun{weight: 1, clients: 8, hold: holdFor(time.Second)}
	for _, tc := range []struct {
		name     string
		attacker tenantRun
	}{
		{"short-then-long", tenantRun{weight: 1, clients: 8, hold: func(_ *rand.Rand, since time.Duration) time.Duration {
			if since < time.Minute {
				return 100 * time.Millisecond
			}
			return 2 * time.Second
		}}},
		{"cancelling", tenantRun{weight: 1, clients: 8, hold: holdFor(2 * time.Second), cancel: func(rng *rand.Rand) time.Duration {
			return time.Duration(rng.Int64N(int64(2 * time.Second)))
		}}},
	} {
		for _, name := range []string{"zone", "shared"} {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					shares := unitSeconds(t, stores(t)[name], 4, []tenantRun{tc.attacker, honest}, 600*time.Second)
					t.Logf("%s: attacker %.3f, honest %.3f", tc.name, shares[0], shares[1])
					if shares[0] > 0.5+0.03 {
						t.Errorf("%s: the attacker has %.3f of the slot-seconds, want at most 0.5 + 0.03", tc.name, shares[0])
					}
				})
			})
		}
	}
}

// TestFairOneShotKeysDoNotStarveAWaitingKey: a stream of keys that each
// send one request (8 clients, a new key each time) cannot pass a key that
// waits all along for ever. Each of the stream's keys is a tenant of its
// own, so the waiting key's fluid share is 1 of the keys waiting (1 + 8 at
// most); start tags move on by grants, not continuously, and it is granted
// at least half that: 1/18 of the slot-seconds, not nothing.
func TestFairOneShotKeysDoNotStarveAWaitingKey(t *testing.T) {
	tenants := []tenantRun{
		{weight: 1, clients: 8, hold: holdFor(time.Second), key: func(c, n int) string { return fmt.Sprintf("one-shot-%d-%d", c, n) }},
		{weight: 1, clients: 8, hold: holdFor(time.Second)},
	}
	for _, name := range []string{"zone", "shared"} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				shares := unitSeconds(t, stores(t)[name], 4, tenants, 600*time.Second)
				t.Logf("one-shot keys %.3f, the waiting key %.3f", shares[0], shares[1])
				if shares[1] < 1.0/18 {
					t.Errorf("the waiting key has %.3f of the slot-seconds beside a stream of one-shot keys, want at least 1/18 (half of 1 of 9 keys waiting)", shares[1])
				}
			})
		})
	}
}

// TestFairRefundMovesTheKeyForward: a request that ends long before its
// estimate gives its key the difference back at once, so the key's next
// waiter goes before a key that was given more. Total 1; b's first
// request is charged and held 1 s, a's first is charged the same 1 s and
// ends after 10 ms: a has then been given 10 ms against b's 1 s, and its
// waiter is granted before b's, although it was listed after it.
func TestFairRefundMovesTheKeyForward(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := NewZone(1, true, nil)
		lim := &Limits{Max: []int64{1000}, Total: 1}
		opt := WaitOptions{Wait: time.Hour, Fair: true}
		ctx := context.Background()
		x := req(lim, "x")
		mustAdmit(t, z, x)
		wait := func(key string) (*Request, chan struct{}) {
			r, done := req(lim, key), make(chan struct{})
			go func() {
				if res := z.Acquire(ctx, r, opt); res.Outcome != Admitted {
					t.Errorf("%s: outcome %d", key, res.Outcome)
				}
				close(done)
			}()
			synctest.Wait()
			return r, done
		}
		b1, b1Done := wait("b")
		a1, a1Done := wait("a")
		x.slot.Release() // b1 first: the same tag, the earlier arrival
		<-b1Done
		b2, b2Done := wait("b")
		time.Sleep(time.Second)
		b1.slot.Release() // held 1 s as charged; a1 is next
		<-a1Done
		a2, a2Done := wait("a") // listed after b2, at a's tag: past b's
		time.Sleep(10 * time.Millisecond)
		a1.slot.Release() // charged 1 s, held 10 ms
		synctest.Wait()
		select {
		case <-a2Done:
		case <-b2Done:
			t.Error("b's waiter was granted after a's request gave back 990 ms of its charge; want a's, whose key was given 10 ms against b's 1 s")
			b2.slot.Release()
			<-a2Done
			a2.slot.Release()
			return
		}
		a2.slot.Release()
		<-a2Done
		b2.slot.Release()
	})
}
