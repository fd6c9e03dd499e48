package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// costly is a request of key with a cost.
func costly(limits *limiter.Limits, key string, cost int64) *limiter.Request {
	req := request(limits, key)
	req.Cost = cost
	return req
}

// unitsBySet returns the units each lease set under the store's prefix
// holds, as Redis counts them (see countersLua): its leases plus the units
// they carry beyond one. A set's count with no lease left is an entry too.
func unitsBySet(t testing.TB, cli *redis.Client, prefix string) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	keys, err := cli.Keys(ctx, prefix+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, k := range keys {
		if cli.Type(ctx, k).Val() != "zset" || !isLeaseSet(k) {
			continue
		}
		n := cli.ZCard(ctx, k).Val()
		if score, err := cli.ZScore(ctx, k, countMember).Result(); err == nil {
			n += -int64(score) - 1 // the count is no lease; its score is minus the units beyond one
		}
		out[k] = n
	}
	return out
}

// nothingLeft reports whether Redis holds no lease set under prefix (no
// lease, no count): every unit given back.
func nothingLeft(t testing.TB, cli *redis.Client, prefix string) bool {
	return len(unitsBySet(t, cli, prefix)) == 0
}

// secondInstance returns a store with options of its own: another book,
// another instance in the fleet.
func secondInstance(t testing.TB, addr string) *Store {
	return newStore(t, store(addr, func(s *Store) { s.Timeout = caddy.Duration(3 * time.Second) }))
}

// Requests of mixed costs from two instances share one cap in Redis: the
// units a backend sees in flight never exceed it, and every unit comes
// back.
func TestMixedCostsShareOneCap(t *testing.T) {
	addr, cli := startRedis(t)
	const limit = 10
	limits := &limiter.Limits{Max: []int64{limit}}
	a, _ := zoneOf(newStore(t, store(addr, nil)), "mixed", limits)
	b, _ := zoneOf(secondInstance(t, addr), "mixed", limits)
	var inFlight, most, admitted, big atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		z := []limiter.Store{a, b}[g%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				cost := []int64{1, 3, 4, 7}[(g+i)%4]
				req := costly(limits, "k", cost)
				if z.Acquire(context.Background(), req, limiter.WaitOptions{}).Outcome != limiter.Admitted {
					continue
				}
				n := inFlight.Add(cost) // the backend's count
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				admitted.Add(1)
				if cost > 1 {
					big.Add(1)
				}
				time.Sleep(time.Millisecond)
				inFlight.Add(-cost)
				z.Release(req)
			}
		}()
	}
	wg.Wait()
	if m := most.Load(); m > limit {
		t.Fatalf("the backend saw %d units in flight, cap %d", m, limit)
	}
	if admitted.Load() == 0 || big.Load() == 0 {
		t.Fatalf("%d admitted, %d of them costing more than 1: the test proves nothing", admitted.Load(), big.Load())
	}
	eventually(t, "every lease and unit given back", func() bool { return nothingLeft(t, cli, "t") })
}

// A cost above a cap is clamped to it: the request is admitted alone when
// the cap is free, takes the whole cap, and gives it all back.
func TestCostAboveCapAdmittedAlone(t *testing.T) {
	addr, cli := startRedis(t)
	s := newStore(t, store(addr, nil))
	limits := &limiter.Limits{Max: []int64{5}, Total: 3}
	z, local := zoneOf(s, "big", limits)
	huge := costly(limits, "k", 50)
	mustAdmit(t, z, huge, "a cost of 50 under caps 5 and 3")
	if u := huge.Units(); u != 3 {
		t.Fatalf("units taken %d, want 3 (the smallest cap)", u)
	}
	if n := local.Held(limiter.TotalDim); n != 3 {
		t.Fatalf("local total %d, want 3", n)
	}
	if got := unitsBySet(t, cli, "t"); len(got) != 2 || sum(got) != 6 {
		t.Fatalf("units in Redis %v, want 3 in the key's set and 3 in the total", got)
	}
	res := z.Acquire(context.Background(), request(limits, "other"), limiter.WaitOptions{})
	if res.Outcome != limiter.Full || res.Dim != limiter.TotalDim {
		t.Fatalf("one more unit while the total is taken: %v (dim %d), want full by the total", res.Outcome, res.Dim)
	}
	z.Release(huge)
	if n := local.Held(limiter.TotalDim); n != 0 {
		t.Fatalf("local total %d after the release, want 0", n)
	}
	eventually(t, "every unit given back in Redis", func() bool { return nothingLeft(t, cli, "t") })
	mustAdmit(t, z, costly(limits, "other", 3), "3 units once the big request ended")
}

func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// A waiter takes its units when granted, and its request gives back
// exactly those: the caller's request, not the waiter's copy, is the one
// released.
func TestWaiterGivesBackWhatItTook(t *testing.T) {
	addr, cli := startRedis(t)
	s := newStore(t, store(addr, nil))
	limits := &limiter.Limits{Max: []int64{4}}
	z, local := zoneOf(s, "waiter-cost", limits)
	holder := costly(limits, "k", 2)
	mustAdmit(t, z, holder, "holder")
	waiter := costly(limits, "k", 9) // clamped to 4: waits for the holder
	done := make(chan limiter.Result, 1)
	go func() { done <- z.Acquire(context.Background(), waiter, limiter.WaitOptions{Wait: 10 * time.Second}) }()
	eventually(t, "the big request waits", func() bool { return local.WaitingOutside() == 1 })
	z.Release(holder)
	if res := <-done; res.Outcome != limiter.Admitted {
		t.Fatalf("waiter: %v, want admitted", res.Outcome)
	}
	if n := local.Held(0); n != 4 {
		t.Fatalf("local count %d while the waiter runs, want 4", n)
	}
	z.Release(waiter)
	if n := local.Held(0); n != 0 {
		t.Fatalf("local count %d after the waiter's release, want 0", n)
	}
	eventually(t, "every unit given back in Redis", func() bool { return nothingLeft(t, cli, "t") })
}

// The units counters are exact whatever ends a lease: a crashed
// instance's leases expiring, a renewal re-creating leases Redis lost, a
// late admission's ghosts, a request admitted locally while Redis was
// down and entered by renewal.
func TestUnitCountersBackAtZero(t *testing.T) {
	addr, cli := startRedis(t)
	ctx := context.Background()
	limits := &limiter.Limits{Max: []int64{20}, Total: 50}

	t.Run("crashed instance", func(t *testing.T) {
		crashed := newStore(t, store(addr, func(s *Store) { s.Lease = caddy.Duration(time.Second) }))
		zc, _ := zoneOf(crashed, "expiry", limits)
		req := costly(limits, "k", 3)
		mustAdmit(t, zc, req, "the instance that crashes")
		member := onlyLease(t, crashed.book)
		crashed.book.mu.Lock()
		delete(crashed.book.leases, member) // neither renewed nor released
		crashed.book.mu.Unlock()
		time.Sleep(1100 * time.Millisecond)
		z, _ := zoneOf(secondInstance(t, addr), "expiry", limits)
		next := costly(limits, "k", 2)
		mustAdmit(t, z, next, "after the crashed lease expired")
		if got := sum(unitsBySet(t, cli, "t")); got != 4 {
			t.Fatalf("units in Redis %d, want 4 (2 in the key, 2 in the total): the expired 3 given back", got)
		}
		z.Release(next)
		eventually(t, "every unit given back", func() bool { return nothingLeft(t, cli, "t") })
	})

	t.Run("renewal after FLUSHALL", func(t *testing.T) {
		s := newStore(t, store(addr, func(s *Store) { s.Lease = caddy.Duration(3 * time.Second) }))
		z, _ := zoneOf(s, "flush", limits)
		req := costly(limits, "k", 5)
		mustAdmit(t, z, req, "acquire")
		cli.FlushAll(ctx)
		s.book.renew()
		if got := unitsBySet(t, cli, "t"); len(got) != 2 || sum(got) != 10 {
			t.Fatalf("units after renewal re-created the lease %v, want 5 in each set", got)
		}
		s.book.renew() // renewing what is there counts nothing twice
		if got := sum(unitsBySet(t, cli, "t")); got != 10 {
			t.Fatalf("units after a second renewal %d, want 10", got)
		}
		z.Release(req)
		eventually(t, "every unit given back", func() bool { return nothingLeft(t, cli, "t") })
	})

	t.Run("ghosts", func(t *testing.T) {
		p := newFaultProxy(t, addr)
		s := newStore(t, store(p.addr, func(s *Store) { s.Timeout = caddy.Duration(100 * time.Millisecond) }))
		z, _ := zoneOf(s, "ghost", limits)
		warmUp(t, z, limits, cli)
		p.setStall(true)
		req := costly(limits, "k", 4)
		mustAdmit(t, z, req, "acquire with Redis stalled (admitted locally)")
		z.Release(req)
		p.setStall(false)
		eventually(t, "the ghost's units given back", func() bool { return nothingLeft(t, cli, "t") })
	})

	t.Run("admitted locally", func(t *testing.T) {
		p := newFaultProxy(t, addr)
		s := newStore(t, store(p.addr, func(s *Store) { s.Timeout = caddy.Duration(200 * time.Millisecond) }))
		z, _ := zoneOf(s, "outage", limits)
		p.setDown(true)
		req := costly(limits, "k", 6)
		mustAdmit(t, z, req, "acquire while Redis is down (on_error open)")
		p.setDown(false)
		s.book.downUntil.Store(0)
		eventually(t, "renewal entered the local admission's units", func() bool {
			s.book.renew()
			return sum(unitsBySet(t, cli, "t")) == 12
		})
		z.Release(req)
		eventually(t, "every unit given back", func() bool { return nothingLeft(t, cli, "t") })
	})
}

// What Redis runs for a request of one unit, as docs/performance.md counts it:
// into an empty set, ZCARD, ZADD and PEXPIRE, then its release's ZREM;
// into a set with members, the set is read in two commands (ZCARD, then
// its count and expired members in one ZRANGEBYSCORE), never a ZSCORE.
// Requests go one at a time, each released before the next: every call
// carries one admission, every release one removal.
func TestCommandsPerAdmission(t *testing.T) {
	for _, busy := range []bool{false, true} {
		t.Run(fmt.Sprint("set with members=", busy), func(t *testing.T) {
			addr, cli := startRedis(t)
			// No renewal within the test: its commands are not the requests'.
			s := newStore(t, store(addr, func(s *Store) { s.Lease = caddy.Duration(time.Minute) }))
			limits := &limiter.Limits{Max: []int64{1 << 30}}
			z, _ := zoneOf(s, "commands", limits)
			warmUp(t, z, limits, cli)
			held := request(limits, "busy")
			if busy {
				mustAdmit(t, z, held, "the lease that keeps the set busy")
			}
			cli.ConfigResetStat(context.Background())
			const n = 20
			for i := range n {
				key := fmt.Sprint("empty", i)
				if busy {
					key = "busy"
				}
				req := request(limits, key)
				mustAdmit(t, z, req, key)
				z.Release(req)
				// Waiting on the book, not on Redis (the counts are Redis's
				// own): removed alone, the lease is not also carried by
				// the next admission, as it is while its removal is under way.
				eventually(t, "the release removed", func() bool {
					s.book.mu.Lock()
					defer s.book.mu.Unlock()
					return len(s.book.ended) == 0
				})
			}
			stats := commandStats(t, cli)
			t.Logf("%d requests: ZCARD %d, ZRANGEBYSCORE %d, ZADD %d, PEXPIRE %d, ZREM %d", n,
				stats["zcard"].calls, stats["zrangebyscore"].calls, stats["zadd"].calls, stats["pexpire"].calls, stats["zrem"].calls)
			for cmd, most := range map[string]int64{"zcard": n, "zadd": n, "pexpire": n, "zrem": n, "zrangebyscore": int64(n * flag(busy)),
				"zscore": 0, "zincrby": 0, "zremrangebyscore": 0} {
				if got := stats[cmd].calls; got > most {
					t.Errorf("%s: %d calls for %d requests, want at most %d", cmd, got, n, most)
				}
			}
			if busy {
				z.Release(held)
			}
		})
	}
}

// Each ended lease is removed by one script: under concurrency the ZREMs
// are at most one per lease and set, not one per admission for every lease
// not yet confirmed removed. And admissions that arrive while a call is under way go in one script.
func TestEachLeaseRemovedOnceAndAdmissionsBatched(t *testing.T) {
	addr, cli := startRedis(t)
	s := newStore(t, store(addr, nil))
	limits := &limiter.Limits{Max: []int64{1 << 30}, Total: 1 << 30} // two sets a lease
	z, _ := zoneOf(s, "once", limits)
	warmUp(t, z, limits, cli)
	cli.ConfigResetStat(context.Background())
	const workers, each = 16, 100
	var wg sync.WaitGroup
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				req := request(limits, fmt.Sprint("k", g))
				if res := z.Acquire(context.Background(), req, limiter.WaitOptions{}); res.Outcome != limiter.Admitted {
					t.Errorf("acquire: %v, want admitted", res.Outcome)
					return
				}
				z.Release(req)
			}
		}()
	}
	wg.Wait()
	eventually(t, "every lease removed", func() bool { return nothingLeft(t, cli, "t") })
	stats := commandStats(t, cli)
	const requests = workers * each
	if n := stats["zrem"].calls; n > 2*requests {
		t.Fatalf("%d ZREMs for %d leases of 2 sets each, want at most one per lease and set", n, requests)
	}
	if n := stats["evalsha"].calls + stats["eval"].calls; n > requests*3/4 {
		t.Fatalf("%d scripts for %d requests from %d goroutines, want admissions batched", n, requests, workers)
	}
}

// Batched admissions get the verdicts single ones would: of 40 requests
// arriving at once for a key of cap 5, exactly 5 are admitted, the others
// refused by that key.
func TestBatchedVerdictsAreExact(t *testing.T) {
	addr, cli := startRedis(t)
	s := newStore(t, store(addr, nil))
	limits := &limiter.Limits{Max: []int64{5}}
	z, _ := zoneOf(s, "verdicts", limits)
	warmUp(t, z, limits, cli)
	cli.ConfigResetStat(context.Background())
	const n = 40
	results := make(chan limiter.Result, n)
	start := make(chan struct{})
	var held []*limiter.Request
	var mu sync.Mutex
	for range n {
		go func() {
			req := request(limits, "k")
			<-start
			res := z.Acquire(context.Background(), req, limiter.WaitOptions{})
			if res.Outcome == limiter.Admitted {
				mu.Lock()
				held = append(held, req)
				mu.Unlock()
			}
			results <- res
		}()
	}
	close(start)
	var admitted, full int
	for range n {
		switch res := <-results; {
		case res.Outcome == limiter.Admitted:
			admitted++
		case res.Outcome == limiter.Full && res.Dim == 0:
			full++
		default:
			t.Fatalf("outcome %v (dim %d), want admitted or full by the key", res.Outcome, res.Dim)
		}
	}
	if admitted != 5 || full != n-5 {
		t.Fatalf("%d admitted, %d full, want 5 and %d", admitted, full, n-5)
	}
	if calls := commandStats(t, cli)["evalsha"].calls; calls >= n {
		t.Logf("%d scripts for %d requests: no batch formed on this run", calls, n)
	}
	for _, req := range held {
		z.Release(req)
	}
	eventually(t, "every unit given back", func() bool { return nothingLeft(t, cli, "t") })
}

// A set counts its units exactly: one per lease plus what its leases carry
// beyond one. An expired lease's units come back when the next admission
// removes it, and a release gives back only a lease it removed: one
// removed already (expired, or removed by another script) gives nothing
// back twice.
func TestSetCountsItsUnitsExactly(t *testing.T) {
	addr, cli := startRedis(t)
	ctx := context.Background()
	s := newStore(t, store(addr, nil))
	limits := &limiter.Limits{Max: []int64{6}}
	z, _ := zoneOf(s, "exact", limits)
	a, b := costly(limits, "k", 3), costly(limits, "k", 2)
	mustAdmit(t, z, a, "3 units")
	mustAdmit(t, z, b, "2 units")
	var set string
	for k := range unitsBySet(t, cli, "t") {
		set = k
	}
	units := func(want int64, after string) {
		t.Helper()
		if got := unitsBySet(t, cli, "t")[set]; got != want {
			t.Fatalf("after %s, the set counts %d units, want %d", after, got, want)
		}
	}
	units(5, "admitting 3 and 2")
	if res := z.Acquire(ctx, costly(limits, "k", 2), limiter.WaitOptions{}); res.Outcome != limiter.Full {
		t.Fatalf("2 units beside 5 under a cap of 6: %v, want full", res.Outcome)
	}

	// Another instance's lease of 3 units, expired: the next admission
	// removes it and its units.
	cli.ZAdd(ctx, set, redis.Z{Score: 1, Member: "other:1:3"})
	cli.ZIncrBy(ctx, set, -2, countMember)
	units(8, "an expired lease of 3 added by hand")
	one := costly(limits, "k", 1)
	mustAdmit(t, z, one, "1 unit beside 5 and an expired lease")
	units(6, "the expired lease removed")
	z.Release(one)
	eventually(t, "the release sent", func() bool { return unitsBySet(t, cli, "t")[set] == 5 })

	// a's lease removed by another script (as an expiry scan would): its
	// release gives back nothing more.
	var member string
	for _, m := range cli.ZRange(ctx, set, 0, -1).Val() {
		if strings.HasSuffix(m, ":3") && !strings.HasPrefix(m, "other:") {
			member = m
		}
	}
	cli.ZRem(ctx, set, member)
	cli.ZIncrBy(ctx, set, 2, countMember)
	units(2, "a's lease removed by hand")
	z.Release(a)
	eventually(t, "the release sent", func() bool {
		s.book.mu.Lock()
		defer s.book.mu.Unlock()
		return len(s.book.ended) == 0
	})
	units(2, "releasing a lease removed already")
	z.Release(b)
	eventually(t, "every lease and unit given back", func() bool { return nothingLeft(t, cli, "t") })
	if n, _ := cli.Exists(ctx, set).Result(); n != 0 {
		t.Fatalf("the set is still there once its leases are gone")
	}
}

// TestOldLayoutKeysAreNotRead: instances that count otherwise (from before
// leases carried their units: keys without the layout's name; or with a
// counter beside each set: u1) fill their sets; this one counts in its own
// keys, so none misreads another's members during a rolling upgrade.
func TestOldLayoutKeysAreNotRead(t *testing.T) {
	addr, cli := startRedis(t)
	ctx := context.Background()
	s := newStore(t, store(addr, nil))
	limits := &limiter.Limits{Max: []int64{2}}
	z, _ := zoneOf(s, "upgrade", limits)
	first := request(limits, "k")
	mustAdmit(t, z, first, "first")
	keys, err := cli.Keys(ctx, "t:"+keySchema+":*:client:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys of the layout %s: %v %v, want one set", keySchema, keys, err)
	}
	for _, layout := range []string{":", ":u1:"} {
		old := strings.Replace(keys[0], ":"+keySchema+":", layout, 1)
		for i := range 5 {
			cli.ZAdd(ctx, old, redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: fmt.Sprint("old:", i, ":1")})
		}
		cli.Set(ctx, old+":u", 5, time.Hour)
	}
	second := request(limits, "k")
	mustAdmit(t, z, second, "second, beside old instances' full sets")
	z.Release(first)
	z.Release(second)
}

// A request that needs two keyed caps (tenant T and client C, caps 10,
// each held by 9 requests of cost 1) is admitted through Redis while small
// requests keep arriving for T and C: each admission call holds, for it,
// the room of every set that refused it before. One round releases the
// requests holding T (even rounds) or C (odd rounds), each followed by a
// newcomer for the same key.
func TestWaiterNeedingTwoCapsIsAdmittedThroughRedis(t *testing.T) {
	addr, _ := startRedis(t)
	s := newStore(t, store(addr, nil))
	limits := &limiter.Limits{Max: []int64{10, 10}}
	local := limiter.NewZone(2, false, nil)
	local.Adopt(limits)
	z := s.Bind("twocaps", []string{"tenant", "client"}, false, local)
	n := 0
	arrive := func(tenant, client string) *limiter.Request {
		n++
		if tenant == "" {
			tenant = fmt.Sprint("tenant", n)
		}
		if client == "" {
			client = fmt.Sprint("client", n)
		}
		r := &limiter.Request{Keys: []string{tenant, client}, Max: []int64{0, 0}, Limits: limits}
		if z.Acquire(context.Background(), r, limiter.WaitOptions{}).Outcome == limiter.Admitted {
			return r
		}
		return nil
	}
	var onT, onC []*limiter.Request
	for range 9 {
		onT = append(onT, arrive("T", ""))
		onC = append(onC, arrive("", "C"))
	}
	big := &limiter.Request{Keys: []string{"T", "C"}, Max: []int64{0, 0}, Limits: limits, Cost: 10}
	done := make(chan limiter.Result, 1)
	go func() { done <- z.Acquire(context.Background(), big, limiter.WaitOptions{Wait: time.Minute}) }()
	eventually(t, "the big request waits", func() bool { return local.WaitingOutside() == 1 })
	const rounds = 6
	admittedIn := -1
	for round := 0; round < rounds && admittedIn < 0; round++ {
		ending, tenant, client := &onT, "T", ""
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
		select {
		case res := <-done:
			if res.Outcome != limiter.Admitted {
				t.Fatalf("big request: %v, want admitted", res.Outcome)
			}
			admittedIn = round + 1
		case <-time.After(2 * fallbackPoll):
		}
	}
	if admittedIn < 0 || admittedIn > 2 {
		t.Fatalf("cost-10 request needing T and C: admitted after round %d of %d (-1: never), want by round 2", admittedIn, rounds)
	}
	z.Release(big)
	for _, r := range append(onT, onC...) {
		if r != nil {
			z.Release(r)
		}
	}
}

// TestReleaseGivesBackItsUnitsOnce: a release gives back in Redis the units
// of its lease and no more: with leases of 2 and 3 units in a key of cap 5,
// releasing the 2 leaves the set's counter at 3, and 3 more units are
// refused.
func TestReleaseGivesBackItsUnitsOnce(t *testing.T) {
	addr, cli := startRedis(t)
	s := newStore(t, store(addr, nil))
	limits := &limiter.Limits{Max: []int64{5}}
	z, _ := zoneOf(s, "once-back", limits)
	a, b := costly(limits, "k", 2), costly(limits, "k", 3)
	mustAdmit(t, z, a, "2 units")
	mustAdmit(t, z, b, "3 units beside them")
	z.Release(a)
	eventually(t, "the release of 2 units sent", func() bool { return members(t, cli, "t") == 1 })
	if got := unitsBySet(t, cli, "t"); len(got) != 1 || sum(got) != 3 {
		t.Fatalf("units counters %v after releasing 2 of 5 units, want one of 3", got)
	}
	next := costly(limits, "k", 3)
	if res := z.Acquire(context.Background(), next, limiter.WaitOptions{}); res.Outcome != limiter.Full {
		z.Release(next)
		t.Fatalf("3 more units beside 3 under a cap of 5: %v, want full", res.Outcome)
	}
	z.Release(b)
	eventually(t, "every unit given back", func() bool { return nothingLeft(t, cli, "t") })
}
