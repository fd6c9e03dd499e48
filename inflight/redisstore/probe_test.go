package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
	"github.com/caddy-inflight/caddy-inflight/inflight/storestatus"
	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
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

// TestDownRedisIsSentAGhostOnce: while Redis refuses connections, the
// members of an admission that failed (ghosts) are sent for removal at
// once, then again only on the renewal ticks or once Redis answers: not at
// every poke of the book, which each probe (every 10 ms) made. A book kept
// open for its ghosts after its config went would otherwise dial a dead
// Redis a hundred times a second until they expired.
func TestDownRedisIsSentAGhostOnce(t *testing.T) {
	addr, cli := startRedis(t)
	p := newFaultProxy(t, addr)
	s := newStore(t, store(p.addr, func(s *Store) { s.Lease = caddy.Duration(time.Minute) })) // ticks every 20 s
	limits := &limiter.Limits{Max: []int64{5}}
	zone := fmt.Sprint("ghost", time.Now().UnixNano()) // a count of its own (-count)
	z, _ := zoneOf(s, zone, limits)
	warmUp(t, z, limits, cli)
	p.setDown(true)
	req := request(limits, "k")
	if res := z.Acquire(context.Background(), req, limiter.WaitOptions{}); res.Outcome == limiter.Admitted {
		z.Release(req) // admitted locally (on_error open): its lease goes on a tick
	}
	releases := func() float64 { return storeErrors(t, zone, "release") }
	eventually(t, "the ghost sent at once", func() bool { return releases() >= 1 })
	time.Sleep(time.Second) // about a hundred probes
	if n := releases(); n != 1 {
		t.Errorf("in a second of Redis down with one ghost and no tick: %v failed removals, want 1", n)
	}
}

// lostReply starts an admission of 2 units of key k in z whose script runs in Redis
// but whose reply is lost to a reset; if down, Redis also refuses new
// connections from then on. It returns the admission's outcome.
func lostReply(t *testing.T, z limiter.Store, limits *limiter.Limits, proxy *faultProxy, cli *redis.Client, down bool) limiter.Outcome {
	t.Helper()
	warm := request(limits, "warm") // the zone learns Redis's clock
	if res := z.Acquire(context.Background(), warm, limiter.WaitOptions{}); res.Outcome != limiter.Admitted {
		t.Fatalf("warm-up: %v", res.Outcome)
	}
	z.Release(warm)
	eventually(t, "the warm-up's lease removed", func() bool { return members(t, cli, "t") == 0 })
	proxy.setStall(true)
	done := make(chan limiter.Outcome, 1)
	go func() { done <- z.Acquire(context.Background(), costly(limits, "k", 2), limiter.WaitOptions{}).Outcome }()
	eventually(t, "the admission's script ran in Redis", func() bool { return members(t, cli, "t") == 1 })
	if down {
		proxy.setDown(true)
	} else {
		proxy.dropAll()
	}
	proxy.setStall(false)
	return <-done
}

// TestLostReplyIsRecovered: an admission whose script ran in Redis but
// whose reply was lost to a reset (#29) is sent again on a new connection,
// finds its reply by the call's key, and is admitted with the lease it
// wrote, which it holds: the script ran once (its units counted once), no
// outage is logged, and the release removes the lease.
func TestLostReplyIsRecovered(t *testing.T) {
	addr, cli := startRedis(t)
	proxy := newFaultProxy(t, addr)
	s := newStore(t, store(proxy.addr, func(s *Store) { s.OnError = "closed" }))
	core, logs := observer.New(zap.InfoLevel)
	s.book.outageLog.logger = zap.New(core)
	limits := &limiter.Limits{Max: []int64{5}}
	z, _ := zoneOf(s, "resets", limits)
	if got := lostReply(t, z, limits, proxy, cli, false); got != limiter.Admitted {
		t.Fatalf("an admission whose reply was lost to a reset: %v, want admitted (sent again, it finds its reply)", got)
	}
	if n, units := members(t, cli, "t"), sum(unitsBySet(t, cli, "t")); n != 1 || units != 2 {
		t.Fatalf("%d leases and %d units in Redis, want the one lease the script wrote, its 2 units counted once", n, units)
	}
	s.book.mu.Lock()
	held := len(s.book.leases)
	s.book.mu.Unlock()
	if held != 1 {
		t.Fatalf("the book holds %d leases, want 1: the lease the lost reply wrote is renewed", held)
	}
	if n := logs.Len(); n != 0 {
		t.Fatalf("%d log lines for a reply recovered at once, want none: %v", n, logs.All())
	}
}

// TestLostReplyLeavesNoLeaseUnderResets: an admission whose reply was lost
// and whose second try could not reach Redis is refused (on_error closed)
// and leaves a lease nobody holds; while connections go on being reset
// every 200 ms, it is removed within one renewal interval (lease/3) plus
// the removal's round trip (timeout), as docs/fleet-guarantees.md promises.
func TestLostReplyLeavesNoLeaseUnderResets(t *testing.T) {
	const lease, timeout = 3 * time.Second, time.Second
	addr, cli := startRedis(t)
	proxy := newFaultProxy(t, addr)
	s := newStore(t, store(proxy.addr, func(s *Store) {
		s.OnError, s.Lease, s.Timeout = "closed", caddy.Duration(lease), caddy.Duration(timeout)
	}))
	limits := &limiter.Limits{Max: []int64{5}}
	z, _ := zoneOf(s, "resets", limits)
	if got := lostReply(t, z, limits, proxy, cli, true); got == limiter.Admitted {
		t.Fatal("an admission whose reply was lost and whose second try failed: admitted, want refused (on_error closed)")
	}
	written := time.Now()
	proxy.setDown(false)
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
