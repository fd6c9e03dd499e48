package limiter

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func req(lim *Limits, keys ...string) *Request {
	return &Request{Keys: keys, Max: make([]int64, len(keys)), Limits: lim}
}

// notePeak raises peak to n if n is higher.
func notePeak(peak *atomic.Int64, n int64) {
	for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
	}
}

// mustAdmit admits r at z at once (with a ledger, after its call), or
// fails t.
func mustAdmit(t *testing.T, z *Zone, r *Request) {
	t.Helper()
	if res := z.Acquire(context.Background(), r, WaitOptions{}); res.Outcome != Admitted {
		t.Fatalf("outcome %d by dimension %d, want admitted", res.Outcome, res.Dim)
	}
}

func mustRefuse(t *testing.T, z *Zone, r *Request, wantDim int) {
	t.Helper()
	if slot, d := z.TryAcquire(r); slot != nil || d != wantDim {
		t.Fatalf("TryAcquire = %v, dim %d; want refused by dim %d", slot, d, wantDim)
	}
}

func TestCapPerKeyAndIsolation(t *testing.T) {
	z := NewZone(1, false, nil)
	lim := &Limits{Max: []int64{2}}
	a1, a2, a3, b := req(lim, "a"), req(lim, "a"), req(lim, "a"), req(lim, "b")
	mustAdmit(t, z, a1)
	mustAdmit(t, z, a2)
	mustRefuse(t, z, a3, 0)
	mustAdmit(t, z, b) // another key is not affected
	a1.slot.Release()
	mustAdmit(t, z, a3) // a freed slot admits the next
	for _, r := range []*Request{a2, a3, b} {
		r.slot.Release()
	}
	if unitsIn(z, 0) != 0 || keysIn(z, 0) != 0 {
		t.Fatalf("after release: held %d, keys %d; want 0, 0", unitsIn(z, 0), keysIn(z, 0))
	}
}

func TestAllOrNothing(t *testing.T) {
	z := NewZone(2, true, nil)
	lim := &Limits{Max: []int64{5, 1}, Total: 10}
	holder := req(lim, "client", "tenant")
	mustAdmit(t, z, holder)
	// The tenant dimension is full: the client dimension and the total must
	// stay as they were.
	mustRefuse(t, z, req(lim, "client", "tenant"), 1)
	if got := unitsIn(z, 0); got != 1 {
		t.Fatalf("client held %d after a refusal, want 1", got)
	}
	if got := unitsIn(z, TotalDim); got != 1 {
		t.Fatalf("total %d after a refusal, want 1", got)
	}
	holder.slot.Release()
	if unitsIn(z, 0)+unitsIn(z, 1)+unitsIn(z, TotalDim) != 0 || keysIn(z, 0)+keysIn(z, 1) != 0 {
		t.Fatal("counts not back at zero")
	}
}

func TestTotalCapsAcrossKeys(t *testing.T) {
	z := NewZone(1, true, nil)
	lim := &Limits{Max: []int64{10}, Total: 2}
	mustAdmit(t, z, req(lim, "a"))
	mustAdmit(t, z, req(lim, "b"))
	mustRefuse(t, z, req(lim, "c"), TotalDim)
	if got := keysIn(z, 0); got != 2 {
		t.Fatalf("keys %d after total refusal, want 2", got)
	}
}

func TestEmptyKeyIsNotLimited(t *testing.T) {
	z := NewZone(2, false, nil)
	lim := &Limits{Max: []int64{1, 1}}
	for i := range 5 {
		mustAdmit(t, z, req(lim, "", fmt.Sprint(i)))
	}
	if keysIn(z, 0) != 0 {
		t.Fatal("an empty key was counted")
	}
}

func TestPerRequestMax(t *testing.T) {
	z := NewZone(1, false, nil)
	lim := &Limits{Max: []int64{0}} // resolved per request
	r := func(max int64) *Request { return &Request{Keys: []string{"k"}, Max: []int64{max}, Limits: lim} }
	mustAdmit(t, z, r(2))
	mustAdmit(t, z, r(2))
	mustRefuse(t, z, r(2), 0)
	mustAdmit(t, z, r(3))
}

func TestReloadCarriesCountsAndLowersCap(t *testing.T) {
	z := NewZone(1, false, nil)
	old := &Limits{Max: []int64{5}}
	z.Adopt(old)
	inflight := []*Request{req(old, "k"), req(old, "k"), req(old, "k")}
	for _, r := range inflight {
		mustAdmit(t, z, r)
	}
	// Reload: the new handler lowers the cap to 2 while 3 are in flight.
	lowered := &Limits{Max: []int64{2}}
	z.Adopt(lowered)
	z.Retire(old)
	mustRefuse(t, z, req(lowered, "k"), 0)
	inflight[0].slot.Release()
	mustRefuse(t, z, req(lowered, "k"), 0) // 2 still in flight: at the cap
	inflight[1].slot.Release()
	mustAdmit(t, z, req(lowered, "k"))
}

// Sixteen goroutines take and give back slots of a zone with a client cap,
// a tenant cap and a total, each holding its slot for 1 to 5 ms of virtual
// time (a synctest bubble), so that at every instant as many requests are
// held as the caps allow: each cap is reached and none is passed, in any
// dimension. A slot held for an instant would leave the caps unreached, and
// a cap + 1 unseen.
func TestConcurrentNeverExceedsMax(t *testing.T) {
	const clientMax, tenantMax, total = 3, 5, 7
	const workers, rounds = 16, 200
	caps := map[string]int64{"client": clientMax, "tenant": tenantMax, "total": total}
	synctest.Test(t, func(t *testing.T) {
		z := NewZone(2, true, nil)
		lim := &Limits{Max: []int64{clientMax, tenantMax}, Total: total}
		// Four clients, two per tenant: a tenant's two clients could hold
		// 6 > tenantMax, both tenants 10 > total.
		var clients [4]atomic.Int64
		var tenants [2]atomic.Int64
		var all atomic.Int64
		peaks := map[string]*atomic.Int64{"client": {}, "tenant": {}, "total": {}}
		var admitted, refused atomic.Int64
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range rounds {
					c := (w + i) % len(clients)
					tn := c % len(tenants)
					r := req(lim, fmt.Sprint("c", c), fmt.Sprint("t", tn))
					if slot, _ := z.TryAcquire(r); slot == nil {
						refused.Add(1)
						time.Sleep(time.Millisecond)
						continue
					}
					admitted.Add(1)
					notePeak(peaks["client"], clients[c].Add(1))
					notePeak(peaks["tenant"], tenants[tn].Add(1))
					notePeak(peaks["total"], all.Add(1))
					time.Sleep(time.Duration(1+(7*w+i)%5) * time.Millisecond)
					clients[c].Add(-1)
					tenants[tn].Add(-1)
					all.Add(-1)
					r.slot.Release()
				}
			})
		}
		wg.Wait()
		for dim, cp := range caps {
			if p := peaks[dim].Load(); p != cp {
				t.Errorf("%s: at most %d held at once, want exactly the cap %d", dim, p, cp)
			}
		}
		if admitted.Load()+refused.Load() != workers*rounds {
			t.Errorf("admitted %d + refused %d != %d", admitted.Load(), refused.Load(), workers*rounds)
		}
		if unitsIn(z, 0)+unitsIn(z, 1)+unitsIn(z, TotalDim) != 0 || keysIn(z, 0)+keysIn(z, 1) != 0 {
			t.Error("counts not back at zero")
		}
	})
}

func TestEmptiedMapsAreReplaced(t *testing.T) {
	z := NewZone(1, false, nil)
	lim := &Limits{Max: []int64{1}}
	var held []*Request
	for i := range numShards * shrinkAt * 4 {
		r := req(lim, fmt.Sprint(i))
		mustAdmit(t, z, r)
		held = append(held, r)
	}
	for _, r := range held {
		r.slot.Release()
	}
	for i := range z.shards {
		if s := &z.shards[i]; s.more != nil || s.peak >= shrinkAt {
			t.Fatalf("shard %d kept its overflow map (peak %d) after every key left", i, s.peak)
		}
	}
	if keysIn(z, 0) != 0 {
		t.Fatal("keys left")
	}
}

func panics(f func()) (p bool) {
	defer func() { p = recover() != nil }()
	f()
	return false
}

func TestMaxKeysBoundsKeysNotRequests(t *testing.T) {
	z := NewZone(1, false, nil)
	lim := &Limits{Max: []int64{5}, MaxKeys: numShards}
	admitted := map[string]bool{}
	for i := range 2000 {
		k := fmt.Sprint("k", i)
		switch res := z.Acquire(context.Background(), req(lim, k), WaitOptions{}); res.Outcome {
		case Admitted:
			admitted[k] = true
		case KeysFull:
		default:
			t.Fatalf("key %s: outcome %d, want admitted or keys full", k, res.Outcome)
		}
	}
	if n := keysIn(z, 0); n != len(admitted) || n != numShards {
		t.Fatalf("%d keys held (%d admitted), want exactly %d", n, len(admitted), numShards)
	}
	for k := range admitted { // a key already in flight is not a new key
		mustAdmit(t, z, req(lim, k))
		break
	}
}

func TestDivisorSplitsCapsRoundingUp(t *testing.T) {
	z := NewZone(1, true, nil)
	lim := &Limits{Max: []int64{5}, Total: 3, Divisor: 2} // each instance: 3 per key, 2 in all
	mustAdmit(t, z, req(lim, "a"))
	mustAdmit(t, z, req(lim, "a"))
	mustRefuse(t, z, req(lim, "b"), TotalDim)
	perRequest := &Limits{Max: []int64{0}, Divisor: 3}
	z2 := NewZone(1, false, nil)
	r := func() *Request { return &Request{Keys: []string{"k"}, Max: []int64{4}, Limits: perRequest} }
	mustAdmit(t, z2, r())
	mustAdmit(t, z2, r())
	mustRefuse(t, z2, r(), 0) // ceil(4/3) = 2
}

// TestMaxKeysIsExact: a new key is refused exactly when MaxKeys keys are in
// flight, whatever shards they fall in, and admitted while fewer are.
func TestMaxKeysIsExact(t *testing.T) {
	for _, max := range []int64{1, 10, 1000} {
		z := NewZone(2, false, nil)
		lim := &Limits{Max: []int64{5, 1 << 20}, MaxKeys: max}
		two := func(k string) *Request {
			return &Request{Keys: []string{k, "one tenant"}, Max: []int64{0, 0}, Limits: lim}
		}
		held := make([]*Request, 0, max)
		for i := range max {
			r := two(fmt.Sprint("k", i))
			mustAdmit(t, z, r)
			held = append(held, r)
		}
		if slot, d := z.TryAcquire(two("one more")); slot != nil || d != 0 {
			t.Fatalf("max_keys %d: key %d admitted=%v (dim %d), want refused by dimension 0", max, max+1, slot != nil, d)
		}
		if res := z.Acquire(context.Background(), two("one more"), WaitOptions{}); res.Outcome != KeysFull {
			t.Fatalf("max_keys %d: outcome %d, want KeysFull", max, res.Outcome)
		}
		again := two("k0")
		mustAdmit(t, z, again) // a key in flight is not new
		held[0].slot.Release()
		again.slot.Release()
		mustAdmit(t, z, two("one more")) // a key left: room for one
	}
}

// TestMaxKeysHoldsUnderConcurrency: goroutines admitting distinct keys at
// once never get more than MaxKeys keys in flight, and a refused admission
// leaves no key counted.
func TestMaxKeysHoldsUnderConcurrency(t *testing.T) {
	const max, workers, rounds = 10, 64, 500
	z := NewZone(1, true, nil)
	lim := &Limits{Max: []int64{1}, MaxKeys: max, Total: 1000}
	var inFlight, peak atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				r := req(lim, fmt.Sprint(w, "/", i))
				if slot, _ := z.TryAcquire(r); slot == nil {
					continue
				}
				n := inFlight.Add(1)
				notePeak(&peak, n)
				runtime.Gosched() // hold the key a moment
				inFlight.Add(-1)
				r.slot.Release()
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > max {
		t.Fatalf("%d keys in flight at once, want at most %d", p, max)
	}
	if n := z.keys[0].n.Load(); n != 0 || keysIn(z, 0) != 0 {
		t.Fatalf("after every request ended: %d keys counted, %d in tables, want 0", n, keysIn(z, 0))
	}
	for i := range max { // the whole bound is free again
		mustAdmit(t, z, req(lim, fmt.Sprint("after", i)))
	}
}

// TestMaxKeysCountsKeysAlreadyInFlight: a config that adds max_keys to a
// zone with keys in flight counts them.
func TestMaxKeysCountsKeysAlreadyInFlight(t *testing.T) {
	z := NewZone(1, false, nil)
	free := &Limits{Max: []int64{5}}
	for i := range 3 {
		mustAdmit(t, z, req(free, fmt.Sprint("k", i)))
	}
	bounded := &Limits{Max: []int64{5}, MaxKeys: 4}
	k3 := req(bounded, "k3")
	mustAdmit(t, z, k3)
	if slot, _ := z.TryAcquire(req(bounded, "k4")); slot != nil {
		t.Fatal("fifth key admitted under max_keys 4 with 4 in flight")
	}
	k4 := req(free, "k4")
	mustAdmit(t, z, k4) // a config without the bound still admits
	k4.slot.Release()
	k3.slot.Release()
	mustAdmit(t, z, req(bounded, "k5"))
}

// TestMaxKeysRefusalIsNotSeen: under max_keys 2 and total 1 no more than
// one key is ever in flight, so a refusal for the key bound is always
// wrong; a new key refused by the total must not be seen by neighbours as
// a key in flight.
func TestMaxKeysRefusalIsNotSeen(t *testing.T) {
	const workers, rounds = 8, 2500
	z := NewZone(1, true, nil)
	lim := &Limits{Max: []int64{1 << 20}, MaxKeys: 2, Total: 1}
	var keysFull atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				r := req(lim, fmt.Sprint(w, "/", i))
				switch res := z.Acquire(context.Background(), r, WaitOptions{}); res.Outcome {
				case Admitted:
					runtime.Gosched() // others meet the total full
					r.slot.Release()
				case KeysFull:
					keysFull.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := keysFull.Load(); n > 0 {
		t.Fatalf("%d of %d refused for max_keys 2 with at most one key in flight", n, workers*rounds)
	}
	if unitsIn(z, TotalDim) != 0 || keysIn(z, 0) != 0 || z.keys[0].n.Load() != 0 {
		t.Fatalf("left behind: total %d keys %d counted %d", unitsIn(z, TotalDim), keysIn(z, 0), z.keys[0].n.Load())
	}
}

// TestMaxKeysWaiterNotLeftBehind: a waiter with a new key, arriving while
// newcomers with other new keys are refused (by the total; once the
// waiter waits, by the key bound, whose second key it holds as the head),
// is admitted as soon as a slot is free. One key ("h") is in flight under
// max_keys 2, so the waiter's key always fits the bound; the slot freed is
// h's, so no key leaves: a waiter filed behind the key bound would wait
// for good.
func TestMaxKeysWaiterNotLeftBehind(t *testing.T) {
	const rounds = 300
	z := NewZone(1, true, newFakeClock()) // waits never time out
	lim := &Limits{Max: []int64{1 << 20}, MaxKeys: 2, Total: 2}
	stay := req(lim, "h")
	mustAdmit(t, z, stay)
	for round := range rounds {
		second := req(lim, "h")
		mustAdmit(t, z, second) // the total is full
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for n := range 2 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if slot, d := z.TryAcquire(req(lim, fmt.Sprint("new", n, "/", i))); slot != nil || d != TotalDim && d != 0 {
						t.Errorf("newcomer: admitted %v, dimension %d; want refused by the total or the key bound", slot != nil, d)
						return
					}
				}
			})
		}
		w := enqueue(t, context.Background(), z, "waiter", req(lim, fmt.Sprint("w", round)), WaitOptions{Wait: time.Hour})
		close(stop)
		wg.Wait()
		second.slot.Release()
		select {
		case r := <-w.res:
			if r.Outcome != Admitted {
				t.Fatalf("round %d: waiter %+v, want admitted", round, r)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: the waiter still waits with a slot free (held %d of 2, keys %d of 2)", round, unitsIn(z, TotalDim), keysIn(z, 0))
		}
		w.req.slot.Release()
	}
}

// A second Release of the same admission panics, as semaphore.Weighted's
// does, and gives nothing back twice: the counts stay those of the
// requests still in flight.
func TestSecondReleasePanicsAndGivesNothingBack(t *testing.T) {
	z := NewZone(1, true, nil)
	lim := &Limits{Max: []int64{5}, Total: 10}
	a, b := req(lim, "k"), req(lim, "k")
	a.Cost, b.Cost = 3, 2
	mustAdmit(t, z, a)
	mustAdmit(t, z, b)
	a.slot.Release()
	if !panics(func() { a.slot.Release() }) {
		t.Error("a second Release returned quietly, want a panic")
	}
	if got, gotTotal := unitsOfKey(z, 0, "k"), unitsIn(z, TotalDim); got != 2 || gotTotal != 2 {
		t.Errorf("after a second Release: key holds %d units, total %d; want 2 and 2 (b's)", got, gotTotal)
	}
	b.slot.Release()
}

// TestHeldRequestsMeetEachCapExactly: requests that stay admitted fill each
// cap of a two-limit zone with a total exactly, whichever binds: the client
// key's, the tenant key's (the second dimension) and the total. A burst of
// 16 concurrent requests that can each only be refused by one of them is
// admitted up to that cap and no further, every refusal names it, and the
// counts are the admitted units in every dimension.
func TestHeldRequestsMeetEachCapExactly(t *testing.T) {
	const clientMax, tenantMax, total, burst = 3, 5, 7, 16
	lim := &Limits{Max: []int64{clientMax, tenantMax}, Total: total}
	for _, c := range []struct {
		name string
		keys func(i int) (client, tenant string)
		want int64
		dim  int
	}{
		{"client", func(i int) (string, string) { return "c", fmt.Sprint("t", i) }, clientMax, 0},
		{"tenant", func(i int) (string, string) { return fmt.Sprint("c", i), "t" }, tenantMax, 1},
		{"total", func(i int) (string, string) { return fmt.Sprint("c", i), fmt.Sprint("t", i) }, total, TotalDim},
	} {
		t.Run(c.name, func(t *testing.T) {
			z := NewZone(2, true, nil)
			var mu sync.Mutex
			var held []*Request
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range burst {
				wg.Go(func() {
					r := req(lim, "", "")
					r.Keys[0], r.Keys[1] = c.keys(i)
					<-start
					slot, d := z.TryAcquire(r)
					if slot == nil {
						if d != c.dim {
							t.Errorf("refused by dimension %d, want %d", d, c.dim)
						}
						return
					}
					mu.Lock()
					held = append(held, r)
					mu.Unlock()
				})
			}
			close(start)
			wg.Wait()
			if n := int64(len(held)); n != c.want {
				t.Fatalf("%d of %d held at once, want exactly %d", n, burst, c.want)
			}
			for _, d := range []int{0, 1, TotalDim} {
				if got := unitsIn(z, d); got != c.want {
					t.Errorf("dimension %d holds %d units, want %d", d, got, c.want)
				}
			}
			for _, r := range held {
				r.slot.Release()
			}
			if unitsIn(z, 0)+unitsIn(z, 1)+unitsIn(z, TotalDim) != 0 || keysIn(z, 0)+keysIn(z, 1) != 0 {
				t.Error("counts not back at zero")
			}
		})
	}
}
