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
