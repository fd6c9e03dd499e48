package limiter

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestFairPartInTheFleetMovesTheLead: a key's weight here is scaled by its
// part of its demand in the fleet (see reshare). A visitor is granted the
// one slot while its part is 0.01 and holds it 2 s: charged at the grant
// for the zone's 1 s hold time, it leads the home tenant's key by about
// 100 s of virtual time, and its Release corrects the charge by the
// second more it held. A table read while it holds the slot gives it a
// part of 1: its next request is then served within two of the home
// tenant's 1-second requests, as a key of weight 1 that held two
// slot-seconds would be. Where its part stays 0.01 it waits as long as
// its lead says (over 100 s). Without the move, of its lead and of its
// correction, a key that came to wait here mostly, as its demand moved,
// waited minutes for a lead it earned as a visitor.
func TestFairPartInTheFleetMovesTheLead(t *testing.T) {
	for _, tc := range []struct {
		part     float64 // the visitor's part once its first request ends
		min, max time.Duration
	}{
		{part: 1, max: 2100 * time.Millisecond},
		{part: 0.01, min: 100 * time.Second, max: time.Hour},
	} {
		t.Run(fmt.Sprint("part=", tc.part), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				z := NewZone(1, true, nil)
				lim := &Limits{Max: []int64{1000}, Total: 1}
				opt := WaitOptions{Wait: time.Hour, Fair: true}
				visitor := z.keyOf(req(lim, "visitor"), 0)
				reshare := func(part float64) {
					z.mu.Lock()
					if z.vclock.reshare(visitor, part) {
						z.moveBack(visitor)
					}
					z.mu.Unlock()
				}
				done := make(chan struct{})
				var wg sync.WaitGroup
				for range 4 {
					wg.Go(func() {
						for {
							select {
							case <-done:
								return
							default:
							}
							r := req(lim, "home")
							if res := z.Acquire(context.Background(), r, opt); res.Outcome != Admitted {
								t.Errorf("home: outcome %d", res.Outcome)
								return
							}
							time.Sleep(time.Second)
							r.slot.Release()
						}
					})
				}
				time.Sleep(5500 * time.Millisecond) // the zone learns the hold time
				reshare(0.01)
				r := req(lim, "visitor")
				if res := z.Acquire(context.Background(), r, opt); res.Outcome != Admitted {
					t.Fatalf("visitor: outcome %d", res.Outcome)
				}
				time.Sleep(time.Second)
				reshare(tc.part) // a table read while it holds its slot
				time.Sleep(time.Second)
				r.slot.Release()
				r = req(lim, "visitor")
				res := z.Acquire(context.Background(), r, opt)
				if res.Outcome != Admitted || res.Waited < tc.min || res.Waited > tc.max {
					t.Errorf("the visitor's second request: outcome %d after %s, want admitted after %s to %s", res.Outcome, res.Waited, tc.min, tc.max)
				}
				t.Logf("at a part of %g the visitor's second request waited %s", tc.part, res.Waited)
				r.slot.Release()
				close(done)
				wg.Wait()
				if waitingIn(z) != 0 || unitsIn(z, TotalDim) != 0 {
					t.Fatalf("left behind: waiting %d, total %d", waitingIn(z), unitsIn(z, TotalDim))
				}
			})
		})
	}
}
