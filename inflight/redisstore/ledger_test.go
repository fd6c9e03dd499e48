package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// store returns the settings of a store of Redis at addr, key prefix "t".
func store(addr string, opts func(*Store)) *Store {
	s := &Store{Address: []string{addr}, KeyPrefix: "t", Timeout: caddy.Duration(2 * time.Second)}
	if opts != nil {
		opts(s)
	}
	return s
}

// instance provisions a store as instance n of a fleet: a book of its own
// (its own name in Redis), as another Caddy process would have.
func instance(t testing.TB, s *Store, n int) *Store {
	t.Helper()
	newStore(t, s)
	id := s.book.id
	s.book.leave()
	s.book = joinBook(s, fmt.Sprintf("%s#%d", id, n))
	s.book.instance = fmt.Sprintf("%s#%d", processName, n) // another process
	return s
}

func observeLogs(b *book) *observer.ObservedLogs {
	core, logs := observer.New(zap.InfoLevel)
	b.outageLog.logger = zap.New(core)
	return logs
}

func mustAdmit(t testing.TB, z *limiter.Zone, req *limiter.Request, what string) *limiter.Slot {
	t.Helper()
	res := z.Acquire(context.Background(), req, limiter.WaitOptions{})
	if res.Outcome != limiter.Admitted {
		t.Fatalf("%s: %v, want admitted", what, res.Outcome)
	}
	return res.Slot
}

// admitsNow reports whether z admits req now, and keeps its slot in slot.
func admitsNow(z *limiter.Zone, req *limiter.Request, slot **limiter.Slot) bool {
	*slot = z.Acquire(context.Background(), req, limiter.WaitOptions{}).Slot
	return *slot != nil
}

// warmUp admits and releases one request, so the zone knows Redis's
// clock, and waits until Redis counts nothing.
func warmUp(t testing.TB, z *limiter.Zone, limits *limiter.Limits, cli *redis.Client) {
	t.Helper()
	var warm *limiter.Slot
	eventually(t, "the warm-up admitted", func() bool { // a first call may outlast a short timeout
		return admitsNow(z, request(limits, "warm"), &warm)
	})
	warm.Release()
	eventually(t, "warm-up given back", func() bool { return allowances(t, cli, "t") == 0 })
	// The call that gave it back may still wait for its reply: a test
	// that holds Redis's replies back now would hold the next call behind.
	eventually(t, "no call under way", func() bool { return callsUnderWay(z) == 0 })
}

// scriptCalls returns how many scripts Redis has run.
func scriptCalls(t testing.TB, cli *redis.Client) int64 {
	st := commandStats(t, cli)
	return st["evalsha"].calls + st["eval"].calls
}

// TestFleetCapsAreExact: three instances of one Redis, each with a zone
// of a client limit (cap 4) and a total (cap 10), and 40 goroutines that
// admit and release at random, at once or waiting, on three clients. No
// admission ever makes a client hold more than 4 or the fleet more than
// 10, counted over the three instances; once all ended, Redis counts
// nothing.
func TestFleetCapsAreExact(t *testing.T) {
	addr, cli := startRedis(t)
	limits := &limiter.Limits{Max: []int64{4}, Total: 10}
	var zones []*limiter.Zone
	for n := range 3 {
		zones = append(zones, zoneOf(t, instance(t, store(addr, nil), n), "exact", limits))
	}
	var total atomic.Int64
	var byKey [3]atomic.Int64
	var admitted atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(3 * time.Second)
	for g := range 40 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for time.Now().Before(end) {
				z, k := zones[rng.IntN(3)], rng.IntN(3)
				req := request(limits, fmt.Sprint("c", k))
				opt := limiter.WaitOptions{}
				if rng.IntN(2) == 0 {
					opt.Wait = time.Duration(rng.IntN(50)) * time.Millisecond
				}
				res := z.Acquire(context.Background(), req, opt)
				if res.Outcome != limiter.Admitted {
					continue
				}
				admitted.Add(1)
				if n := byKey[k].Add(1); n > 4 {
					t.Errorf("client c%d holds %d over the fleet, cap 4", k, n)
				}
				if n := total.Add(1); n > 10 {
					t.Errorf("the fleet holds %d, total 10", n)
				}
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
				total.Add(-1)
				byKey[k].Add(-1)
				res.Slot.Release()
			}
		})
	}
	wg.Wait()
	t.Logf("%d admissions", admitted.Load())
	if admitted.Load() < 100 {
		t.Fatalf("%d admissions in 3 s, want many", admitted.Load())
	}
	for _, z := range zones {
		z.Close()
	}
	eventually(t, "Redis counts nothing once all ended", func() bool { return allowances(t, cli, "t") == 0 })
}

// TestWaiterWokenByAnotherInstancesRelease: a waiter at one instance is
// admitted as soon as a request at another ends, not after a poll.
func TestWaiterWokenByAnotherInstancesRelease(t *testing.T) {
	addr, _ := startRedis(t)
	limits := &limiter.Limits{Max: []int64{1}}
	a, b := zoneOf(t, instance(t, store(addr, nil), 0), "wake", limits), zoneOf(t, instance(t, store(addr, nil), 1), "wake", limits)
	held := mustAdmit(t, a, request(limits, "k"), "at A")
	done := make(chan limiter.Result, 1)
	go func() {
		done <- b.Acquire(context.Background(), request(limits, "k"), limiter.WaitOptions{Wait: time.Minute})
	}()
	eventually(t, "B's request waits", func() bool { return b.State(limiter.Look{}).Waiting == 1 })
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	held.Release()
	res := <-done
	if res.Outcome != limiter.Admitted {
		t.Fatalf("B's waiter: %v, want admitted", res.Outcome)
	}
	if took := time.Since(start); took > 200*time.Millisecond {
		t.Errorf("B's waiter admitted %s after A's release, want within a few round trips (the poll is %s)", took, time.Second/4)
	}
}

// TestAdmissionsBelowTheCapMakeNoCalls: far from its cap (1,000), a key
// used again and again is admitted within this instance's allowance: 200
// requests one after another make at most 10 scripts, and Redis counts,
// once they ended and the linger passed, nothing.
func TestAdmissionsBelowTheCapMakeNoCalls(t *testing.T) {
	addr, cli := startRedis(t)
	limits := &limiter.Limits{Max: []int64{1000}}
	z := zoneOf(t, newStore(t, store(addr, nil)), "free", limits)
	warmUp(t, z, limits, cli)
	before := scriptCalls(t, cli)
	for range 200 {
		mustAdmit(t, z, request(limits, "k"), "below the cap").Release()
	}
	calls := scriptCalls(t, cli) - before
	t.Logf("200 admissions of one key, far from its cap: %d scripts", calls)
	if calls > 10 {
		t.Fatalf("200 admissions made %d scripts, want at most 10", calls)
	}
	eventually(t, "the idle allowance goes back", func() bool { return allowances(t, cli, "t") == 0 })
}

// TestCostsShareOneCapAcrossInstances: requests of costs 3 and 2 at two
// instances share a cap of 5 units: a third of cost 1 is refused, and
// admitted once one ends; a cost above the cap is admitted alone once the
// key is free.
func TestCostsShareOneCapAcrossInstances(t *testing.T) {
	addr, cli := startRedis(t)
	limits := &limiter.Limits{Max: []int64{5}}
	a, b := zoneOf(t, instance(t, store(addr, nil), 0), "cost", limits), zoneOf(t, instance(t, store(addr, nil), 1), "cost", limits)
	costly := func(cost int64) *limiter.Request {
		r := request(limits, "k")
		r.Cost = cost
		return r
	}
	three := mustAdmit(t, a, costly(3), "cost 3 at A")
	two := mustAdmit(t, b, costly(2), "cost 2 at B")
	if res := b.Acquire(context.Background(), costly(1), limiter.WaitOptions{}); res.Outcome != limiter.Full {
		t.Fatalf("cost 1 with 5 of 5 held: %v, want full", res.Outcome)
	}
	three.Release()
	var one, big *limiter.Slot
	eventually(t, "cost 1 admitted once cost 3 ended", func() bool { return admitsNow(b, costly(1), &one) })
	one.Release()
	two.Release()
	eventually(t, "cost 9 admitted alone on a cap of 5", func() bool { return admitsNow(a, costly(9), &big) })
	if big.Units() != 5 {
		t.Fatalf("cost 9 on a cap of 5 holds %d units, want 5", big.Units())
	}
	big.Release()
	a.Close()
	b.Close()
	eventually(t, "nothing counted once all ended", func() bool { return allowances(t, cli, "t") == 0 })
}
