package limiter

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/internal/fleetref"
)

// sharedStore is a zone that admits within allowances of a fleet's ledger
// in memory (the reference's), the only member; it is closed when t ends.
func sharedStore(t *testing.T) store {
	z := NewZone(1, true, nil)
	z.SetLedger(fleetref.NewFleet().Join())
	t.Cleanup(func() { closeZone(t, z) })
	return store{acquire: z.Acquire, release: func(r *Request) { r.slot.Release() }}
}

// closeZone closes z and waits for its asker to end (its calls under way,
// the allowance it gives back), so that a synctest bubble can end. An
// asker still running a minute later means a unit leaked (a request
// still counted in flight): t fails, and the zone forgets its
// allowances, so that the asker and the bubble end rather than renew
// them until the test times out.
func closeZone(t testing.TB, z *Zone) {
	z.Close()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		z.mu.Lock()
		running := z.asks.running
		if running && !time.Now().Before(deadline) {
			t.Errorf("a minute after Close the zone still holds allowance: key units %d, total %d in flight", unitsIn(z, 0), unitsIn(z, TotalDim))
			z.forgetAllowances()
			deadline = deadline.Add(time.Hour)
		}
		z.mu.Unlock()
		if !running {
			return
		}
	}
}

// forgetAllowances drops every allowance z holds and all it has to
// write, for closeZone. mu must be held.
func (z *Zone) forgetAllowances() {
	z.totalAllow.units.Store(0)
	z.totalAllow.spare.Store(0)
	for i := range z.shards {
		s := &z.shards[i]
		s.mu.Lock()
		s.allow = nil
		s.mu.Unlock()
	}
	clear(z.asks.dirty)
	clear(z.asks.unsure)
	clear(z.asks.reports)
	z.asks.rewrite = nil
	z.startAsking()
}

// TestWaiterFullInItsShareWhileTheLedgerFails: while the ledger cannot
// answer (on_error open), a waiter whose instance's share of the cap is
// full goes on waiting, asked for again at each poll, and times out at
// its wait; everything comes back once it is gone.
func TestWaiterFullInItsShareWhileTheLedgerFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fl := fleetref.NewFleet()
		z := NewZone(1, false, nil)
		z.SetLedger(fl.Join())
		t.Cleanup(func() { closeZone(t, z) })
		lim := &Limits{Max: []int64{4}, Divisor: 2} // this instance's share: 2
		first, second := req(lim, "k"), req(lim, "k")
		for _, r := range []*Request{first, second} {
			if res := z.Acquire(context.Background(), r, WaitOptions{}); res.Outcome != Admitted {
				t.Fatalf("while the ledger answers: outcome %d, want admitted", res.Outcome)
			}
		}
		fl.Set(func(f *fleetref.Fleet) { f.Fail = true })
		res := z.Acquire(context.Background(), req(lim, "k"), WaitOptions{Wait: 2 * time.Second})
		if res.Outcome != Timeout {
			t.Fatalf("a waiter over its share while the ledger fails: outcome %d, want timed out (%d)", res.Outcome, Timeout)
		}
		fl.Recover() // so that the asker can give back what it holds, and end
		first.slot.Release()
		second.slot.Release()
		if got := unitsIn(z, 0); got != 0 || waitingIn(z) != 0 {
			t.Fatalf("afterwards %d units held, %d waiting; want none", got, waitingIn(z))
		}
	})
}

// TestEarlyRefusalWithALedger: with a ledger as without, a request that
// would wait where early refusal says it cannot be served in time is
// refused at once (timed out, having waited nothing), not left to wait
// out its wait: at the instance whose own request holds the key, and at
// another, which the fleet refused.
func TestEarlyRefusalWithALedger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		zones := fleetZones(t, fleetref.NewFleet(), 2, 1, false)
		lim := &Limits{Max: []int64{1}}
		holder := req(lim, "k")
		mustAdmit(t, zones[0], holder)
		defer holder.slot.Release()
		for i, z := range zones {
			asked := false
			opt := WaitOptions{Wait: 10 * time.Second, Refuse: func(int64) bool { asked = true; return true }}
			res := z.Acquire(context.Background(), req(lim, "k"), opt)
			if res.Outcome != Timeout || res.Waited != 0 || !asked {
				t.Errorf("at instance %d: outcome %d after %v (early refusal asked: %v), want timed out at once", i, res.Outcome, res.Waited, asked)
			}
		}
	})
}

// TestAllowancesLapseWithoutAnAnswer: an instance keeps admitting within
// the idle allowance it holds while the ledger cannot answer, with no
// call, but only while the ledger still counts it: once a lease has
// passed with no answer (the ledger forgets allowances a lease after
// they were written, and may grant those units elsewhere), a request
// beyond what is in flight is decided as the ledger fails (closed:
// refused, Unavailable), not admitted within the lapsed allowance.
func TestAllowancesLapseWithoutAnAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fl := fleetref.NewFleet()
		fl.Set(func(f *fleetref.Fleet) { f.Closed = true })
		z := NewZone(1, false, nil)
		z.SetLedger(fl.Join())
		t.Cleanup(func() { closeZone(t, z) })
		lim := &Limits{Max: []int64{100}}
		var held []*Request
		for range 4 { // a key used again and again: it is granted room ahead (spare)
			r := req(lim, "k")
			mustAdmit(t, z, r)
			held = append(held, r)
		}
		for _, r := range held {
			r.slot.Release()
		}
		synctest.Wait()
		if z.stateOf(Set{Dim: 0, Hash: z.hash(req(lim, "k"), 0)}).idle() == 0 {
			t.Fatal("no idle allowance kept after four requests of one key: the test needs some")
		}
		fl.Set(func(f *fleetref.Fleet) { f.Fail = true })
		failed := time.Now()
		lease := z.ledger.Lease()
		var last Outcome
		for time.Since(failed) < lease+time.Second { // used again and again, so never idle for long
			r := req(lim, "k")
			res := z.Acquire(context.Background(), r, WaitOptions{})
			if res.Outcome == Admitted {
				r.slot.Release()
			}
			if time.Since(failed) < lease/3 && res.Outcome != Admitted {
				t.Fatalf("within the idle allowance, %v after the ledger failed: outcome %d, want admitted", time.Since(failed), res.Outcome)
			}
			last = res.Outcome
			time.Sleep(20 * time.Millisecond)
		}
		if last != Unavailable {
			t.Fatalf("a lease after the ledger last answered: outcome %d, want refused as the ledger fails closed (%d)", last, Unavailable)
		}
		fl.Recover()
	})
}
