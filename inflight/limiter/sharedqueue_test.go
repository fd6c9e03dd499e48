package limiter

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// memLedger is a Ledger in memory: a cap per key of dimension 0 and a
// total, in units; a constraint that refused a request refuses every later
// one of the same Take that needs it. gate, if set, holds every Take until
// it is closed.
type memLedger struct {
	mu        sync.Mutex
	keyCap    int64
	totalCap  int64
	held      map[string]int64
	total     int64
	takes     int
	fail      bool
	gate      chan struct{}
	afterTake func()
}

func newMemLedger(keyCap, totalCap int64) *memLedger {
	return &memLedger{keyCap: keyCap, totalCap: totalCap, held: map[string]int64{}}
}

func (l *memLedger) Take(reqs []*Request, waits []bool) ([]Verdict, error) {
	if l.gate != nil {
		<-l.gate
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.takes++
	if l.fail {
		return nil, errors.New("no answer")
	}
	out := make([]Verdict, len(reqs))
	refusedKey, refusedTotal := map[string]bool{}, false
	for i, r := range reqs {
		key := r.Keys[0]
		u := min(r.cost(), l.keyCap, l.totalCap)
		switch {
		case refusedKey[key] || l.held[key]+u > l.keyCap:
			refusedKey[key] = true
			out[i] = Verdict{Outcome: Full, Dim: 0}
		case refusedTotal || l.total+u > l.totalCap:
			refusedTotal = true
			out[i] = Verdict{Outcome: Full, Dim: TotalDim}
		default:
			l.held[key] += u
			l.total += u
			r.taken, r.held, r.Lease = u, true, "lease"
			out[i] = Verdict{Outcome: Admitted}
		}
	}
	if l.afterTake != nil {
		l.afterTake()
	}
	return out, nil
}

func (l *memLedger) Give(r *Request) {
	l.mu.Lock()
	l.held[r.Keys[0]] -= r.taken
	l.total -= r.taken
	l.mu.Unlock()
}

func (l *memLedger) Idle() {}

// release gives r back and wakes q, as a release notice would.
func (l *memLedger) release(q *SharedQueue, r *Request) {
	l.Give(r)
	q.Wake()
}

func (l *memLedger) totalHeld() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// TestSharedQueueOrder: waiters are admitted by the queue order (high,
// normal, low), and a newcomer goes behind them.
func TestSharedQueueOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := NewZone(1, true, nil)
		l := newMemLedger(100, 1)
		q := NewSharedQueue(z, l, time.Hour)
		lim := &Limits{Max: []int64{100}, Total: 1}
		holder := costly(lim, 1, "h")
		if res, err := q.Acquire(context.Background(), holder, WaitOptions{}); err != nil || res.Outcome != Admitted {
			t.Fatalf("holder: %v %v", res, err)
		}
		var order []string
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, c := range []Class{Low, Normal, High} {
			wg.Go(func() {
				r := costly(lim, 1, c.String())
				res, _ := q.Acquire(context.Background(), r, WaitOptions{Wait: time.Hour, Class: c})
				if res.Outcome != Admitted {
					t.Errorf("%s: outcome %d", c, res.Outcome)
					return
				}
				mu.Lock()
				order = append(order, c.String())
				mu.Unlock()
				time.Sleep(time.Second)
				l.release(q, r)
			})
			synctest.Wait()
		}
		l.release(q, holder)
		wg.Wait()
		if got := order; len(got) != 3 || got[0] != "high" || got[1] != "normal" || got[2] != "low" {
			t.Fatalf("admitted %v, want [high normal low]", got)
		}
		if z.WaitingOutside() != 0 || len(z.SharedQueues()) != 0 || l.totalHeld() != 0 {
			t.Fatalf("left behind: %d waiting outside, %d queues listed, %d units held", z.WaitingOutside(), len(z.SharedQueues()), l.totalHeld())
		}
	})
}

// TestSharedQueueBigNotStarved: a waiter of cost 10 behind a stream of
// cost-1 waiters sharing a total of 10 is admitted once the requests
// ahead of it end: the ledger refuses those behind it on the total.
func TestSharedQueueBigNotStarved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := NewZone(1, true, nil)
		l := newMemLedger(1000, 10)
		q := NewSharedQueue(z, l, 250*time.Millisecond)
		lim := &Limits{Max: []int64{1000}, Total: 10}
		ctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for c := range 20 {
			wg.Go(func() {
				for ctx.Err() == nil {
					r := costly(lim, 1, "small")
					if res, _ := q.Acquire(ctx, r, WaitOptions{Wait: time.Hour}); res.Outcome != Admitted {
						return
					}
					time.Sleep(time.Duration(900+10*c) * time.Millisecond)
					l.release(q, r)
				}
			})
		}
		time.Sleep(10 * time.Second)
		big := costly(lim, 10, "big")
		res, _ := q.Acquire(context.Background(), big, WaitOptions{Wait: time.Hour})
		if res.Outcome == Admitted {
			l.release(q, big)
		}
		stop()
		wg.Wait()
		if res.Outcome != Admitted || res.Waited > 2500*time.Millisecond {
			t.Fatalf("big request: outcome %d after %s, want admitted within about two service times", res.Outcome, res.Waited)
		}
		t.Logf("cost-10 waiter admitted after %s among 20 clients of cost 1", res.Waited)
	})
}

// TestSharedQueueFairInUnits: tenants of weights 2 and 1 whose requests
// cost 3 and 1 share 12 units in proportion to their weights in
// unit-seconds, within 5%.
func TestSharedQueueFairInUnits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := NewZone(1, true, nil)
		l := newMemLedger(1000, 12)
		q := NewSharedQueue(z, l, 250*time.Millisecond)
		lim := &Limits{Max: []int64{1000}, Total: 12}
		tenants := []struct {
			key    string
			weight float64
			cost   int64
		}{{"a", 2, 3}, {"b", 1, 1}}
		var mu sync.Mutex
		var unitSeconds [2]float64
		start := time.Now()
		var wg sync.WaitGroup
		for i, tn := range tenants {
			for range 16 {
				wg.Go(func() {
					for time.Since(start) < 2000*time.Second {
						r := costly(lim, tn.cost, tn.key)
						res, _ := q.Acquire(context.Background(), r, WaitOptions{Wait: time.Hour, Fair: true, Weight: tn.weight})
						if res.Outcome != Admitted {
							t.Errorf("outcome %d", res.Outcome)
							return
						}
						time.Sleep(time.Second)
						mu.Lock()
						unitSeconds[i] += float64(r.Units())
						mu.Unlock()
						l.release(q, r)
					}
				})
			}
		}
		wg.Wait()
		share := unitSeconds[0] / (unitSeconds[0] + unitSeconds[1])
		if math.Abs(share/(2.0/3)-1) > 0.05 {
			t.Fatalf("tenant a (weight 2, cost 3) has %.4f of the unit-seconds, want 2/3 ± 5%%", share)
		}
		t.Logf("unit-second shares %.4f / %.4f (want 2/3, 1/3)", share, 1-share)
	})
}

// TestSharedQueueLeftDuringTakeGivesBack: a waiter whose client leaves
// while a batch that admits it is in the ledger gives back what it took,
// and a waiter that times out takes nothing: the ledger is back at zero.
func TestSharedQueueLeftDuringTakeGivesBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := NewZone(1, true, nil)
		l := newMemLedger(100, 1)
		q := NewSharedQueue(z, l, time.Hour)
		lim := &Limits{Max: []int64{100}, Total: 1}
		holder := costly(lim, 1, "h")
		q.Acquire(context.Background(), holder, WaitOptions{})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan Result, 1)
		go func() {
			res, _ := q.Acquire(ctx, costly(lim, 1, "w"), WaitOptions{Wait: time.Hour})
			done <- res
		}()
		synctest.Wait()
		l.gate = make(chan struct{})
		l.Give(holder)
		q.Wake()
		synctest.Wait() // the batch is held in Take
		cancel()
		synctest.Wait()
		close(l.gate)
		if res := <-done; res.Outcome != Aborted {
			t.Fatalf("outcome %d, want aborted", res.Outcome)
		}
		synctest.Wait()
		if n := l.totalHeld(); n != 0 {
			t.Fatalf("%d units held after the waiter left", n)
		}
		l.gate = nil
		res, _ := q.Acquire(context.Background(), costly(lim, 1, "x"), WaitOptions{Wait: time.Second})
		if res.Outcome != Admitted {
			t.Fatalf("after: outcome %d, want admitted", res.Outcome)
		}
	})
}

// TestSharedQueueFailureLeavesNewcomerToCaller: a ledger that does not
// answer fails the newcomer (the caller falls back) and leaves waiters
// waiting until their wait ends, on the queue's clock.
func TestSharedQueueFailureLeavesNewcomerToCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := NewZone(1, true, nil)
		l := newMemLedger(1, 100)
		q := NewSharedQueue(z, l, 250*time.Millisecond)
		lim := &Limits{Max: []int64{1}, Total: 100}
		q.Acquire(context.Background(), costly(lim, 1, "a"), WaitOptions{})
		done := make(chan Result, 1)
		go func() {
			res, _ := q.Acquire(context.Background(), costly(lim, 1, "a"), WaitOptions{Wait: 3 * time.Second})
			done <- res
		}()
		synctest.Wait()
		l.mu.Lock()
		l.fail = true
		l.mu.Unlock()
		if _, err := q.Acquire(context.Background(), costly(lim, 1, "b"), WaitOptions{Wait: time.Second}); err == nil {
			t.Fatal("a newcomer behind waiters got no error from a ledger that fails")
		}
		start := time.Now()
		if res := <-done; res.Outcome != Timeout || time.Since(start) > 3*time.Second {
			t.Fatalf("waiter: outcome %d after %s, want a timeout at its 3s wait", res.Outcome, time.Since(start))
		}
	})
}

// TestSharedQueuesShareMaxWaitingPerKey: a zone's two shared queues (an
// old one still serving after a reload, and a new one) count one key's
// waiters together against max_waiting_per_key, and max_waiting against
// both.
func TestSharedQueuesShareMaxWaitingPerKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := NewZone(1, true, nil)
		l := newMemLedger(1, 100)
		old, cur := NewSharedQueue(z, l, time.Hour), NewSharedQueue(z, l, time.Hour)
		lim := &Limits{Max: []int64{1}, Total: 100}
		for _, k := range []string{"a", "b", "c"} { // each key's one slot held
			old.Acquire(context.Background(), costly(lim, 1, k), WaitOptions{})
		}
		opt := WaitOptions{Wait: time.Hour, MaxWaitingPerKey: 2, MaxWaiting: 3}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		for _, q := range []*SharedQueue{old, cur} {
			go q.Acquire(ctx, costly(lim, 1, "a"), opt)
			synctest.Wait()
		}
		if res, _ := cur.Acquire(ctx, costly(lim, 1, "a"), opt); res.Outcome != QueueFull {
			t.Fatalf("third waiter of key a across two queues: outcome %d, want queue_full", res.Outcome)
		}
		go cur.Acquire(ctx, costly(lim, 1, "b"), opt)
		synctest.Wait()
		if res, _ := old.Acquire(ctx, costly(lim, 1, "c"), opt); res.Outcome != QueueFull {
			t.Fatalf("fourth waiter with max_waiting 3: outcome %d, want queue_full", res.Outcome)
		}
		cancel()
		synctest.Wait()
		if z.WaitingOutside() != 0 {
			t.Fatalf("%d still counted waiting", z.WaitingOutside())
		}
	})
}
