package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// memLedger is a Ledger in memory: a cap per key of every dimension (the
// smaller of keyCap and the claim's) and a total, in units; a constraint
// that refused a waiting claim, and those it holds, refuse every later one
// of the same Take that needs them. gate, if set, holds every Take until it
// is closed.
type memLedger struct {
	mu        sync.Mutex
	keyCap    int64
	totalCap  int64
	held      map[string]int64 // by dimension/key
	total     int64
	leases    map[string]Claim
	next      int
	takes     int
	fail      bool
	gate      chan struct{}
	afterTake func()
	levels    bool   // its verdicts carry the units held (Verdict.Held)
	handOffs  []bool // what each Give was told
}

func newMemLedger(keyCap, totalCap int64) *memLedger {
	return &memLedger{keyCap: keyCap, totalCap: totalCap, held: map[string]int64{}, leases: map[string]Claim{}}
}

func memKey(d int, key string) string { return fmt.Sprint(d, "/", key) }

func (l *memLedger) Take(claims []Claim) ([]Verdict, error) {
	if l.gate != nil {
		<-l.gate
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.takes++
	if l.fail {
		return nil, errors.New("no answer")
	}
	out := make([]Verdict, len(claims))
	reserved := map[string]bool{}
	const total = "total"
	for i, c := range claims {
		u := min(c.Units, l.keyCap, l.totalCap)
		refused := TotalDim - 1
		for d, key := range c.Keys {
			if key != "" && (reserved[memKey(d, key)] || l.held[memKey(d, key)]+u > min(l.keyCap, c.Caps[d])) {
				refused = d
				break
			}
		}
		if refused < TotalDim && (reserved[total] || l.total+u > l.totalCap) {
			refused = TotalDim
		}
		if refused >= TotalDim {
			out[i] = Verdict{Outcome: Full, Dim: refused, Held: l.heldBy(c)}
			if c.Waits {
				for _, d := range append([]int{refused}, c.Hold...) {
					if d == TotalDim {
						reserved[total] = true
					} else {
						reserved[memKey(d, c.Keys[d])] = true
					}
				}
			}
			continue
		}
		c.Units = u
		for d, key := range c.Keys {
			if key != "" {
				l.held[memKey(d, key)] += u
			}
		}
		l.total += u
		l.next++
		lease := fmt.Sprint("lease", l.next)
		l.leases[lease] = c
		out[i] = Verdict{Outcome: Admitted, Lease: lease, Held: l.heldBy(c)}
	}
	if l.afterTake != nil {
		l.afterTake()
	}
	return out, nil
}

// heldBy returns, if l reports levels, the units held in each of c's
// dimensions (the total last; -1 where c has no key). mu must be held.
func (l *memLedger) heldBy(c Claim) []int64 {
	if !l.levels {
		return nil
	}
	out := make([]int64, len(c.Keys)+1)
	for d, key := range c.Keys {
		out[d] = -1
		if key != "" {
			out[d] = l.held[memKey(d, key)]
		}
	}
	out[len(c.Keys)] = l.total
	return out
}

func (l *memLedger) Correct(int, string, float64) {}

func (l *memLedger) Give(lease string, handOff bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.handOffs = append(l.handOffs, handOff)
	c, ok := l.leases[lease]
	if !ok {
		panic("memLedger: a lease given back twice")
	}
	delete(l.leases, lease)
	for d, key := range c.Keys {
		if key != "" {
			l.held[memKey(d, key)] -= c.Units
		}
	}
	l.total -= c.Units
}

func (l *memLedger) Record(c Claim) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.next++
	lease := fmt.Sprint("alone", l.next)
	l.leases[lease] = c
	for d, key := range c.Keys {
		if key != "" {
			l.held[memKey(d, key)] += c.Units
		}
	}
	l.total += c.Units
	return lease
}

func (l *memLedger) Idle() {}

// release gives r back and wakes q, as a release notice would.
func (l *memLedger) release(q *SharedQueue, r *Request) {
	q.Release(r)
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

// sharedStore is a shared queue over a ledger in memory whose total is
// total units, as the tests in cost_test.go drive it; a release wakes the
// queue, as a release notice would.
func sharedStore(total int64) store {
	l := newMemLedger(1000, total)
	q := NewSharedQueue(NewZone(1, true, nil), l, 250*time.Millisecond)
	return store{
		acquire: func(ctx context.Context, r *Request, opt WaitOptions) Result {
			res, _ := q.Acquire(ctx, r, opt)
			return res
		},
		release: func(r *Request) { l.release(q, r) },
	}
}

// TestSharedQueueBigNotStarved: a waiter of cost 10 behind a stream of
// cost-1 waiters sharing a total of 10 is admitted once the requests
// ahead of it end: the ledger refuses those behind it on the total.
func TestSharedQueueBigNotStarved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		res := bigWaiterWait(sharedStore(10))
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
		share := unitSecondShares(t, sharedStore(12))
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
		q.Release(holder)
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

// TestSharedQueueMaxKeysUnderConcurrentWaiters: under max_keys, waiters
// and newcomers of a shared queue never exceed the key bound in the zone
// or a key's cap in the ledger, and leave every count at zero; the calls
// write no field of a waiting request that the queue reads (go test -race).
func TestSharedQueueMaxKeysUnderConcurrentWaiters(t *testing.T) {
	z := NewZone(1, true, nil)
	l := newMemLedger(2, 1000)
	l.afterTake = func() { time.Sleep(100 * time.Microsecond) } // a call takes a while
	q := NewSharedQueue(z, l, 5*time.Millisecond)
	lim := &Limits{Max: []int64{2}, Total: 1000, MaxKeys: 3}
	const workers, rounds = 24, 20
	var over, admitted atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				r := costly(lim, int64(1+i%2), fmt.Sprint("key", (w+i)%4))
				res, err := q.Acquire(context.Background(), r, WaitOptions{Wait: time.Second, Class: Class(w % 3)})
				if err != nil || res.Outcome != Admitted {
					continue
				}
				admitted.Add(1)
				if z.Keys(0) > 3 {
					over.Add(1)
				}
				time.Sleep(50 * time.Microsecond)
				l.release(q, r)
			}
		})
	}
	wg.Wait()
	l.mu.Lock()
	for k, n := range l.held {
		if n != 0 {
			t.Errorf("ledger: key %s holds %d units after every release", k, n)
		}
	}
	l.mu.Unlock()
	if over.Load() != 0 || admitted.Load() == 0 || z.Keys(0) != 0 || z.Held(TotalDim) != 0 || l.totalHeld() != 0 {
		t.Fatalf("%d admissions over the key bound, %d admitted; after: %d keys, %d units in the zone, %d in the ledger; want 0 over, some admitted, all 0",
			over.Load(), admitted.Load(), z.Keys(0), z.Held(TotalDim), l.totalHeld())
	}
}

// TestSharedQueueSecondReleasePanicsAndGivesNothingBack: a second Release of
// the same admission through a shared queue panics and gives nothing back
// twice, neither in the zone nor in the ledger: both still count the
// request in flight.
func TestSharedQueueSecondReleasePanicsAndGivesNothingBack(t *testing.T) {
	z := NewZone(1, true, nil)
	l := newMemLedger(100, 100)
	q := NewSharedQueue(z, l, time.Hour)
	lim := &Limits{Max: []int64{100}, Total: 100}
	a, b := costly(lim, 3, "k"), costly(lim, 2, "k")
	for _, r := range []*Request{a, b} {
		if res, err := q.Acquire(context.Background(), r, WaitOptions{}); err != nil || res.Outcome != Admitted {
			t.Fatalf("acquire: %+v %v, want admitted", res, err)
		}
	}
	q.Release(a)
	if !panics(func() { q.Release(a) }) {
		t.Error("a second Release returned quietly, want a panic")
	}
	if key, total, ledger := z.KeyUnits(0, "k"), z.Held(TotalDim), l.totalHeld(); key != 2 || total != 2 || ledger != 2 {
		t.Errorf("after a second Release: key %d units, total %d, ledger %d; want 2, 2, 2 (b's)", key, total, ledger)
	}
	q.Release(b)
	if z.Held(TotalDim) != 0 || l.totalHeld() != 0 {
		t.Errorf("counts not back at zero: zone %d, ledger %d", z.Held(TotalDim), l.totalHeld())
	}
}

// TestSharedQueueAbortedAsGrantedGivesTheSlotBack: a waiter of a shared
// queue whose client leaves just as the ledger admits it (both have
// happened when it wakes) gives back what it was granted, in the zone and
// in the ledger. Go picks between the two at random, so 64 rounds see an
// abort of a granted waiter with a chance of 1 - 2^-64.
func TestSharedQueueAbortedAsGrantedGivesTheSlotBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := NewZone(1, true, nil)
		l := newMemLedger(100, 1)
		q := NewSharedQueue(z, l, time.Hour)
		lim := &Limits{Max: []int64{100}, Total: 1}
		aborted := 0
		for round := range 64 {
			holder := costly(lim, 1, "h")
			if res, err := q.Acquire(context.Background(), holder, WaitOptions{}); err != nil || res.Outcome != Admitted {
				t.Fatalf("round %d: holder %+v %v, want admitted", round, res, err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			waiter := costly(lim, 1, "w")
			// Runs once the waiter is queued, before it waits: the ledger
			// admits it (the queue's goroutine is idle again) and its context
			// ends, both before it looks.
			opt := WaitOptions{Wait: time.Hour, Queued: func() { l.release(q, holder); synctest.Wait(); cancel() }}
			res, err := q.Acquire(ctx, waiter, opt)
			switch {
			case err != nil:
				t.Fatalf("round %d: %v", round, err)
			case res.Outcome == Aborted:
				aborted++
			case res.Outcome == Admitted:
				l.release(q, waiter)
			default:
				t.Fatalf("round %d: outcome %d, want aborted or admitted", round, res.Outcome)
			}
			synctest.Wait()
			if z.Held(TotalDim) != 0 || l.totalHeld() != 0 || z.WaitingOutside() != 0 {
				t.Fatalf("round %d: zone holds %d, ledger %d, %d waiting after the waiter ended; want 0, 0, 0 (a slot leaked)", round, z.Held(TotalDim), l.totalHeld(), z.WaitingOutside())
			}
		}
		if aborted == 0 {
			t.Fatal("no round saw the waiter aborted as it was granted")
		}
		t.Logf("%d of 64 rounds aborted a granted waiter", aborted)
	})
}

// TestSharedQueueFairNewcomersLeaveNoState: requests of 200 distinct keys
// admitted at once under fair (the ledger charges them on its clock) leave
// no tag and no hold estimate of their keys in this process, and each
// release sends its correction to the ledger.
func TestSharedQueueFairNewcomersLeaveNoState(t *testing.T) {
	l := &correctionLedger{memLedger: newMemLedger(1000, 1000)}
	z := NewZone(1, true, nil)
	q := NewSharedQueue(z, l, time.Hour)
	limits := &Limits{Max: []int64{10}, Total: 1000}
	z.Adopt(limits)
	for i := range 200 {
		req := &Request{Keys: []string{fmt.Sprint("k", i)}, Limits: limits}
		if res, err := q.Acquire(context.Background(), req, WaitOptions{Wait: time.Minute, Fair: true}); err != nil || res.Outcome != Admitted {
			t.Fatalf("request %d: %v %v", i, res.Outcome, err)
		}
		q.Release(req)
	}
	q.mu.Lock()
	tags, holds := len(q.vclock.tags), len(q.vclock.holds)
	q.mu.Unlock()
	if tags != 0 || holds != 0 {
		t.Errorf("%d tags and %d hold estimates kept for 200 keys admitted at once, want none", tags, holds)
	}
	if n := l.corrections.Load(); n != 200 {
		t.Errorf("%d corrections sent to the ledger for 200 fair admissions, want 200", n)
	}
}

// correctionLedger counts the corrections a memLedger is sent.
type correctionLedger struct {
	*memLedger
	corrections atomic.Int64
}

func (l *correctionLedger) Correct(int, string, float64) { l.corrections.Add(1) }

// TestSharedQueueLevelsFromTheLedger: the units the ledger says are held
// reach the result with the fleet's caps (not split by Divisor): for a
// request admitted at once, one refused, and one admitted after waiting,
// whose level is that of the call that admitted it. Units held elsewhere
// in the fleet are the ledger's own.
func TestSharedQueueLevelsFromTheLedger(t *testing.T) {
	z := NewZone(1, true, nil)
	l := newMemLedger(100, 100)
	l.levels = true
	q := NewSharedQueue(z, l, time.Hour)
	lim := &Limits{Max: []int64{5}, Total: 50, Divisor: 2}
	elsewhere := func(n int64) { // another instance takes or gives back n units of k
		l.mu.Lock()
		l.held[memKey(0, "k")] += n
		l.total += n
		l.mu.Unlock()
	}
	elsewhere(3)
	a := costly(lim, 1, "k")
	res, err := q.Acquire(context.Background(), a, WaitOptions{})
	if want := (Levels{{Cap: 5, Held: 4}, {Cap: 50, Held: 4}}); err != nil || res.Outcome != Admitted || fmt.Sprint(res.Levels) != fmt.Sprint(want) {
		t.Fatalf("admitted at once: %+v %v, want levels %v", res, err, want)
	}
	b := costly(lim, 2, "k")
	res, err = q.Acquire(context.Background(), b, WaitOptions{})
	if want := (Levels{{Cap: 5, Held: 4}, {Cap: 50, Held: 4}}); err != nil || res.Outcome != Full || fmt.Sprint(res.Levels) != fmt.Sprint(want) {
		t.Fatalf("refused: %+v %v, want levels %v", res, err, want)
	}
	opt := WaitOptions{Wait: time.Hour, Queued: func() { elsewhere(-3); q.Wake() }}
	res, err = q.Acquire(context.Background(), b, opt)
	if want := (Levels{{Cap: 5, Held: 3}, {Cap: 50, Held: 3}}); err != nil || res.Outcome != Admitted || fmt.Sprint(res.Levels) != fmt.Sprint(want) {
		t.Fatalf("admitted after waiting: %+v %v, want levels %v (a's 1 and its 2)", res, err, want)
	}
	if l, ok := res.Levels.Of(TotalDim); !ok || l.Held != 3 {
		t.Errorf("Levels.Of(TotalDim) = %+v, %v; want the total's", l, ok)
	}
	q.Release(a)
	q.Release(b)
}

// TestAcquireAloneRefusesCostsOverTheShare: while the ledger cannot
// answer, a request costing more than this instance's share of a cap
// split between 3 instances (a total of 6: 2 each) is refused, not
// clamped to the share and admitted alone on every instance (9 of 6 units
// on three); one within its share is admitted, and with the cap not split
// a cost over it is still clamped and admitted alone, as with the ledger.
func TestAcquireAloneRefusesCostsOverTheShare(t *testing.T) {
	for _, tc := range []struct {
		divisor, cost int64
		want          Outcome
	}{{3, 3, Unavailable}, {3, 2, Admitted}, {1, 9, Admitted}} {
		l := newMemLedger(100, 100)
		l.fail = true
		zone := NewZone(1, true, nil)
		q := NewSharedQueue(zone, l, time.Hour)
		lim := &Limits{Max: []int64{100}, Total: 6, Divisor: tc.divisor}
		r := &Request{Keys: []string{"k"}, Max: []int64{0}, Limits: lim, Cost: tc.cost}
		res := q.AcquireAlone(context.Background(), r, WaitOptions{})
		if res.Outcome != tc.want || (res.Outcome == Unavailable && res.Dim != TotalDim) {
			t.Errorf("replicas %d, cost %d: outcome %v in dimension %d, want %v (the total's, if refused)", tc.divisor, tc.cost, res.Outcome, res.Dim, tc.want)
		}
		if res.Outcome == Admitted {
			q.Release(r)
		}
	}
}

// TestSharedQueueReleaseHandsOff: a release in a queue with waiters starts
// the call that admits the waiter it frees, with no release notice and no
// poll (an hour), and tells the ledger so (its Give may leave the release
// to that call); one without waiters tells it there is no call to wait for.
func TestSharedQueueReleaseHandsOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := NewZone(1, true, nil)
		l := newMemLedger(1, 100)
		q := NewSharedQueue(z, l, time.Hour)
		lim := &Limits{Max: []int64{1}, Total: 100}
		holder := costly(lim, 1, "k")
		if res, err := q.Acquire(context.Background(), holder, WaitOptions{}); err != nil || res.Outcome != Admitted {
			t.Fatalf("holder: %v %v", res, err)
		}
		waiter := costly(lim, 1, "k")
		done := make(chan Result)
		go func() {
			res, _ := q.Acquire(context.Background(), waiter, WaitOptions{Wait: time.Hour})
			done <- res
		}()
		synctest.Wait()
		l.mu.Lock()
		takes := l.takes
		l.mu.Unlock()
		q.Release(holder)
		synctest.Wait()
		select {
		case res := <-done:
			if res.Outcome != Admitted {
				t.Fatalf("waiter: outcome %d, want admitted", res.Outcome)
			}
		default:
			t.Fatal("the waiter was not admitted after the release: it waits for a notice or a poll")
		}
		q.Release(waiter)
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.takes != takes+1 || len(l.handOffs) != 2 || !l.handOffs[0] || l.handOffs[1] {
			t.Fatalf("%d calls after the release, Give told %v; want 1 call, [true false]", l.takes-takes, l.handOffs)
		}
		if l.total != 0 {
			t.Fatalf("%d units left held", l.total)
		}
	})
}
