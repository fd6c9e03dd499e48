package redisstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// instances returns an instance of one zone with limits for each address
// (each a store of its own over the same Redis and key prefix, as Caddys
// are).
func instances(t *testing.T, limits *limiter.Limits, addrs ...string) []limiter.Store {
	t.Helper()
	out := make([]limiter.Store, len(addrs))
	for i, addr := range addrs {
		// Options that differ keep the books apart, as processes are.
		s := newStore(t, store(addr, func(s *Store) { s.Timeout = caddy.Duration(time.Duration(2000+i) * time.Millisecond) }))
		out[i], _ = zoneOf(s, "fleet", limits)
	}
	return out
}

// tenantLoad is clients of one tenant, at one instance each, that ask for
// a slot, hold it for hold and come back, and the slot-seconds they held.
type tenantLoad struct {
	key    string
	weight float64
	hold   time.Duration
	at     []int // the instance of each client
}

// runFleet runs loads on instances for d after warm, and returns the
// slot-seconds each tenant held in that window.
func runFleet(t *testing.T, fleet []limiter.Store, limits *limiter.Limits, loads []tenantLoad, warm, d time.Duration) map[string]float64 {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var mu sync.Mutex
	var from, to time.Time
	held := map[string]float64{}
	var grants atomic.Int64
	defer func() { t.Logf("%d grants", grants.Load()) }()
	var wg sync.WaitGroup
	for _, l := range loads {
		for _, at := range l.at {
			wg.Go(func() {
				opt := limiter.WaitOptions{Wait: time.Minute, Fair: true, Weight: l.weight}
				for ctx.Err() == nil {
					req := request(limits, l.key)
					if res := fleet[at].Acquire(ctx, req, opt); res.Outcome != limiter.Admitted {
						if ctx.Err() == nil {
							t.Errorf("%s at %d: %v", l.key, at, res.Outcome)
						}
						return
					}
					grants.Add(1)
					start := time.Now()
					time.Sleep(l.hold)
					end := time.Now()
					fleet[at].Release(req)
					mu.Lock()
					if s, e := max(start.UnixNano(), from.UnixNano()), min(end.UnixNano(), to.UnixNano()); !from.IsZero() && e > s {
						held[l.key] += float64(e-s) / 1e9
					}
					mu.Unlock()
				}
			})
		}
	}
	time.Sleep(warm)
	mu.Lock()
	from = time.Now()
	to = from.Add(d)
	mu.Unlock()
	time.Sleep(d + 2*time.Second)
	stop()
	wg.Wait()
	return held
}

// TestFairClockSharedByInstances: two instances of one zone (total 2,
// fair over the tenant): tenant a (weight 3) reaches only the first,
// tenant b (weight 1) only the second, each with 6 clients holding a slot
// 20 ms at a time. Over 5 s, a gets 3/4 ± 0.05 of the slot-seconds, as
// if one instance served both: the instances go by one fair clock. Each
// fair only among the requests it sees, they share about half and half
// (each instance wins the races for freed slots as often).
func TestFairClockSharedByInstances(t *testing.T) {
	addr, _ := startRedis(t)
	limits := &limiter.Limits{Max: []int64{100}, Total: 2}
	fleet := instances(t, limits, addr, addr)
	checkThreeQuarters(t, runFleet(t, fleet, limits, threeToOne, time.Second, 5*time.Second))
}

// checkThreeQuarters checks that tenant a (weight 3 of 4) held 0.75 ±
// 0.05 of the slot-seconds.
func checkThreeQuarters(t *testing.T, held map[string]float64) {
	t.Helper()
	share := held["a"] / (held["a"] + held["b"])
	t.Logf("slot-seconds a %.2f, b %.2f: a's share %.3f (of at most 10)", held["a"], held["b"], share)
	if !(share >= 0.70 && share <= 0.80) {
		t.Errorf("tenant a (weight 3 of 4) has %.3f of the slot-seconds, want 0.75 ± 0.05", share)
	}
}

// threeToOne is TestFairClockSharedByInstances's load: tenant a (weight 3)
// at the first instance, b (weight 1) at the second, 6 clients each.
var threeToOne = []tenantLoad{
	{key: "a", weight: 3, hold: 20 * time.Millisecond, at: []int{0, 0, 0, 0, 0, 0}},
	{key: "b", weight: 1, hold: 20 * time.Millisecond, at: []int{1, 1, 1, 1, 1, 1}},
}

// TestFairClockRejoinedAfterAnOutage: the load of
// TestFairClockSharedByInstances, with Redis unreachable from both
// instances for a second (on_error open: each admits alone, fair among its
// own waiters, under its share of the total); once Redis answers again,
// the shares over 5 s are the weights' again (a 0.75 ± 0.05).
func TestFairClockRejoinedAfterAnOutage(t *testing.T) {
	addr, _ := startRedis(t)
	limits := &limiter.Limits{Max: []int64{100}, Total: 2}
	p0, p1 := newFaultProxy(t, addr), newFaultProxy(t, addr)
	fleet := instances(t, limits, p0.addr, p1.addr)
	go func() {
		time.Sleep(500 * time.Millisecond)
		p0.setDown(true)
		p1.setDown(true)
		time.Sleep(time.Second)
		p0.setDown(false)
		p1.setDown(false)
	}()
	// Redis is left alone for a second after a failure: measured from 2 s
	// after it answers again.
	checkThreeQuarters(t, runFleet(t, fleet, limits, threeToOne, 4500*time.Millisecond, 5*time.Second))
}

// TestFairBigWaiterNotPassedByOtherInstances: a request of 3 units (the
// whole total) waits at one instance while another instance's 9 clients
// ask for 1 unit each, holding it 20 ms, without end: the big request is
// admitted within its wait of 2 s (without the shared clock it waited
// 17.5 s, passed by 2,366 small requests), as the other key's grants move its
// start past the big one's place on the shared clock and its requests are
// then refused until the units the big one needs are free.
func TestFairBigWaiterNotPassedByOtherInstances(t *testing.T) {
	addr, _ := startRedis(t)
	limits := &limiter.Limits{Max: []int64{100}, Total: 3}
	fleet := instances(t, limits, addr, addr)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var smalls atomic.Int64
	for range 9 { // more than the total: the other instance always has waiters
		wg.Go(func() {
			opt := limiter.WaitOptions{Wait: time.Minute, Fair: true}
			for ctx.Err() == nil {
				req := request(limits, "small")
				if fleet[1].Acquire(ctx, req, opt).Outcome != limiter.Admitted {
					continue
				}
				smalls.Add(1)
				time.Sleep(20 * time.Millisecond)
				fleet[1].Release(req)
			}
		})
	}
	eventually(t, "the small requests flow", func() bool { return smalls.Load() > 20 })
	big := request(limits, "big")
	big.Cost = 3
	res := fleet[0].Acquire(context.Background(), big, limiter.WaitOptions{Wait: 2 * time.Second, Fair: true})
	stop()
	wg.Wait()
	if res.Outcome != limiter.Admitted {
		t.Fatalf("the 3-unit request: %v after %v, want admitted: the other instance's 1-unit requests passed it all along", res.Outcome, res.Waited)
	}
	fleet[0].Release(big)
	t.Logf("the 3-unit request waited %v while %d requests of 1 unit went", res.Waited, smalls.Load())
}

// TestFairClockIdleLeavesNoTags: keys admitted while none waits are not
// charged, in Redis or here: a stream of distinct keys leaves no tag
// behind (neither grows with the keys), and the clock's keys expire.
func TestFairClockIdleLeavesNoTags(t *testing.T) {
	addr, cli := startRedis(t)
	limits := &limiter.Limits{Max: []int64{100}, Total: 100}
	fleet := instances(t, limits, addr)
	for i := range 200 {
		req := request(limits, fmt.Sprint("k", i))
		if res := fleet[0].Acquire(context.Background(), req, limiter.WaitOptions{Wait: time.Minute, Fair: true}); res.Outcome != limiter.Admitted {
			t.Fatalf("request %d: %v", i, res.Outcome)
		}
		fleet[0].Release(req)
	}
	tag := fleet[0].(*redisZone).tag
	n, err := cli.ZCard(context.Background(), tag+":fair:t").Result()
	if err != nil || n != 0 {
		t.Fatalf("the fair clock holds %d tags (%v) after 200 keys admitted while none waited, want 0", n, err)
	}
	if v := cli.HGet(context.Background(), tag+":fair", "v").Val(); v != "" && v != "0" {
		t.Fatalf("virtual time %q after 200 keys admitted while none waited, want 0 (or none): no grant was charged", v)
	}
}
