package limiter

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// queued starts an Acquire in the background once the zone has want-1
// waiters, and waits until it is queued, so arrival order is exact.
type arrival struct {
	name string
	req  *Request
	res  chan Result
}

func enqueue(t *testing.T, ctx context.Context, z *Zone, name string, r *Request, opt WaitOptions) *arrival {
	t.Helper()
	a := &arrival{name: name, req: r, res: make(chan Result, 1)}
	before := waitingIn(z)
	go func() { a.res <- z.Acquire(ctx, r, opt) }()
	waitFor(t, func() bool { return waitingIn(z) == before+1 })
	return a
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

// admissionOrder releases the holder and then each admitted waiter in turn,
// returning the names in the order they were admitted.
func admissionOrder(t *testing.T, z *Zone, holder *Request, as []*arrival) []string {
	t.Helper()
	holder.slot.Release()
	var order []string
	pending := append([]*arrival(nil), as...)
	for len(pending) > 0 {
		var next *arrival
		for next == nil {
			for i, a := range pending {
				select {
				case r := <-a.res:
					if r.Outcome != Admitted {
						t.Fatalf("%s: outcome %d, want admitted", a.name, r.Outcome)
					}
					next = a
					pending = append(pending[:i], pending[i+1:]...)
				default:
					continue
				}
				break
			}
			if next == nil {
				time.Sleep(time.Millisecond)
			}
		}
		order = append(order, next.name)
		next.req.slot.Release()
	}
	return order
}

func oneSlot() (*Zone, *Limits, *fakeClock) {
	c := newFakeClock()
	return NewZone(1, false, c), &Limits{Max: []int64{1}}, c
}

func TestPriorityOrder(t *testing.T) {
	z, lim, _ := oneSlot()
	holder := req(lim, "k")
	mustAdmit(t, z, holder)
	ctx := context.Background()
	var as []*arrival
	for _, c := range []Class{Low, Normal, High} {
		as = append(as, enqueue(t, ctx, z, c.String(), req(lim, "k"), WaitOptions{Wait: time.Hour, Class: c}))
	}
	got := fmt.Sprint(admissionOrder(t, z, holder, as))
	if got != "[high normal low]" {
		t.Fatalf("admitted %s, want [high normal low]", got)
	}
}

func TestFIFOWithinClass(t *testing.T) {
	z, lim, _ := oneSlot()
	holder := req(lim, "k")
	mustAdmit(t, z, holder)
	var as []*arrival
	for i := range 5 {
		as = append(as, enqueue(t, context.Background(), z, fmt.Sprint(i), req(lim, "k"), WaitOptions{Wait: time.Hour, Class: Normal}))
	}
	if got := fmt.Sprint(admissionOrder(t, z, holder, as)); got != "[0 1 2 3 4]" {
		t.Fatalf("admitted %s, want first come first served", got)
	}
}

func TestAgingOvertakesHigherClass(t *testing.T) {
	for _, tc := range []struct {
		waited time.Duration
		want   string
	}{
		// low scores 0.5 × (1 + w/30s); a new high scores 2.
		{10 * time.Second, "[high low]"},  // low 0.67
		{100 * time.Second, "[low high]"}, // low 2.17
	} {
		t.Run(tc.waited.String(), func(t *testing.T) {
			z, lim, clock := oneSlot()
			holder := req(lim, "k")
			mustAdmit(t, z, holder)
			low := enqueue(t, context.Background(), z, "low", req(lim, "k"), WaitOptions{Wait: time.Hour, Class: Low})
			clock.Advance(tc.waited)
			high := enqueue(t, context.Background(), z, "high", req(lim, "k"), WaitOptions{Wait: time.Hour, Class: High})
			if got := fmt.Sprint(admissionOrder(t, z, holder, []*arrival{low, high})); got != tc.want {
				t.Fatalf("admitted %s, want %s", got, tc.want)
			}
		})
	}
}

func TestNoHeadOfLineBlockingAcrossKeys(t *testing.T) {
	c := newFakeClock()
	z := NewZone(1, true, c)
	lim := &Limits{Max: []int64{1}, Total: 2}
	holdA, holdB := req(lim, "a"), req(lim, "b")
	mustAdmit(t, z, holdA)
	mustAdmit(t, z, holdB)
	// A high waiter for key a, then a low one for key b; both blocked.
	highA := enqueue(t, context.Background(), z, "highA", req(lim, "a"), WaitOptions{Wait: time.Hour, Class: High})
	lowB := enqueue(t, context.Background(), z, "lowB", req(lim, "b"), WaitOptions{Wait: time.Hour, Class: Low})
	// b frees: a is still full, so lowB must go although highA ranks higher.
	holdB.slot.Release()
	if r := <-lowB.res; r.Outcome != Admitted {
		t.Fatalf("lowB outcome %d, want admitted", r.Outcome)
	}
	if waitingIn(z) != 1 {
		t.Fatalf("waiting %d, want 1 (highA)", waitingIn(z))
	}
	holdA.slot.Release()
	if r := <-highA.res; r.Outcome != Admitted {
		t.Fatalf("highA outcome %d, want admitted", r.Outcome)
	}
}

func TestTimeout(t *testing.T) {
	z, lim, clock := oneSlot()
	mustAdmit(t, z, req(lim, "k"))
	a := enqueue(t, context.Background(), z, "a", req(lim, "k"), WaitOptions{Wait: 10 * time.Second, Class: Normal})
	waitFor(t, func() bool { return clock.timersSet() == 1 })
	clock.Advance(9999 * time.Millisecond)
	select {
	case r := <-a.res:
		t.Fatalf("ended before its wait: %+v", r)
	case <-time.After(20 * time.Millisecond):
	}
	clock.Advance(time.Millisecond)
	r := <-a.res
	if r.Outcome != Timeout || r.Dim != 0 || r.Waited != 10*time.Second {
		t.Fatalf("result %+v, want timeout on dim 0 after exactly 10s", r)
	}
	if waitingIn(z) != 0 || unitsIn(z, 0) != 1 {
		t.Fatalf("waiting %d held %d, want 0, 1", waitingIn(z), unitsIn(z, 0))
	}
}

func TestAbortLeavesQueueAndTakesNothing(t *testing.T) {
	z, lim, _ := oneSlot()
	holder := req(lim, "k")
	mustAdmit(t, z, holder)
	ctx, cancel := context.WithCancel(context.Background())
	a := enqueue(t, ctx, z, "a", req(lim, "k"), WaitOptions{Wait: time.Hour})
	cancel()
	if r := <-a.res; r.Outcome != Aborted {
		t.Fatalf("outcome %d, want aborted", r.Outcome)
	}
	if waitingIn(z) != 0 {
		t.Fatalf("waiting %d after abort", waitingIn(z))
	}
	holder.slot.Release()
	if unitsIn(z, 0) != 0 || keysIn(z, 0) != 0 {
		t.Fatalf("held %d keys %d, want 0", unitsIn(z, 0), keysIn(z, 0))
	}
}

func TestMaxWaiting(t *testing.T) {
	z, lim, _ := oneSlot()
	mustAdmit(t, z, req(lim, "k"))
	opt := WaitOptions{Wait: time.Hour, MaxWaiting: 2}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	enqueue(t, ctx, z, "1", req(lim, "k"), opt)
	enqueue(t, ctx, z, "2", req(lim, "k"), opt)
	if r := z.Acquire(ctx, req(lim, "k"), opt); r.Outcome != QueueFull {
		t.Fatalf("third waiter outcome %d, want queue full", r.Outcome)
	}
}

func TestRaisedMaxAdmitsWaiters(t *testing.T) {
	z, old, _ := oneSlot()
	z.Adopt(old)
	mustAdmit(t, z, req(old, "k"))
	as := []*arrival{
		enqueue(t, context.Background(), z, "1", req(old, "k"), WaitOptions{Wait: time.Hour}),
		enqueue(t, context.Background(), z, "2", req(old, "k"), WaitOptions{Wait: time.Hour}),
	}
	z.Adopt(&Limits{Max: []int64{3}})
	z.Retire(old) // the old handler is unloaded: its waiters adopt max 3
	for _, a := range as {
		if r := <-a.res; r.Outcome != Admitted {
			t.Fatalf("%s: outcome %d, want admitted", a.name, r.Outcome)
		}
	}
}

func TestManyConcurrentWaiters(t *testing.T) {
	const limit, workers, rounds = 2, 32, 200
	z := NewZone(1, false, nil)
	lim := &Limits{Max: []int64{limit}}
	var mu sync.Mutex
	cur, peak, admitted := 0, 0, 0
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				r := req(lim, "k")
				ctx, cancel := context.WithCancel(context.Background())
				if i%7 == 0 {
					cancel() // some give up at once
				}
				res := z.Acquire(ctx, r, WaitOptions{Wait: time.Second, Class: Class(w % 3)})
				cancel()
				if res.Outcome != Admitted {
					continue
				}
				mu.Lock()
				cur++
				admitted++
				peak = max(peak, cur)
				cur--
				mu.Unlock()
				r.slot.Release()
			}
		}()
	}
	wg.Wait()
	if peak > limit {
		t.Errorf("peak %d > max %d", peak, limit)
	}
	if admitted < workers*rounds/2 {
		t.Errorf("only %d of %d admitted", admitted, workers*rounds)
	}
	if waitingIn(z) != 0 || z.pending.Load() != 0 || unitsIn(z, 0) != 0 || keysIn(z, 0) != 0 {
		t.Errorf("left behind: waiting %d pending %d held %d keys %d", waitingIn(z), z.pending.Load(), unitsIn(z, 0), keysIn(z, 0))
	}
}

// TestQueuedHook: WaitOptions.Queued runs once for a request that queues,
// and never for one admitted or refused at once.
func TestQueuedHook(t *testing.T) {
	z, lim, _ := oneSlot()
	calls := 0
	opt := WaitOptions{Wait: time.Hour, MaxWaiting: 1, Queued: func() { calls++ }}
	holder := req(lim, "k")
	if r := z.Acquire(context.Background(), holder, opt); r.Outcome != Admitted || calls != 0 {
		t.Fatalf("admitted at once: outcome %d, hook ran %d times, want admitted and 0", r.Outcome, calls)
	}
	w := enqueue(t, context.Background(), z, "waiter", req(lim, "k"), opt)
	if r := z.Acquire(context.Background(), req(lim, "k"), opt); r.Outcome != QueueFull {
		t.Fatalf("over max_waiting: outcome %d, want queue full", r.Outcome)
	}
	holder.slot.Release()
	if r := <-w.res; r.Outcome != Admitted || calls != 1 {
		t.Fatalf("waiter: outcome %d, hook ran %d times, want admitted and 1", r.Outcome, calls)
	}
}

// TestAbortedAsGrantedGivesTheSlotBack: a waiter whose client leaves just as
// a release hands it the slot (both have happened when it wakes) gives the
// slot back, whichever it sees first: the zone is empty afterwards and the
// next request is admitted.
func TestAbortedAsGrantedGivesTheSlotBack(t *testing.T) {
	z, lim, _ := oneSlot()
	abortedAsGranted(t, z, lim)
}

// abortedAsGranted plays 64 rounds on z, whose keys have one slot under
// lim: a holder of key k admitted, then a waiter whose client leaves as
// the holder's release hands it the slot (both have happened when it
// wakes; Go picks between them at random). After each round the zone must
// be empty; some round must see the waiter aborted as it was granted (a
// chance of 1 - 2^-64).
func abortedAsGranted(t *testing.T, z *Zone, lim *Limits) {
	t.Helper()
	aborted := 0
	for round := range 64 {
		holder := req(lim, "k")
		mustAdmit(t, z, holder)
		ctx, cancel := context.WithCancel(context.Background())
		waiter := req(lim, "k")
		// Runs once the waiter is queued, before it waits: the release grants
		// it the slot and its context ends, both before it looks.
		opt := WaitOptions{Wait: time.Hour, Queued: func() { holder.slot.Release(); cancel() }}
		switch res := z.Acquire(ctx, waiter, opt); res.Outcome {
		case Aborted:
			aborted++
		case Admitted:
			waiter.slot.Release()
		default:
			t.Fatalf("round %d: outcome %d, want aborted or admitted", round, res.Outcome)
		}
		if unitsIn(z, 0) != 0 || keysIn(z, 0) != 0 || waitingIn(z) != 0 {
			t.Fatalf("round %d: held %d, keys %d, waiting %d after the waiter ended; want 0, 0, 0 (a slot leaked)", round, unitsIn(z, 0), keysIn(z, 0), waitingIn(z))
		}
	}
	if aborted == 0 {
		t.Fatal("no round saw the waiter aborted as it was granted")
	}
	t.Logf("%d of 64 rounds aborted a granted waiter", aborted)
}
