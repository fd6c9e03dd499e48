package limiter

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/internal/fleetref"
)

// TestNewcomersDoNotPileUpAsShortWaiters: requests that start waiting
// behind a short waiter of their own flow, where the fleet has no room
// for them, wait as refused, as a waiter tried at a release does (see
// pilesUp): they do not go short, counted as admitted at a turn that was
// never theirs. Piled up, they held every unit of the total this
// instance got back, one after another, while waiting for their key's
// units: in the README's tenant example over a fleet of three, one
// instance served acme alone for the whole minute, and globex got 0.32 of
// the request-seconds for 0.44.
//
// A fleet of two, a total of 9: the other instance holds 7, this one a
// and b. A request of a waits (the fleet is full); b ends, so it goes
// short for a unit of key a (the call takes 50 ms), and three more of a
// come: none of them goes short while it is (the fleet has no room for a
// second), and all are admitted once the fleet has room.
func TestNewcomersDoNotPileUpAsShortWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fl := fleetref.NewFleet()
		zones := fleetZones(t, fl, 2, 1, true)
		z, other := zones[0], zones[1]
		lim := &Limits{Max: []int64{9}, Total: 9} // a tenth of 9 is 0: no spare
		var held []*Request
		for range 7 {
			r := req(lim, "y")
			mustAdmit(t, other, r)
			held = append(held, r)
		}
		a, b := req(lim, "a"), req(lim, "b")
		mustAdmit(t, z, a)
		mustAdmit(t, z, b)
		first := req(lim, "a")
		firstDone := waitInBackground(z, first)
		fl.Set(func(f *fleetref.Fleet) { f.Latency = 50 * time.Millisecond })
		b.slot.Release() // first goes short: its call is under way
		later := make([]*Request, 3)
		var laterDone []chan Result
		for i := range later {
			later[i] = req(lim, "a")
			laterDone = append(laterDone, waitInBackground(z, later[i]))
		}
		z.mu.Lock()
		shorts := len(z.short)
		z.mu.Unlock()
		if shorts != 1 {
			t.Errorf("%d short waiters of key a, where the fleet has no room and this instance one idle unit; want 1", shorts)
		}
		if res := <-firstDone; res.Outcome != Admitted {
			t.Fatalf("the first waiter of a: outcome %d, want admitted", res.Outcome)
		}
		first.slot.Release()
		a.slot.Release()
		for _, r := range held {
			r.slot.Release()
		}
		for i, done := range laterDone {
			if res := <-done; res.Outcome != Admitted {
				t.Fatalf("a later waiter of a: outcome %d, want admitted", res.Outcome)
			}
			later[i].slot.Release()
		}
		for _, z := range zones {
			if waitingIn(z) != 0 || unitsIn(z, TotalDim) != 0 {
				t.Errorf("left behind: %d waiting, %d in flight", waitingIn(z), unitsIn(z, TotalDim))
			}
		}
	})
}
