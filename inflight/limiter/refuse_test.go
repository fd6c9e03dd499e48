package limiter

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// WaitOptions.Refuse is asked once, only when the request would be
// queued, with the requests already queued; true refuses it at once
// (Timeout, waited 0), taking nothing and leaving no trace in the queue.
func TestRefuseHook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := NewZone(0, true, nil)
		lim := &Limits{Total: 1}
		asked := []int64{}
		refuseAt := int64(2) // refuse once two wait
		opt := WaitOptions{Wait: time.Minute, Refuse: func(queued int64) bool {
			asked = append(asked, queued)
			return queued >= refuseAt
		}}

		// Room: admitted without asking.
		held := req(lim)
		if res := z.Acquire(context.Background(), held, opt); res.Outcome != Admitted {
			t.Fatalf("first: %v, want admitted", res.Outcome)
		}
		if len(asked) != 0 {
			t.Fatalf("Refuse asked %v for a request that fit", asked)
		}
		// Two wait (asked with 0, then 1 queued).
		done := make(chan *Request, 2)
		for range 2 {
			go func() {
				r := req(lim)
				if res := z.Acquire(context.Background(), r, opt); res.Outcome != Admitted {
					t.Errorf("waiter: %v, want admitted", res.Outcome)
				}
				done <- r
			}()
			synctest.Wait()
		}
		if waitingIn(z) != 2 {
			t.Fatalf("%d waiting, want 2", waitingIn(z))
		}
		// The third is refused at once.
		res := z.Acquire(context.Background(), req(lim), opt)
		if res.Outcome != Timeout || res.Waited != 0 || res.Dim != TotalDim {
			t.Fatalf("third: %+v, want Timeout at once by the total", res)
		}
		if want := []int64{0, 1, 2}; len(asked) != 3 || asked[0] != want[0] || asked[1] != want[1] || asked[2] != want[2] {
			t.Fatalf("Refuse asked with %v, want %v", asked, want)
		}
		if waitingIn(z) != 2 || z.pending.Load() != 2 {
			t.Fatalf("waiting %d, pending %d after the early refusal, want 2 and 2", waitingIn(z), z.pending.Load())
		}
		// The waiters are still served in turn, and the counts end at zero.
		held.slot.Release()
		(<-done).slot.Release()
		(<-done).slot.Release()
		if unitsIn(z, TotalDim) != 0 || waitingIn(z) != 0 || z.pending.Load() != 0 {
			t.Fatalf("held %d, waiting %d, pending %d, want 0", unitsIn(z, TotalDim), waitingIn(z), z.pending.Load())
		}
	})
}

// A wait bounded by a deadline (the caller passes min(wait, deadline -
// margin)) never ends in an admission after it: a slot that frees after
// the bound finds the waiter gone.
func TestBoundedWaitNotAdmittedLate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := NewZone(0, true, nil)
		lim := &Limits{Total: 1}
		held := req(lim)
		mustAdmit(t, z, held)
		const bound = 270 * time.Millisecond
		start := time.Now()
		done := make(chan Result, 1)
		go func() { done <- z.Acquire(context.Background(), req(lim), WaitOptions{Wait: bound}) }()
		time.Sleep(bound + time.Millisecond) // the slot frees just after the bound
		held.slot.Release()
		res := <-done
		if res.Outcome != Timeout || res.Waited != bound {
			t.Fatalf("%+v, want a timeout after exactly %s", res, bound)
		}
		if el := time.Since(start); el < bound {
			t.Fatalf("ended after %s", el)
		}
		if unitsIn(z, TotalDim) != 0 || waitingIn(z) != 0 {
			t.Fatalf("held %d, waiting %d, want 0 and 0", unitsIn(z, TotalDim), waitingIn(z))
		}
	})
}
