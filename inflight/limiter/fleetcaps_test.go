package limiter

import (
	"context"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/internal/fleetref"
)

// TestFleetHeldRequestsMeetEachCapExactly: two instances of one fleet
// take turns admitting requests that stay admitted and do not wait, each
// within the allowances its ledger grants: the client key's cap, the
// tenant key's and the total are each met exactly over the fleet, the
// next request at either instance is refused by that cap, and once all
// ended the fleet counts nothing. The caps that do not bind are far
// (100), so that each instance keeps idle allowance there and asks only
// for the one that binds.
func TestFleetHeldRequestsMeetEachCapExactly(t *testing.T) {
	for _, c := range []struct {
		name string
		lim  *Limits
		want int64
		dim  int
	}{
		{"client", &Limits{Max: []int64{3, 100}, Total: 100}, 3, 0},
		{"tenant", &Limits{Max: []int64{100, 5}, Total: 100}, 5, 1},
		{"total", &Limits{Max: []int64{100, 100}, Total: 7}, 7, TotalDim},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := fleetref.NewFleet()
				zones := fleetZones(t, f, 2, 2, true)
				var held []*Request
				for i := range 12 {
					z := zones[i%2]
					r := req(c.lim, "c", "t")
					res := z.Acquire(context.Background(), r, WaitOptions{})
					if res.Outcome != Admitted {
						if res.Outcome != Full || res.Dim != c.dim {
							t.Fatalf("request %d at instance %d: outcome %d by dimension %d, want full by %d", i, i%2, res.Outcome, res.Dim, c.dim)
						}
						continue
					}
					held = append(held, r)
				}
				if n := int64(len(held)); n != c.want {
					t.Fatalf("%d of 12 held at once over the fleet, want exactly %d", n, c.want)
				}
				for _, d := range []int{0, 1, TotalDim} {
					if got := unitsIn(zones[0], d) + unitsIn(zones[1], d); got != c.want {
						t.Errorf("dimension %d holds %d units over the fleet, want %d", d, got, c.want)
					}
				}
				for _, r := range held {
					r.slot.Release()
				}
				time.Sleep(keepUnused + 2*linger) // idle allowance goes back
				for _, name := range []string{setName(0, "c"), setName(1, "t"), totalSet} {
					if n := f.Level(name); n != 0 {
						t.Errorf("after every release the fleet counts %d units in %s, want 0", n, name)
					}
				}
			})
		})
	}
}

// spareAtOne sets up a fleet of two instances under a key cap of 10 (a
// reserve of 1) where the first holds 2 requests of key k and keeps one
// unit idle, granted ahead as spare: the fleet counts 3. They end with t.
func spareAtOne(t *testing.T) (f *fleetref.Fleet, zones []*Zone, lim *Limits) {
	f = fleetref.NewFleet()
	zones = fleetZones(t, f, 2, 1, false)
	lim = &Limits{Max: []int64{10}}
	for range 2 {
		r := req(lim, "k")
		mustAdmit(t, zones[0], r)
		t.Cleanup(func() { r.slot.Release() })
	}
	time.Sleep(2 * linger) // what it keeps idle is what it keeps
	if n := f.Level(setName(0, "k")); n != 3 {
		t.Fatalf("the fleet counts %d units of k with 2 in flight, want 3: one idle, the reserve", n)
	}
	return f, zones, lim
}

// TestFleetSpareStaysWithinTheReserve: an instance keeps idle at most a
// tenth of a cap (the reserve), so a request at another instance that
// does not wait is admitted while the fleet's units in flight plus its
// cost are within the cap less the reserve (2 + 7 of 10); the levels it
// is told count the units in flight (9), not the idle one.
func TestFleetSpareStaysWithinTheReserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, zones, lim := spareAtOne(t)
		seven := costly(lim, 7, "k")
		res := zones[1].Acquire(context.Background(), seven, WaitOptions{})
		if res.Outcome != Admitted {
			t.Fatalf("cost 7 at the second instance, 2 in flight of 10: outcome %d, want admitted (the idle unit is the reserve)", res.Outcome)
		}
		defer seven.slot.Release()
		if l, ok := res.Levels.Of(0); !ok || l.InFlight != 9 || l.Cap != 10 {
			t.Fatalf("its levels: %+v (known %v), want 9 held of 10: the units in flight, not the idle one", l, ok)
		}
	})
}

// TestFleetIdleGoesBackWhenAnotherWaits: an instance that keeps a unit
// idle gives it back as soon as another instance's request waits for it:
// a request of cost 8 at the second instance, refused while the first
// keeps 3 of 10, is admitted at once, with no time passing (not at the
// first instance's linger, nor at a poll). It comes half a linger after
// the first instance's last sweep, so that only the notice can make that
// instance give back (a sweep due at the same moment let it pass now and
// then without one).
func TestFleetIdleGoesBackWhenAnotherWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, zones, lim := spareAtOne(t)
		time.Sleep(linger / 2)
		big := costly(lim, 8, "k")
		done := make(chan Result, 1)
		go func() { done <- zones[1].Acquire(context.Background(), big, WaitOptions{Wait: time.Hour}) }()
		synctest.Wait()
		select {
		case res := <-done:
			if res.Outcome != Admitted {
				t.Fatalf("cost 8 with 2 of 10 in flight elsewhere: outcome %d, want admitted", res.Outcome)
			}
		default:
			zones[0].Close() // its idle unit goes back, so that the waiter ends
			<-done
			big.slot.Release()
			t.Fatal("cost 8 with 2 of 10 in flight elsewhere still waits: the other instance kept its idle unit")
		}
		big.slot.Release()
	})
}

// TestKeyUsedLatelyAsksAhead: a key that comes back within keepUnused,
// after its units went back, asks for room ahead and is admitted from it
// from then on; the entry that says it was used lately is kept that long,
// though it holds nothing. 20 requests of 10 ms, 300 ms apart, under a cap
// of 1,000 make at most 6 calls (a request each once the entry is
// forgotten: 40), and the fleet counts nothing once the key is unused.
func TestKeyUsedLatelyAsksAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := fleetref.NewFleet()
		m := f.Join()
		z := NewZone(1, false, nil)
		z.SetLedger(m)
		t.Cleanup(func() { closeZone(t, z) })
		lim := &Limits{Max: []int64{1000}}
		for range 20 {
			r := req(lim, "k")
			mustAdmit(t, z, r)
			time.Sleep(10 * time.Millisecond)
			r.slot.Release()
			time.Sleep(290 * time.Millisecond)
		}
		calls := m.Calls()
		t.Logf("20 requests, 300 ms apart: %d calls", calls)
		if calls > 6 {
			t.Errorf("20 requests of one key 300 ms apart made %d calls, want at most 6", calls)
		}
		time.Sleep(keepUnused + 2*linger)
		if n := f.Level(setName(0, "k")); n != 0 {
			t.Errorf("once the key is unused the fleet counts %d units of it, want 0", n)
		}
	})
}

// TestColdKeyGoesBackInTheNextCall: a key used once holds no allowance
// beyond its request (docs/performance.md, the million keys): the call
// that admits the next request gives its unit back, so the fleet counts
// the keys in flight, not those of the last second; and the last one
// goes back with no request to carry it.
func TestColdKeyGoesBackInTheNextCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := fleetref.NewFleet()
		z := NewZone(1, false, nil)
		z.SetLedger(f.Join())
		t.Cleanup(func() { closeZone(t, z) })
		lim := &Limits{Max: []int64{1000}}
		key := func(i int) string { return "k" + strconv.Itoa(i) }
		for i := range 200 {
			r := req(lim, key(i))
			mustAdmit(t, z, r)
			if i > 0 {
				if n := f.Level(setName(0, key(i-1))); n != 0 {
					t.Fatalf("request %d admitted: the fleet counts %d units of the key used once before it, want 0", i, n)
				}
			}
			time.Sleep(time.Millisecond)
			r.slot.Release()
		}
		time.Sleep(linger)
		if n := f.Level(setName(0, key(199))); n != 0 {
			t.Errorf("%v after the last key's request ended the fleet counts %d units of it, want 0", linger, n)
		}
	})
}

// TestFleetMixedCapsHoldToTheHighest: two handlers of one zone cap one
// key at 2 and at 4, at two instances. A request capped at 2 waits while
// the fleet holds 4; when the one request of its instance ends, the
// release hands it the unit with no call, and it is held to the highest
// cap the fleet granted the key's units under (4), not to its own: the
// limit docs/fleet-guarantees.md states. Never beyond the highest.
func TestFleetMixedCapsHoldToTheHighest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := fleetref.NewFleet()
		zones := fleetZones(t, f, 2, 1, false)
		wide, narrow := &Limits{Max: []int64{4}}, &Limits{Max: []int64{2}}
		first := req(narrow, "k")
		mustAdmit(t, zones[1], first)
		held := []*Request{first}
		for range 3 {
			r := req(wide, "k")
			mustAdmit(t, zones[0], r)
			held = append(held, r)
		}
		mustRefuse(t, zones[0], req(wide, "k"), 0)
		waiting := req(narrow, "k")
		done := make(chan Result, 1)
		go func() { done <- zones[1].Acquire(context.Background(), waiting, WaitOptions{Wait: time.Minute}) }()
		synctest.Wait()
		first.slot.Release()
		held = held[1:]
		synctest.Wait()
		inFlight := func() int64 { return unitsIn(zones[0], 0) + unitsIn(zones[1], 0) }
		select {
		case res := <-done:
			if res.Outcome != Admitted {
				t.Fatalf("the waiter capped at 2: outcome %d, want admitted by the hand-off", res.Outcome)
			}
			held = append(held, waiting)
		default:
			t.Fatalf("the waiter capped at 2 still waits with %d units in flight: the limit the docs state is gone (update them)", inFlight())
		}
		if n := inFlight(); n != 4 {
			t.Errorf("%d units in flight over the fleet, want 4: the highest cap, met", n)
		}
		if res := zones[0].Acquire(context.Background(), req(wide, "k"), WaitOptions{}); res.Outcome != Full {
			t.Errorf("a request capped at 4 with 4 in flight: outcome %d, want full", res.Outcome)
		}
		for _, r := range held {
			r.slot.Release()
		}
	})
}
