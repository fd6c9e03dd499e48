package limiter

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/internal/fleetref"
)

// waitInBackground starts z.Acquire of r, waiting an hour, and returns
// where its result comes once every goroutine of the bubble is blocked.
func waitInBackground(z *Zone, r *Request) chan Result {
	done := make(chan Result, 1)
	go func() { done <- z.Acquire(context.Background(), r, WaitOptions{Wait: time.Hour}) }()
	synctest.Wait()
	return done
}

// TestFleetReleaseHandsOffWithNoCall: with a ledger whose calls take
// 100 ms, a release at an instance whose own request waits for the key
// hands the unit to it at once, within the instance's allowance, with no
// call: no virtual time passes.
func TestFleetReleaseHandsOffWithNoCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := fleetref.NewFleet()
		f.Latency = 100 * time.Millisecond
		z := fleetZones(t, f, 1, 1, false)[0]
		lim := &Limits{Max: []int64{1}}
		holder := req(lim, "k")
		mustAdmit(t, z, holder)
		waiter := req(lim, "k")
		done := waitInBackground(z, waiter)
		time.Sleep(time.Second) // the fleet refused it; its calls are over
		released := time.Now()
		holder.slot.Release()
		res := <-done
		if res.Outcome != Admitted {
			t.Fatalf("waiter: outcome %d, want admitted", res.Outcome)
		}
		if took := time.Since(released); took != 0 {
			t.Fatalf("the waiter was admitted %v after the release at its own instance, want at once (no call)", took)
		}
		waiter.slot.Release()
	})
}

// TestFleetWaiterWokenByAnotherInstancesRelease: a request waiting at
// one instance is admitted as soon as the request holding the key's one
// unit at another ends (its write back announces room), not at a poll:
// no virtual time passes.
func TestFleetWaiterWokenByAnotherInstancesRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		zones := fleetZones(t, fleetref.NewFleet(), 2, 1, false)
		lim := &Limits{Max: []int64{1}}
		holder := req(lim, "k")
		mustAdmit(t, zones[0], holder)
		waiter := req(lim, "k")
		done := waitInBackground(zones[1], waiter)
		time.Sleep(time.Second / 10)
		released := time.Now()
		holder.slot.Release()
		res := <-done
		if res.Outcome != Admitted {
			t.Fatalf("waiter: outcome %d, want admitted", res.Outcome)
		}
		if took := time.Since(released); took != 0 {
			t.Fatalf("the waiter was admitted %v after the release at the other instance, want at once (a poll is %v)", took, fleetPoll)
		}
		waiter.slot.Release()
	})
}

// TestFleetAbortedAsGrantedGivesTheSlotBack: with a ledger, a waiter
// whose client leaves just as a release at its instance hands it the
// unit gives it back, whichever it sees first (see abortedAsGranted):
// the zone is empty afterwards, and once its allowance went unused for
// keepUnused the fleet counts nothing.
func TestFleetAbortedAsGrantedGivesTheSlotBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := fleetref.NewFleet()
		abortedAsGranted(t, fleetZones(t, f, 1, 1, false)[0], &Limits{Max: []int64{1}})
		time.Sleep(keepUnused + 2*linger)
		if n := f.Level(setName(0, "k")); n != 0 {
			t.Fatalf("the fleet counts %d units of k once every request ended, want 0", n)
		}
	})
}

// TestFleetSecondReleasePanicsAndGivesNothingBack: with a ledger, a
// second Release of the same admission panics and gives nothing back
// twice: the zone still counts the request in flight, and the fleet at
// least that.
func TestFleetSecondReleasePanicsAndGivesNothingBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := fleetref.NewFleet()
		z := fleetZones(t, f, 1, 1, true)[0]
		lim := &Limits{Max: []int64{5}, Total: 10}
		a, b := costly(lim, 3, "k"), costly(lim, 2, "k")
		for _, r := range []*Request{a, b} {
			mustAdmit(t, z, r)
		}
		a.slot.Release()
		if !panics(func() { a.slot.Release() }) {
			t.Error("a second Release returned quietly, want a panic")
		}
		time.Sleep(3 * linger)
		if key, total := unitsOfKey(z, 0, "k"), unitsIn(z, TotalDim); key != 2 || total != 2 {
			t.Errorf("after a second Release: key holds %d units, total %d; want 2 and 2 (b's)", key, total)
		}
		if key, total := f.Level(setName(0, "k")), f.Level(totalSet); key < 2 || total < 2 {
			t.Errorf("after a second Release: the fleet counts %d units of the key, %d of the total; want at least b's 2", key, total)
		}
		b.slot.Release()
	})
}

// TestFleetRoomGoesToTheInstanceOwedIt: units one instance writes back
// go to the request that waits for them at another (a cost of 2 on a
// cap of 4), not to a request that arrives later at the instance that
// wrote them back and asks in the same call: the waiter's report holds
// the room it is owed. Calls take 100 ms; the newcomer and the write
// back meet in one call by arriving while another call is under way.
func TestFleetRoomGoesToTheInstanceOwedIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { roomGoesToTheWaiter(t, 0) })
}

// TestFleetRoomGoesToTheWaiterThatLacksIt is
// TestFleetRoomGoesToTheInstanceOwedIt with the waiter (a cost of 3 on a
// cap of 4) holding one idle unit already at its instance: its report
// holds the 2 units it lacks, so the 2 written back elsewhere go to it,
// not to a newcomer there. (Were the report to hold its whole cost, 3,
// it would be owed nothing: its target, 3, less the unit it holds, is
// short of 3.)
func TestFleetRoomGoesToTheWaiterThatLacksIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { roomGoesToTheWaiter(t, 1) })
}

// roomGoesToTheWaiter: on a cap of 4, one instance holds 4 - idle units
// and the other idle ones (it admits them, and its waiter of cost 2 +
// idle waits for them to end there); the first writes back 2 while a
// newcomer there asks in the same call.
func roomGoesToTheWaiter(t *testing.T, idle int) {
	f := fleetref.NewFleet()
	f.Latency = 100 * time.Millisecond
	zones := fleetZones(t, f, 2, 1, false)
	here, there := zones[0], zones[1]
	lim := &Limits{Max: []int64{4}}
	var held, mine []*Request
	for i := range 4 {
		r := req(lim, "k")
		if i < 4-idle {
			mustAdmit(t, here, r)
			held = append(held, r)
		} else {
			mustAdmit(t, there, r)
			mine = append(mine, r)
		}
	}
	big := costly(lim, int64(2+idle), "k")
	waiting := waitInBackground(there, big)
	time.Sleep(time.Second) // refused, it reports; the first instance hears it
	for _, r := range mine {
		r.slot.Release() // kept idle for big, which lacks 2 now
	}
	time.Sleep(time.Second) // its report says so
	o := req(lim, "o")
	other := make(chan Result, 1)
	go func() { other <- here.Acquire(context.Background(), o, WaitOptions{}) }()
	synctest.Wait() // a call is under way
	held[0].slot.Release()
	held[1].slot.Release()
	late := req(lim, "k")
	newcomer := make(chan Result, 1)
	go func() { newcomer <- here.Acquire(context.Background(), late, WaitOptions{}) }()
	if res := <-newcomer; res.Outcome == Admitted {
		late.slot.Release()
		t.Error("a newcomer at the instance that wrote back 2 units was admitted, before the request waiting for them elsewhere")
	}
	if res := <-waiting; res.Outcome != Admitted {
		t.Fatalf("the waiter of cost %d: outcome %d, want admitted", 2+idle, res.Outcome)
	}
	big.slot.Release()
	for _, r := range held[2:] {
		r.slot.Release()
	}
	if res := <-other; res.Outcome != Admitted {
		t.Fatalf("the request of key o: outcome %d, want admitted", res.Outcome)
	}
	o.slot.Release()
}
