package redisstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// costly is a request of key with a cost.
func costly(limits *limiter.Limits, key string, cost int64) *limiter.Request {
	r := request(limits, key)
	r.Cost = cost
	return r
}

// TestRejoinsWhenRedisAnswers: with on_error closed, once Redis answers
// again the store is reachable without any request trying it, within half
// the one-second back-off (the prober's PING ends it), and the next
// request is admitted, not refused for the rest of the back-off.
func TestRejoinsWhenRedisAnswers(t *testing.T) {
	addr, _ := startRedis(t)
	proxy := newFaultProxy(t, addr)
	proxy.setDown(true)
	s := newStore(t, store(proxy.addr, func(s *Store) { s.OnError = "closed" }))
	limits := &limiter.Limits{Max: []int64{10}}
	z := zoneOf(t, s, "rejoin", limits)
	admit := func() limiter.Outcome {
		res := z.Acquire(context.Background(), request(limits, "k"), limiter.WaitOptions{})
		if res.Outcome == limiter.Admitted {
			res.Slot.Release()
		}
		return res.Outcome
	}
	if got := admit(); got != limiter.Unavailable {
		t.Fatalf("with Redis refusing connections and on_error closed: %v, want unavailable", got)
	}
	back := time.Now()
	proxy.setDown(false)
	eventually(t, "the store reachable again with no request trying", func() bool { return !s.book.outage.Load() })
	took := time.Since(back)
	t.Logf("reachable %v after Redis accepted again (the back-off is %v)", took.Round(time.Millisecond), backOff)
	if took >= backOff/2 {
		t.Errorf("reachable %v after Redis accepted again, want well within the %v back-off: the prober's PING, every %v, ends it", took.Round(time.Millisecond), backOff, probeEvery)
	}
	if got := admit(); got != limiter.Admitted {
		t.Fatalf("once the store is reachable again: outcome %v, want admitted", got)
	}
}

// lostReply starts an admission of 2 units of key k whose script runs in
// Redis but whose reply is lost to a reset; if down, Redis also refuses
// new connections from then on. It returns the admission's outcome.
func lostReply(t *testing.T, z *limiter.Zone, limits *limiter.Limits, proxy *faultProxy, cli *redis.Client, down bool) limiter.Outcome {
	t.Helper()
	warmUp(t, z, limits, cli)
	proxy.setStall(true)
	done := make(chan limiter.Outcome, 1)
	go func() { done <- z.Acquire(context.Background(), costly(limits, "k", 2), limiter.WaitOptions{}).Outcome }()
	eventually(t, "the script ran in Redis (its reply held)", func() bool { return allowances(t, cli, "t") == 2 })
	if down {
		proxy.setDown(true)
	} else {
		proxy.dropAll()
	}
	proxy.setStall(false)
	return <-done
}

// TestResentCallCountsOnce: an admission whose reply was lost to a reset
// is sent again on a new connection, marked so, and admitted: Redis
// counts its 2 units once, though the script ran twice, and no outage is
// logged.
func TestResentCallCountsOnce(t *testing.T) {
	addr, cli := startRedis(t)
	proxy := newFaultProxy(t, addr)
	s := newStore(t, store(proxy.addr, func(s *Store) { s.OnError = "closed" }))
	logs := observeLogs(s.book)
	limits := &limiter.Limits{Max: []int64{5}}
	z := zoneOf(t, s, "resets", limits)
	if got := lostReply(t, z, limits, proxy, cli, false); got != limiter.Admitted {
		t.Fatalf("an admission whose reply was lost to a reset: %v, want admitted (sent again)", got)
	}
	if units := allowances(t, cli, "t"); units != 2 {
		t.Fatalf("Redis counts %d units, want the admission's 2, once", units)
	}
	if n := logs.Len(); n != 0 {
		t.Fatalf("%d log lines for a call sent again at once, want none: %v", n, logs.All())
	}
}

// TestLostGrantGoesAtRejoin: an admission whose reply was lost and whose
// second try could not reach Redis is refused (on_error closed); what
// its script granted in Redis, which nobody holds, is gone once Redis
// answers again: the zone writes what it holds first.
func TestLostGrantGoesAtRejoin(t *testing.T) {
	addr, cli := startRedis(t)
	proxy := newFaultProxy(t, addr)
	s := newStore(t, store(proxy.addr, func(s *Store) {
		s.OnError, s.Timeout = "closed", caddy.Duration(300*time.Millisecond)
	}))
	limits := &limiter.Limits{Max: []int64{5}}
	z := zoneOf(t, s, "lost", limits)
	if got := lostReply(t, z, limits, proxy, cli, true); got == limiter.Admitted {
		t.Fatal("an admission whose reply was lost and whose second try failed: admitted, want refused (on_error closed)")
	}
	if units := allowances(t, cli, "t"); units != 2 {
		t.Fatalf("after the lost reply, Redis counts %d units, want the 2 its script granted", units)
	}
	back := time.Now()
	proxy.setDown(false)
	eventually(t, "the lost grant gone once Redis answers", func() bool { return allowances(t, cli, "t") == 0 })
	t.Logf("the lost grant went %v after Redis accepted again", time.Since(back).Round(time.Millisecond))
}

// TestFlushAllRewrittenWithinRenewal: Redis losing its data with no
// failure seen (FLUSHALL) counts a held request again within a third of
// the lease, the zone's renewal: another instance is then refused.
func TestFlushAllRewrittenWithinRenewal(t *testing.T) {
	addr, cli := startRedis(t)
	lease := 3 * time.Second
	s := instance(t, store(addr, func(s *Store) { s.Lease = caddy.Duration(lease) }), 0)
	limits := &limiter.Limits{Max: []int64{1}}
	z := zoneOf(t, s, "flush", limits)
	mustAdmit(t, z, request(limits, "a"), "acquire")
	cli.FlushAll(context.Background())
	flushed := time.Now()
	eventually(t, "the allowance written again", func() bool { return allowances(t, cli, "t") == 1 })
	if took := time.Since(flushed); took > lease/3+time.Second {
		t.Errorf("written again %v after FLUSHALL, want within lease/3 (%v)", took, lease/3)
	}
	other := zoneOf(t, instance(t, store(addr, nil), 1), "flush", limits)
	if res := other.Acquire(context.Background(), request(limits, "a"), limiter.WaitOptions{}); res.Outcome != limiter.Full {
		t.Fatalf("another instance, same key, once written again: %v, want full", res.Outcome)
	}
}

// TestLocalAdmissionsEnterRedisWhenItReturns: requests admitted within
// this instance's share while Redis was unreachable (on_error open) are
// counted in Redis once it answers again, before anything more is
// admitted through it: with one held locally on a cap of 2, one more is
// admitted after Redis answers, not two.
func TestLocalAdmissionsEnterRedisWhenItReturns(t *testing.T) {
	addr, cli := startRedis(t)
	p := newFaultProxy(t, addr)
	s := newStore(t, store(p.addr, func(s *Store) { s.Timeout = caddy.Duration(200 * time.Millisecond) }))
	limits := &limiter.Limits{Max: []int64{2}}
	z := zoneOf(t, s, "outage", limits)
	p.setDown(true)
	res := z.Acquire(context.Background(), request(limits, "a"), limiter.WaitOptions{})
	if res.Outcome != limiter.Admitted || !res.Alone {
		t.Fatalf("while Redis is down (on_error open): %v (alone %v), want admitted alone", res.Outcome, res.Alone)
	}
	p.setDown(false)
	eventually(t, "Redis answers again", func() bool { return !s.book.outage.Load() })
	admitted, alone := 0, false
	for range 2 {
		if res := z.Acquire(context.Background(), request(limits, "a"), limiter.WaitOptions{}); res.Outcome == limiter.Admitted {
			admitted++
			alone = res.Alone
		}
	}
	if admitted != 1 {
		t.Fatalf("once Redis answered, %d more admitted beside the one held alone, on a cap of 2; want 1", admitted)
	}
	// Admitted through Redis, both are counted there already; admitted
	// alone again (a slow machine timed the call out), soon after.
	counted := func() bool { return allowances(t, cli, "t") == 2 }
	if alone {
		eventually(t, "Redis counts the one admitted alone and the one after", counted)
	} else if !counted() {
		t.Fatalf("Redis counts %d units, want 2: the one admitted alone and the one after", allowances(t, cli, "t"))
	}
}

// TestOnErrorOpenKeepsToTheShare: while Redis cannot answer, on_error
// open admits within this instance's share of the cap (cap 4 over 2
// replicas: 2), and says it decided alone.
func TestOnErrorOpenKeepsToTheShare(t *testing.T) {
	addr, _ := startRedis(t)
	p := newFaultProxy(t, addr)
	s := newStore(t, store(p.addr, func(s *Store) { s.Timeout = caddy.Duration(200 * time.Millisecond) }))
	limits := &limiter.Limits{Max: []int64{4}, Divisor: 2}
	z := zoneOf(t, s, "share", limits)
	p.setDown(true)
	var outcomes []limiter.Outcome
	for range 3 {
		res := z.Acquire(context.Background(), request(limits, "a"), limiter.WaitOptions{})
		if !res.Alone {
			t.Fatalf("while Redis is down: %v not alone", res.Outcome)
		}
		outcomes = append(outcomes, res.Outcome)
	}
	if outcomes[0] != limiter.Admitted || outcomes[1] != limiter.Admitted || outcomes[2] != limiter.Full {
		t.Fatalf("three requests on a share of 2 while Redis is down: %v, want admitted, admitted, full", outcomes)
	}
}

// TestDeadInstanceUnitsComeBackAfterTheLease: an instance that holds a
// key's one unit and then reaches Redis no more (dead, for the fleet)
// keeps it from the others for at most one lease: its allowance expires
// within a lease of its death, by Redis's clock, and another instance is
// admitted once it has (and not before).
func TestDeadInstanceUnitsComeBackAfterTheLease(t *testing.T) {
	addr, cli := startRedis(t)
	p := newFaultProxy(t, addr)
	lease := time.Second
	dead := instance(t, store(p.addr, func(s *Store) { s.Lease = caddy.Duration(lease) }), 0)
	limits := &limiter.Limits{Max: []int64{1}}
	mustAdmit(t, zoneOf(t, dead, "dead", limits), request(limits, "k"), "at the instance that dies")
	p.setDown(true)
	died, err := cli.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	expiry := time.UnixMilli(deadExpiry(t, cli, dead.book.instance))
	if expiry.After(died.Add(lease)) {
		t.Fatalf("the dead instance's allowance expires %v after its death, want within the lease (%v)", expiry.Sub(died), lease)
	}
	other := zoneOf(t, instance(t, store(addr, func(s *Store) { s.Lease = caddy.Duration(lease) }), 1), "dead", limits)
	eventually(t, "the dead instance's unit back", func() bool {
		req := request(limits, "k")
		if other.Acquire(context.Background(), req, limiter.WaitOptions{}).Outcome != limiter.Admitted {
			return false
		}
		if now, _ := cli.Time(context.Background()).Result(); now.Before(expiry) {
			t.Fatalf("admitted elsewhere %v before the dead instance's allowance expired", expiry.Sub(now))
		}
		return true
	})
	t.Logf("the dead instance's allowance expired %v after its death (lease %v)", expiry.Sub(died).Round(time.Millisecond), lease)
}

// deadExpiry returns the expiry, in Redis's milliseconds, of the one
// allowance instance holds.
func deadExpiry(t *testing.T, cli *redis.Client, instance string) int64 {
	t.Helper()
	ctx := context.Background()
	keys, err := cli.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if typ, _ := cli.Type(ctx, k).Result(); typ != "hash" {
			continue
		}
		if v, err := cli.HGet(ctx, k, instance).Result(); err == nil {
			f := strings.Fields(v) // units spare expiry version
			if len(f) >= 3 && f[0] != "0" {
				ms, _ := strconv.ParseInt(f[2], 10, 64)
				return ms
			}
		}
	}
	t.Fatalf("no allowance of %s in Redis", instance)
	return 0
}

// TestLateScriptWritesNothing: a call whose script reaches Redis after its
// deadline (held in the network beyond the timeout) writes nothing: the
// zone has given up on it (on_error closed: refused), and Redis counts
// nothing once it ran.
func TestLateScriptWritesNothing(t *testing.T) {
	addr, cli := startRedis(t)
	p := newFaultProxy(t, addr)
	s := newStore(t, store(p.addr, func(s *Store) {
		s.OnError, s.Timeout = "closed", caddy.Duration(200*time.Millisecond)
	}))
	limits := &limiter.Limits{Max: []int64{5}}
	z := zoneOf(t, s, "late", limits)
	warmUp(t, z, limits, cli)
	stop, flush := p.holdRequests(t)
	if res := z.Acquire(context.Background(), request(limits, "k"), limiter.WaitOptions{}); res.Outcome != limiter.Unavailable {
		t.Fatalf("with the call held beyond the timeout: %v, want unavailable (on_error closed)", res.Outcome)
	}
	stop()
	time.Sleep(300 * time.Millisecond) // past the deadline
	refused := refusedLate(t, cli)
	flush()
	eventually(t, "the held script refused as late", func() bool { return refusedLate(t, cli) > refused })
	if units := allowances(t, cli, "t"); units != 0 {
		t.Fatalf("Redis counts %d units after a script that ran past its deadline, want 0", units)
	}
}

// refusedLate counts the scripts Redis refused as past their deadline
// (their error replies, in Redis's error statistics).
func refusedLate(t *testing.T, cli *redis.Client) int64 {
	t.Helper()
	info, err := cli.Info(context.Background(), "errorstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "errorstat_"+lateError+":count="); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}
