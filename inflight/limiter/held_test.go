package limiter

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

// A request that needs two keyed caps (tenant T and client C, caps 10,
// each held by 9 requests of cost 1) is admitted within a few service
// times while small requests keep arriving for T and C: the room it was
// refused in stays held for it until both have drained. Time is the zone's
// fake clock; one round is a service time, in which the requests holding T
// (even rounds) or C (odd rounds) end and as many newcomers arrive.
func TestWaiterNeedingTwoCapsIsNotPassedForEver(t *testing.T) {
	const rounds, service = 50, time.Second
	clock := newFakeClock()
	z := NewZone(2, false, clock)
	lim := &Limits{Max: []int64{10, 10}}
	var onT, onC []*Request
	n := 0
	arrive := func(tenant, client string) *Request {
		n++
		if tenant == "" {
			tenant = fmt.Sprint("tenant", n)
		}
		if client == "" {
			client = fmt.Sprint("client", n)
		}
		r := req(lim, tenant, client)
		if ok, _ := z.TryAcquire(r); ok {
			return r
		}
		return nil
	}
	for range 9 {
		onT = append(onT, arrive("T", ""))
		onC = append(onC, arrive("", "C"))
	}
	big := costly(lim, 10, "T", "C")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := enqueue(t, ctx, z, "big", big, WaitOptions{Wait: time.Hour})

	admittedIn := -1
	for round := range rounds {
		clock.Advance(service)
		ending := &onT
		tenant, client := "T", ""
		if round%2 == 1 {
			ending, tenant, client = &onC, "", "C"
		}
		held := *ending
		*ending = nil
		for _, r := range held {
			if r != nil {
				z.Release(r)
			}
			if r := arrive(tenant, client); r != nil {
				*ending = append(*ending, r)
			}
		}
		if z.Waiting() == 0 {
			admittedIn = round + 1
			break
		}
	}
	if admittedIn < 0 {
		t.Fatalf("cost-10 request needing T and C still waits after %d service times (T holds %d, C holds %d units)",
			rounds, z.KeyUnits(0, "T"), z.KeyUnits(1, "C"))
	}
	res := <-w.res
	if res.Outcome != Admitted || admittedIn > 3 || res.Waited > 3*service {
		t.Fatalf("cost-10 request: outcome %d after %d rounds (%s), want admitted within 3 service times", res.Outcome, admittedIn, res.Waited)
	}
	t.Logf("cost-10 request needing two caps admitted after %d service times", admittedIn)
	if z.KeyUnits(0, "T") != 10 || z.KeyUnits(1, "C") != 10 {
		t.Fatalf("with it admitted: T holds %d, C %d units; want 10 and 10 (it alone)", z.KeyUnits(0, "T"), z.KeyUnits(1, "C"))
	}
}

// The same under a shared queue over a ledger in memory: each call sends
// the waiter first with the constraints it was refused by, which the
// ledger holds against the newcomers of the call.
func TestSharedWaiterNeedingTwoCapsIsNotPassedForEver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rounds, service = 50, time.Second
		z := NewZone(2, false, nil)
		l := newMemLedger(1000, 1000)
		q := NewSharedQueue(z, l, time.Hour)
		lim := &Limits{Max: []int64{10, 10}}
		var onT, onC []*Request
		n := 0
		arrive := func(tenant, client string) *Request {
			n++
			if tenant == "" {
				tenant = fmt.Sprint("tenant", n)
			}
			if client == "" {
				client = fmt.Sprint("client", n)
			}
			r := req(lim, tenant, client)
			if res, err := q.Acquire(context.Background(), r, WaitOptions{}); err == nil && res.Outcome == Admitted {
				return r
			}
			return nil
		}
		for range 9 {
			onT = append(onT, arrive("T", ""))
			onC = append(onC, arrive("", "C"))
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan Result, 1)
		big := costly(lim, 10, "T", "C")
		go func() {
			res, _ := q.Acquire(ctx, big, WaitOptions{Wait: time.Hour})
			done <- res
		}()
		synctest.Wait()
		admittedIn := -1
		for round := range rounds {
			time.Sleep(service)
			ending := &onT
			tenant, client := "T", ""
			if round%2 == 1 {
				ending, tenant, client = &onC, "", "C"
			}
			held := *ending
			*ending = nil
			for _, r := range held {
				if r != nil {
					l.release(q, r)
					synctest.Wait()
				}
				if r := arrive(tenant, client); r != nil {
					*ending = append(*ending, r)
				}
			}
			synctest.Wait()
			if q.Waiting() == 0 {
				admittedIn = round + 1
				break
			}
		}
		if admittedIn < 0 {
			t.Fatalf("cost-10 request needing T and C still waits after %d service times", rounds)
		}
		res := <-done
		if res.Outcome != Admitted || admittedIn > 3 {
			t.Fatalf("cost-10 request: outcome %d after %d rounds, want admitted within 3 service times", res.Outcome, admittedIn)
		}
		t.Logf("cost-10 request needing two caps admitted through the ledger after %d service times", admittedIn)
		q.Release(big)
		for _, r := range append(onT, onC...) {
			q.Release(r)
		}
		if l.totalHeld() != 0 || z.Held(0) != 0 || z.Held(1) != 0 {
			t.Fatalf("after every release: ledger %d units, zone %d and %d; want 0", l.totalHeld(), z.Held(0), z.Held(1))
		}
	})
}

// When aging makes another waiter the best on a constraint whose room is
// held, that waiter is served as soon as a try meets its hold: a normal
// request F holds tenant x's room while it waits for client y; a high one,
// G, that needs x arrived later; once G has overtaken F in the queue order
// and y frees, G is admitted (x is empty), and F after it, rather than
// both waiting for each other's hold.
func TestHeldRoomGoesToWhoeverBecameBest(t *testing.T) {
	clock := newFakeClock()
	z := NewZone(2, false, clock)
	lim := &Limits{Max: []int64{1, 1}}
	onX, onY := req(lim, "x", "c0"), req(lim, "t0", "y")
	mustAdmit(t, z, onX)
	mustAdmit(t, z, onY)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opt := WaitOptions{Wait: time.Hour}
	f := enqueue(t, ctx, z, "F", req(lim, "x", "y"), opt) // refused by x
	z.Release(onX)                                        // F is refused by y now, and holds x
	clock.Advance(60 * time.Second)
	opt.Class = High
	g := enqueue(t, ctx, z, "G", req(lim, "x", "c1"), opt) // refused by x's hold: F is better
	clock.Advance(40 * time.Second)                        // G has overtaken F
	z.Release(onY)                                         // serves y, then x: a release grants synchronously
	if n := z.Waiting(); n != 1 {
		t.Fatalf("after y freed, with x empty: %d waiting, want 1 (G admitted): F and G wait for each other's hold", n)
	}
	if res := <-g.res; res.Outcome != Admitted {
		t.Fatalf("G: outcome %d, want admitted", res.Outcome)
	}
	z.Release(g.req)
	if res := <-f.res; res.Outcome != Admitted {
		t.Fatalf("F: outcome %d, want admitted once G left x", res.Outcome)
	}
	z.Release(f.req)
}
