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

// Scripts held up on their way to Redis (a stopped Redis, SIGSTOP, keeps
// them in its socket) arrive late. The proxy holds their bytes, not Redis,
// so that the book's removals in the meantime cannot run after them (with
// SIGSTOP they wait in Redis's sockets too, in any order).

// refusedLate counts the scripts Redis refused as run past their deadline
// (INFO errorstats).
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

// ranLate waits until a script held since refused (refusedLate's count
// then) has reached Redis: Redis refused it as late, or it wrote a lease.
func ranLate(t *testing.T, cli *redis.Client, refused int64) {
	t.Helper()
	eventually(t, "the held script ran in Redis", func() bool { return refusedLate(t, cli) > refused || members(t, cli, "t") > 0 })
}

// An admission held up on its way to Redis for longer than the lease
// writes nothing once it arrives, after the book has stopped removing its
// members as ghosts: no ghost holds a slot for a whole lease. Each script
// carries a deadline in Redis's time and writes nothing past it.
func TestStallLongerThanLeaseLeavesNoGhost(t *testing.T) {
	addr, cli := startRedis(t)
	p := newFaultProxy(t, addr)
	s := newStore(t, store(p.addr, func(s *Store) {
		s.Lease, s.Timeout, s.OnError = caddy.Duration(time.Second), caddy.Duration(300*time.Millisecond), "closed"
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
	// The book removes the admission's members as ghosts until they would
	// have expired (lease + timeout), then forgets them.
	b := s.book
	eventually(t, "the book forgot the ghost", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.ended) == 0
	})
	refused := refusedLate(t, cli)
	flush() // the admission reaches Redis now, more than a lease late
	ranLate(t, cli, refused)
	if n := members(t, cli, "t"); n != 0 {
		t.Fatalf("the admission that reached Redis after the book forgot its members wrote %d leases, want none: they would hold a slot for a whole lease", n)
	}
}

// heldRenewalAfterRelease admits a request in a store with the given lease
// and timeout, holds a renewal of its lease in the network until the
// renewal has failed (no reply within timeout), then ends the request and
// waits until its lease is gone from Redis. The renewal is sent while
// Redis's clock is behind what the book learned by skew. It returns the
// store, a client and the function that lets the renewal reach Redis.
func heldRenewalAfterRelease(t *testing.T, lease, timeout, skew time.Duration) (*Store, *redis.Client, func()) {
	t.Helper()
	addr, cli := startRedis(t)
	p := newFaultProxy(t, addr)
	s := newStore(t, store(p.addr, func(s *Store) { s.Lease, s.Timeout = caddy.Duration(lease), caddy.Duration(timeout) }))
	limits := &limiter.Limits{Max: []int64{5}}
	z, _ := zoneOf(s, "late-renewal", limits)
	warmUp(t, z, limits, cli)
	req := request(limits, "k")
	mustAdmit(t, z, req, "acquire")

	b := s.book
	b.mu.Lock()
	if len(b.clocks) == 0 {
		b.mu.Unlock()
		t.Fatal("the book learned no Redis clock from the admission's reply")
	}
	for _, c := range b.clocks {
		c.lo += skew.Microseconds()
	}
	b.mu.Unlock()
	stop, flush := p.holdRequests()
	b.renew() // no reply within timeout: its script waits in the network
	stop()
	b.downUntil.Store(0) // the renewal's failure does not keep the release from Redis
	z.Release(req)
	// A renewal on the book's own tick may still write the lease back, and
	// have it removed again: wait until none is under way and the
	// maintainer has sent what it asked for.
	eventually(t, "no renewal under way", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.active == 0
	})
	maintained(t, b)
	eventually(t, "the released lease removed", func() bool { return members(t, cli, "t") == 0 })
	return s, cli, flush
}

// A renewal whose reply never comes may still reach Redis later (its
// bytes late in the network), after its request ended and the lease was
// removed: past its deadline, it writes nothing.
func TestLateRenewalWritesNothing(t *testing.T) {
	_, cli, flush := heldRenewalAfterRelease(t, 3*time.Second, 300*time.Millisecond, 0)
	refused := refusedLate(t, cli)
	flush()
	ranLate(t, cli, refused)
	if n := members(t, cli, "t"); n != 0 {
		t.Fatalf("a renewal that reached Redis past its deadline, after the release, wrote %d leases, want none", n)
	}
}

// Where the deadline does not stop a late renewal (Redis's clock went back,
// or a failover reached a server whose clock lags, and no reply has told
// the book yet), the lease it writes back after the release is removed as
// a ghost on the next tick of the book's maintainer: it holds a slot for
// at most one renewal interval (lease/3) plus the removal's round trip
// (timeout at most). The renewal is let through just after a tick, so the
// lease waits a whole interval.
func TestLateRenewalLeavesNoLease(t *testing.T) {
	const lease, timeout = 3 * time.Second, 300 * time.Millisecond
	_, cli, flush := heldRenewalAfterRelease(t, lease, timeout, time.Minute)
	// Every tick sends the ghost's removal again until it would have
	// expired (lease + timeout after the release): one script each.
	scripts := func() int64 { return commandStats(t, cli)["eval"].calls }
	before := scripts()
	eventually(t, "a tick sent the ghost's removal again", func() bool { return scripts() > before })
	flush()
	flushed := time.Now()
	eventually(t, "the late renewal wrote the lease back", func() bool { return members(t, cli, "t") > 0 })
	eventually(t, "the lease the late renewal wrote removed", func() bool { return members(t, cli, "t") == 0 })
	took := time.Since(flushed)
	t.Logf("the lease a late renewal wrote back stayed %v", took.Round(time.Millisecond))
	if took > lease/3+timeout {
		t.Fatalf("the lease a late renewal wrote back stayed %v, want at most one renewal interval (lease/3, %v) plus the removal's round trip (timeout, %v)",
			took.Round(time.Millisecond), lease/3, timeout)
	}
}
