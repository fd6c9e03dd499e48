package limiter

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/internal/fleetref"
)

// shortIndexHolds reports where a zone's index of its short waiters
// (z.short: what the asker reads them from, see nextCall) and its queue
// disagree: each queued waiter marked short is in the index, with the
// units it holds, and nothing else is.
func shortIndexHolds(z *Zone) error {
	z.mu.Lock()
	defer z.mu.Unlock()
	n := 0
	for _, first := range z.byID {
		for f := first; f != nil; f = f.collide {
			for w := f.head; w != nil; w = w.next {
				if !w.short {
					continue
				}
				n++
				if _, ok := z.short[w]; !ok {
					return fmt.Errorf("a queued waiter short of allowance is not in the index")
				}
			}
		}
	}
	if n != len(z.short) {
		return fmt.Errorf("the index lists %d waiters short of allowance, the queue has %d", len(z.short), n)
	}
	return nil
}

// checkShortIndexes checks, every 10 ms until end, that each zone's index
// of its short waiters is its queue's (shortIndexHolds). In a synctest
// bubble it runs when every other goroutine is blocked: between events.
func checkShortIndexes(t *testing.T, zones []*Zone, end time.Time) {
	for time.Now().Before(end) {
		for i, z := range zones {
			if err := shortIndexHolds(z); err != nil {
				t.Errorf("instance %d: %v", i, err)
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestShortWaiterThatLeavesIsForgotten: a waiter that leaves while short
// of allowance leaves the index of short waiters too, so the asker does
// not go on asking for it. Two instances share a cap of 2 on key k, a
// ledger 100 ms away; A and B hold a unit each, and B has a waiter. A's
// next request fits A's own count but not its allowance, and another
// instance waits: it waits at A, short, and its context ends. The index
// and the queue agree after, and nothing waits at A.
func TestShortWaiterThatLeavesIsForgotten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := fleetref.NewFleet()
		f.Latency = 100 * time.Millisecond
		zones := fleetZones(t, f, 2, 1, false)
		a, b := zones[0], zones[1]
		lim := &Limits{Max: []int64{2}}
		atA, atB := req(lim, "k"), req(lim, "k")
		mustAdmit(t, a, atA)
		mustAdmit(t, b, atB)
		bNext, bWaits := req(lim, "k"), make(chan Outcome)
		go func() { bWaits <- b.Acquire(context.Background(), bNext, WaitOptions{Wait: time.Minute}).Outcome }()
		time.Sleep(time.Second) // B's waiter reported, and announced
		ctx, cancel := context.WithCancel(context.Background())
		aWaits := make(chan Outcome)
		go func() { aWaits <- a.Acquire(ctx, req(lim, "k"), WaitOptions{Wait: time.Minute}).Outcome }()
		for i := 0; shortAt(a) == 0; i++ {
			if i == 1000 {
				t.Fatal("A's request never waited short of allowance")
			}
			time.Sleep(time.Millisecond)
		}
		cancel()
		if o := <-aWaits; o != Aborted {
			t.Errorf("the waiter whose context ended: outcome %d, want aborted", o)
		}
		if err := shortIndexHolds(a); err != nil {
			t.Fatal(err) // its want would hold B's waiter back for ever
		}
		if n := waitingIn(a); n != 0 {
			t.Errorf("%d waiting at A after its waiter left, want 0", n)
		}
		atA.slot.Release()
		atB.slot.Release()
		if o := <-bWaits; o != Admitted {
			t.Fatalf("B's waiter: outcome %d, want admitted", o)
		}
		bNext.slot.Release()
	})
}

// shortAt is how many waiters the zone's index lists as short.
func shortAt(z *Zone) int {
	z.mu.Lock()
	defer z.mu.Unlock()
	return len(z.short)
}
