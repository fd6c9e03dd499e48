package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// An admission held up on its way to Redis (a stopped Redis, SIGSTOP,
// keeps it in its socket) for longer than the lease writes nothing once it
// arrives, after the book has stopped removing its members as ghosts: no
// ghost holds a slot for a whole lease. Each script carries a deadline in
// Redis's time and writes nothing past it. The proxy holds the admission's
// bytes, not Redis, so that the book's removals in the meantime cannot run
// after it (with SIGSTOP they wait in Redis's sockets too, in any order).
func TestStallLongerThanLeaseLeavesNoGhost(t *testing.T) {
	addr, cli := startRedis(t)
	p := newFaultProxy(t, addr)
	const lease = 2 * time.Second // renewal every 667ms
	s := newStore(t, store(p.addr, func(s *Store) {
		s.Lease, s.Timeout, s.OnError = caddy.Duration(lease), caddy.Duration(100*time.Millisecond), "closed"
	}))
	limits := &limiter.Limits{Max: []int64{1}}
	z, _ := zoneOf(s, "stall", limits)
	observeLogs(s.book)
	warmUp(t, z, limits, cli)

	stop, flush := p.holdRequests()
	if res := z.Acquire(context.Background(), request(limits, "k"), limiter.WaitOptions{}); res.Outcome != limiter.Unavailable {
		t.Fatalf("acquire with its script held up: %v, want store_error (on_error closed)", res.Outcome)
	}
	stop()
	time.Sleep(2 * lease)
	flush() // the admission reaches Redis two leases late
	flushed := time.Now()
	// Sample for a whole lease: a ghost the late script wrote stays so long.
	var held time.Duration
	for time.Since(flushed) < lease+time.Second {
		if members(t, cli, "t") > 0 {
			held = time.Since(flushed)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("a slot was held by an ended request for %v after the script reached Redis", held.Round(10*time.Millisecond))
	if held > lease/3 {
		t.Fatalf("the lease of an admission that reached Redis 2 leases late held a slot %v, want at most one renewal interval (%v)",
			held.Round(10*time.Millisecond), lease/3)
	}
}
