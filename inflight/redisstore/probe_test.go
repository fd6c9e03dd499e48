package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
	"github.com/caddy-inflight/caddy-inflight/inflight/storestatus"
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
