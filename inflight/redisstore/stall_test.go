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

	stop, flush := p.holdRequests(t)
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
// store, a client, the function that lets the renewal reach Redis, and
// whether the renewal carried the skew: a reply to a script sent before
// the hold (a renewal on the book's own tick) that arrives first sets the
// book's clock back to Redis's.
func heldRenewalAfterRelease(t *testing.T, lease, timeout, skew time.Duration) (*Store, *redis.Client, func(), bool) {
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
	stop, flush := p.holdRequests(t)
	skewed := map[*redisClock]int64{}
	b.mu.Lock()
	if len(b.clocks) == 0 {
		b.mu.Unlock()
		t.Fatal("the book learned no Redis clock from the admission's reply")
	}
	for _, c := range b.clocks {
		c.lo += skew.Microseconds()
		skewed[c] = c.lo
	}
	b.mu.Unlock()
	b.renew() // no reply within timeout: its script waits in the network
	stop()
	carried := true
	b.mu.Lock()
	for c, lo := range skewed {
		carried = carried && c.lo >= lo
	}
	b.mu.Unlock()
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
	return s, cli, flush, carried
}

// A renewal whose reply never comes may still reach Redis later (its
// bytes late in the network), after its request ended and the lease was
// removed: past its deadline, it writes nothing.
func TestLateRenewalWritesNothing(t *testing.T) {
	_, cli, flush, _ := heldRenewalAfterRelease(t, 3*time.Second, 300*time.Millisecond, 0)
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
	var cli *redis.Client
	var flush func()
	for attempt := 1; ; attempt++ {
		var carried bool
		if _, cli, flush, carried = heldRenewalAfterRelease(t, lease, timeout, time.Minute); carried {
			break
		}
		flush()
		if attempt == 3 {
			t.Fatal("in 3 attempts, a reply set the book's clock back before the held renewal took its deadline")
		}
	}
	events := leaseEvents(t, cli, "t")
	// Every tick sends the ghost's removal again until it would have
	// expired (lease + timeout after the release): one script each.
	scripts := func() int64 { return commandStats(t, cli)["eval"].calls }
	before := scripts()
	eventually(t, "a tick sent the ghost's removal again", func() bool { return scripts() > before })
	refused := refusedLate(t, cli)
	flush()
	written := events.next(t, "the late renewal writes the lease back", "zadd")
	if late := refusedLate(t, cli); late > refused {
		t.Fatalf("the held renewal was refused as late (%d)", late-refused)
	}
	removed := events.next(t, "the lease the late renewal wrote removed", "zrem")
	took := removed.Sub(written)
	t.Logf("the lease a late renewal wrote back stayed %v", took.Round(time.Millisecond))
	if took > lease/3+timeout {
		t.Fatalf("the lease a late renewal wrote back stayed %v, want at most one renewal interval (lease/3, %v) plus the removal's round trip (timeout, %v)",
			took.Round(time.Millisecond), lease/3, timeout)
	}
	if n := members(t, cli, "t"); n != 0 {
		t.Fatalf("%d leases left after the ghost's removal", n)
	}
}

// leaseChanges are the changes Redis announces to the lease sets under a
// prefix (keyspace notifications), in the order Redis made them: a lease
// that lives shorter than any poll is seen too, and its lifetime is the
// time between its announcements.
type leaseChanges struct{ ch <-chan *redis.Message }

func leaseEvents(t *testing.T, cli *redis.Client, prefix string) *leaseChanges {
	t.Helper()
	ctx := context.Background()
	if err := cli.ConfigSet(ctx, "notify-keyspace-events", "Kz").Err(); err != nil {
		t.Fatal(err)
	}
	sub := cli.PSubscribe(ctx, "__keyspace@0__:"+prefix+":*")
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	return &leaseChanges{sub.Channel()}
}

// next waits for the next change op to a lease set and returns when it
// was announced.
func (l *leaseChanges) next(t *testing.T, what, op string) time.Time {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case m := <-l.ch:
			if m.Payload == op && isLeaseSet(m.Channel) {
				return time.Now()
			}
		case <-timeout:
			t.Fatalf("%s: not after 10s", what)
		}
	}
}
