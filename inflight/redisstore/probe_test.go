package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
	"github.com/caddy-inflight/caddy-inflight/inflight/storestatus"
	"github.com/caddyserver/caddy/v2"
)

// TestRejoinsWhenRedisAnswers: with on_error closed, once Redis answers
// again the store is reachable without any request trying it (the prober's
// PING ends the back-off), and the next request is admitted, not refused
// for the rest of a one-second back-off. The outage is one no call could
// leave a lease in: Redis refused connections from the start, so no
// removal of a lease retries it either. Figure logged: from Redis
// accepting again to the store reachable.
func TestRejoinsWhenRedisAnswers(t *testing.T) {
	addr, _ := startRedis(t)
	proxy := newFaultProxy(t, addr)
	proxy.setDown(true)
	s := newStore(t, store(proxy.addr, func(s *Store) { s.OnError = "closed" }))
	limits := &limiter.Limits{Max: []int64{10}}
	z, _ := zoneOf(s, "rejoin", limits)
	health := func() bool { return z.(storestatus.Reporter).Health().Reachable }
	admit := func() limiter.Outcome {
		req := request(limits, "k")
		res := z.Acquire(context.Background(), req, limiter.WaitOptions{})
		if res.Outcome == limiter.Admitted {
			z.Release(req)
		}
		return res.Outcome
	}
	if got := admit(); got == limiter.Admitted {
		t.Fatal("with Redis refusing connections and on_error closed: admitted, want refused")
	}
	back := time.Now()
	proxy.setDown(false)
	eventually(t, "the store reachable again with no request trying", health)
	t.Logf("reachable %v after Redis accepted again (the back-off is 1 s)", time.Since(back).Round(time.Millisecond))
	if got := admit(); got != limiter.Admitted {
		t.Fatalf("once the store is reachable again: outcome %v, want admitted", got)
	}
}

// TestLostReplyLeavesNoLeaseUnderResets: an admission whose script ran in
// Redis but whose reply was lost to a reset leaves a lease nobody holds;
// while connections go on being reset every 200 ms, it is removed within
// one renewal interval (lease/3) plus the removal's round trip (timeout),
// as docs/fleet.md promises (15-28 ms seen). It does not reproduce the
// case of #29's fault harness, where requests went on through the resets
// and such a lease stayed until it expired in 3 of 6 runs: it passes with
// the back-off's prober removed as well.
func TestLostReplyLeavesNoLeaseUnderResets(t *testing.T) {
	const lease, timeout = 3 * time.Second, time.Second
	addr, cli := startRedis(t)
	proxy := newFaultProxy(t, addr)
	s := newStore(t, store(proxy.addr, func(s *Store) {
		s.OnError, s.Lease, s.Timeout = "closed", caddy.Duration(lease), caddy.Duration(timeout)
	}))
	limits := &limiter.Limits{Max: []int64{5}}
	z, _ := zoneOf(s, "resets", limits)
	warm := request(limits, "warm") // the zone learns Redis's clock
	if res := z.Acquire(context.Background(), warm, limiter.WaitOptions{}); res.Outcome != limiter.Admitted {
		t.Fatalf("warm-up: %v", res.Outcome)
	}
	z.Release(warm)
	eventually(t, "the warm-up's lease removed", func() bool { return members(t, cli, "t") == 0 })

	proxy.setStall(true)
	done := make(chan limiter.Outcome, 1)
	go func() { done <- z.Acquire(context.Background(), request(limits, "k"), limiter.WaitOptions{}).Outcome }()
	eventually(t, "the admission's script ran in Redis", func() bool { return members(t, cli, "t") == 1 })
	proxy.dropAll() // its reply is lost
	proxy.setStall(false)
	written := time.Now()
	if got := <-done; got == limiter.Admitted {
		t.Fatal("an admission whose reply was lost: admitted, want refused (on_error closed)")
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
				proxy.dropAll()
			}
		}
	}()
	eventually(t, "the lease nobody holds removed", func() bool { return members(t, cli, "t") == 0 })
	took := time.Since(written)
	t.Logf("the lease of the lost reply stayed %v", took.Round(time.Millisecond))
	if took > lease/3+timeout {
		t.Fatalf("the lease of a lost reply stayed %v under resets, want at most one renewal interval (%v) plus the removal's round trip (%v)", took.Round(time.Millisecond), lease/3, timeout)
	}
}
