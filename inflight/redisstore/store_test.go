package redisstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
	"github.com/caddy-inflight/caddy-inflight/inflight/storestatus"
)

// mustAdmit acquires req without waiting, and fails the test unless it is
// admitted.
func mustAdmit(t *testing.T, z limiter.Store, req *limiter.Request, what string) {
	t.Helper()
	if res := z.Acquire(context.Background(), req, limiter.WaitOptions{}); res.Outcome != limiter.Admitted {
		t.Fatalf("%s: %v, want admitted", what, res.Outcome)
	}
}

// warmUp admits and releases one request, so that the connection is open
// and the admission script loaded before a test stalls Redis.
func warmUp(t *testing.T, z limiter.Store, limits *limiter.Limits, cli *redis.Client) {
	t.Helper()
	warm := request(limits, "warm")
	mustAdmit(t, z, warm, "warm-up")
	z.Release(warm)
	eventually(t, "warm-up released", func() bool { return members(t, cli, "t") == 0 })
	// The release's call may still wait for its reply: a test that holds
	// Redis's replies back now would hold the zone's next call behind it.
	// And its removal may be in Redis and not yet settled in the book: the
	// zone's next admission would send it again (ahead of a removal it may
	// overtake), a command the test did not make.
	rz := z.(*redisZone)
	eventually(t, "no call under way, no removal unsettled", func() bool {
		rz.callMu.Lock()
		calling := rz.calling
		rz.callMu.Unlock()
		rz.book.mu.Lock()
		defer rz.book.mu.Unlock()
		return !calling && len(rz.book.ended) == 0
	})
}

func store(addr string, opts func(*Store)) *Store {
	s := &Store{Address: []string{addr}, KeyPrefix: "t", Timeout: caddy.Duration(2 * time.Second)}
	if opts != nil {
		opts(s)
	}
	return s
}

// The total is enforced through Redis, and the local total comes back to
// zero on release, never below.
func TestTotalIsEnforced(t *testing.T) {
	addr, cli := startRedis(t)
	s := newStore(t, store(addr, nil))
	limits := &limiter.Limits{Max: []int64{5}, Total: 2}
	z, local := zoneOf(s, "total", limits)
	var held []*limiter.Request
	for i := range 3 {
		req := request(limits, fmt.Sprint("tenant", i))
		res := z.Acquire(context.Background(), req, limiter.WaitOptions{})
		if i < 2 && res.Outcome != limiter.Admitted {
			t.Fatalf("request %d: %v, want admitted", i, res.Outcome)
		}
		if i == 2 {
			if res.Outcome != limiter.Full || res.Dim != limiter.TotalDim {
				t.Fatalf("third tenant: outcome %v dim %d, want full by the total", res.Outcome, res.Dim)
			}
			continue
		}
		held = append(held, req)
	}
	if n := local.Held(limiter.TotalDim); n != 2 {
		t.Fatalf("local total %d while 2 are held, want 2", n)
	}
	for _, req := range held {
		z.Release(req)
	}
	if n := local.Held(limiter.TotalDim); n != 0 {
		t.Fatalf("local total %d after every release, want 0", n)
	}
	eventually(t, "leases removed from Redis", func() bool { return members(t, cli, "t") == 0 })
}

// An admission whose reply comes after the timeout leaves no lease in
// Redis that nobody renews or releases.
func TestLateReplyLeavesNoGhost(t *testing.T) {
	addr, cli := startRedis(t)
	p := newFaultProxy(t, addr)
	s := newStore(t, store(p.addr, func(s *Store) { s.Timeout = caddy.Duration(100 * time.Millisecond) }))
	limits := &limiter.Limits{Max: []int64{5}}
	z, _ := zoneOf(s, "ghost", limits)
	warmUp(t, z, limits, cli)

	p.setStall(true)
	req := request(limits, "a")
	// The reply never comes within timeout: admitted locally (on_error
	// open), while the script runs on Redis all the same.
	if res := z.Acquire(context.Background(), req, limiter.WaitOptions{}); res.Outcome != limiter.Admitted {
		t.Fatalf("acquire with Redis stalled: %v, want admitted locally", res.Outcome)
	}
	z.Release(req)
	p.setStall(false)
	eventually(t, "no lease left in Redis once the request ended", func() bool { return members(t, cli, "t") == 0 })
}

// A reload that changes a store option keeps the old client open while its
// requests still run: their releases reach Redis and their leases go.
func TestReloadChangingOptionsKeepsLeases(t *testing.T) {
	addr, cli := startRedis(t)
	limits := &limiter.Limits{Max: []int64{5}}
	old := newStore(t, store(addr, nil))
	z, _ := zoneOf(old, "reload", limits)
	req := request(limits, "a")
	mustAdmit(t, z, req, "acquire")
	newStore(t, store(addr, func(s *Store) { s.Timeout = caddy.Duration(3 * time.Second) }))
	old.Cleanup() // the old config goes, its request still runs
	if n := members(t, cli, "t"); n != 1 {
		t.Fatalf("%d leases in Redis, want 1", n)
	}
	z.Release(req)
	eventually(t, "lease released through the old config's client", func() bool { return members(t, cli, "t") == 0 })
}

// A client's own cancellation is not a Redis failure: with on_error closed,
// other clients are still admitted.
func TestClientCancellationIsNotUnavailable(t *testing.T) {
	addr, _ := startRedis(t)
	s := newStore(t, store(addr, func(s *Store) { s.OnError = "closed" }))
	limits := &limiter.Limits{Max: []int64{5}}
	z, _ := zoneOf(s, "cancel", limits)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	first := request(limits, "leaver")
	if res := z.Acquire(ctx, first, limiter.WaitOptions{}); res.Outcome == limiter.Admitted {
		z.Release(first)
	}
	res := z.Acquire(context.Background(), request(limits, "other"), limiter.WaitOptions{})
	if res.Outcome != limiter.Admitted {
		t.Fatalf("another client after a cancellation: %v, want admitted", res.Outcome)
	}
}

// Leases Redis lost (FLUSHALL) are re-created by the renewal, so the fleet
// does not over-admit while their requests run.
func TestRenewalRecreatesLostLeases(t *testing.T) {
	addr, cli := startRedis(t)
	s := newStore(t, store(addr, func(s *Store) { s.Lease = caddy.Duration(3 * time.Second) }))
	limits := &limiter.Limits{Max: []int64{1}}
	z, _ := zoneOf(s, "flush", limits)
	mustAdmit(t, z, request(limits, "a"), "acquire")
	cli.FlushAll(context.Background())
	eventually(t, "lease re-created by renewal", func() bool { return members(t, cli, "t") == 1 })
	other, _ := zoneOf(newStore(t, store(addr, func(s *Store) { s.Timeout = caddy.Duration(3 * time.Second) })), "flush", limits)
	if res := other.Acquire(context.Background(), request(limits, "a"), limiter.WaitOptions{}); res.Outcome != limiter.Full {
		t.Fatalf("another instance, same key, after renewal: %v, want full", res.Outcome)
	}
}

// Requests admitted locally while Redis was unreachable (on_error open) are
// entered into Redis when it comes back.
func TestLocalAdmissionsEnterRedisWhenItReturns(t *testing.T) {
	addr, cli := startRedis(t)
	p := newFaultProxy(t, addr)
	s := newStore(t, store(p.addr, func(s *Store) {
		s.Lease = caddy.Duration(3 * time.Second)
		s.Timeout = caddy.Duration(200 * time.Millisecond)
	}))
	limits := &limiter.Limits{Max: []int64{1}}
	z, _ := zoneOf(s, "outage", limits)
	p.setDown(true)
	mustAdmit(t, z, request(limits, "a"), "acquire while Redis is down (on_error open)")
	p.setDown(false)
	eventually(t, "local admission entered into Redis", func() bool { return members(t, cli, "t") == 1 })
}

// TestRejoinWritesLeasesBackFirst: once Redis answers again after an
// outage (here with none of the leases: it was down, as after a restart
// with empty data), the instance admits through it only once its leases
// are written back; until then it keeps to its local share (on_error
// open), so Redis's empty sets do not let it admit a cap on top of what
// it holds (#29: requests admitted after their instance rejoined had no
// lease in Redis for up to 0.57 s).
func TestRejoinWritesLeasesBackFirst(t *testing.T) {
	addr, cli := startRedis(t)
	p := newFaultProxy(t, addr)
	s := newStore(t, store(p.addr, func(s *Store) { s.Timeout = caddy.Duration(200 * time.Millisecond) }))
	limits := &limiter.Limits{Max: []int64{2}}
	z, _ := zoneOf(s, "rejoin", limits)
	p.setDown(true)
	mustAdmit(t, z, request(limits, "a"), "acquire while Redis is down (on_error open)")
	held := make(chan struct{})
	s.book.renewGate.Store(&held)
	p.setDown(false)
	eventually(t, "Redis answered the prober", func() bool { return !s.book.outage.Load() })
	admitted := 0
	for range 2 {
		if z.Acquire(context.Background(), request(limits, "a"), limiter.WaitOptions{}).Outcome == limiter.Admitted {
			admitted++
		}
	}
	if admitted > 1 {
		t.Fatalf("before its lease was written back, %d more of a cap of 2 admitted beside the one it holds, want at most 1", admitted)
	}
	close(held)
	eventually(t, "both leases written back", func() bool { return members(t, cli, "t") == 2 })
	// The call that wrote them back sets the health once Redis has
	// answered it: wait for that, not for the moment the leases show.
	eventually(t, "reachable once the leases are back", func() bool { return z.(storestatus.Reporter).Health().Reachable })
}

// TestWaiterAloneMovesToRedisWhenItAnswers: a request that waits alone
// while Redis is away (on_error open) goes on waiting through Redis once
// Redis answers: a slot freed locally then does not admit it on top of
// what Redis counts for the fleet (here another instance's lease, which
// fills the cap until it expires); it is admitted once Redis has room.
func TestWaiterAloneMovesToRedisWhenItAnswers(t *testing.T) {
	addr, cli := startRedis(t)
	p := newFaultProxy(t, addr)
	s := newStore(t, store(p.addr, func(s *Store) { s.Timeout = caddy.Duration(200 * time.Millisecond) }))
	limits := &limiter.Limits{Max: []int64{1}}
	z, local := zoneOf(s, "alone", limits)
	warm := request(limits, "warm") // the zone learns Redis's clock
	mustAdmit(t, z, warm, "warm-up")
	z.Release(warm)
	set := z.(*redisZone).tag + ":" + z.(*redisZone).fairKey(0, "k")
	ctx := context.Background()
	expires := time.Now().Add(1500 * time.Millisecond)
	cli.ZAdd(ctx, set, redis.Z{Score: float64(expires.UnixMilli()), Member: "other:1:1"}) // another instance's lease of one unit
	p.setDown(true)
	holder := request(limits, "k")
	mustAdmit(t, z, holder, "acquire while Redis is down (on_error open)")
	queued := make(chan struct{}, 2)
	got := make(chan limiter.Result, 1)
	go func() {
		got <- z.Acquire(ctx, request(limits, "k"), limiter.WaitOptions{Wait: 10 * time.Second, Queued: func() { queued <- struct{}{} }})
	}()
	<-queued
	p.setDown(false)
	eventually(t, "the waiter moved to Redis", func() bool { return local.WaitingOutside() == 1 })
	z.Release(holder) // room locally, none in Redis: the other lease fills it
	select {
	case r := <-got:
		t.Fatalf("the waiter ended (%v, alone %v) while Redis's cap was full, want it waiting through Redis", r.Outcome, r.Alone)
	case <-time.After(time.Until(expires) - 300*time.Millisecond):
	}
	r := <-got
	if r.Outcome != limiter.Admitted || r.Alone {
		t.Fatalf("once Redis had room: %v (alone %v), want admitted through Redis", r.Outcome, r.Alone)
	}
	if len(queued) != 0 {
		t.Fatal("queued announced twice, want once though it waited alone and then through Redis")
	}
	t.Logf("admitted %v after the other lease expired", time.Since(expires).Round(time.Millisecond))
}

// A newcomer does not overtake this instance's waiters.
func TestNewcomerDoesNotOvertakeWaiter(t *testing.T) {
	addr, cli := startRedis(t)
	s := newStore(t, store(addr, nil))
	limits := &limiter.Limits{Max: []int64{1}}
	z, local := zoneOf(s, "fifo", limits)
	holder := request(limits, "k")
	mustAdmit(t, z, holder, "holder")
	waited := make(chan limiter.Result, 1)
	go func() {
		waited <- z.Acquire(context.Background(), request(limits, "k"), limiter.WaitOptions{Wait: 10 * time.Second})
	}()
	eventually(t, "waiter queued", func() bool { return local.WaitingOutside() == 1 })
	// The slot frees in Redis without a notice (as another instance's
	// release whose message was lost): the next dispatch is up to a poll
	// away, and a newcomer arrives first.
	keys, _ := cli.Keys(context.Background(), "t:*:client:*").Result()
	if len(keys) != 1 { // the set (of one lease of one unit: no count in it)
		t.Fatalf("keys %v, want one set", keys)
	}
	cli.Del(context.Background(), keys...)
	if res := z.Acquire(context.Background(), request(limits, "k"), limiter.WaitOptions{}); res.Outcome != limiter.Full {
		t.Fatalf("newcomer while a waiter fits: %v, want full", res.Outcome)
	}
	if res := <-waited; res.Outcome != limiter.Admitted {
		t.Fatalf("waiter: %v, want admitted", res.Outcome)
	}
}

// Waiters on Redis move to the limits of a new config.
func TestWaitersMoveToNewLimits(t *testing.T) {
	addr, _ := startRedis(t)
	s := newStore(t, store(addr, nil))
	limits := &limiter.Limits{Max: []int64{1}}
	z, local := zoneOf(s, "raise", limits)
	mustAdmit(t, z, request(limits, "k"), "holder")
	waited := make(chan limiter.Result, 1)
	go func() {
		waited <- z.Acquire(context.Background(), request(limits, "k"), limiter.WaitOptions{Wait: 5 * time.Second})
	}()
	eventually(t, "waiter queued", func() bool { return local.WaitingOutside() == 1 })
	local.Adopt(&limiter.Limits{Max: []int64{2}}) // a reload raises the max
	local.Retire(limits)
	if res := <-waited; res.Outcome != limiter.Admitted {
		t.Fatalf("waiter after the max was raised to 2: %v, want admitted", res.Outcome)
	}
}

// A release publishes a notice only when someone waits.
func TestReleasePublishesOnlyWhenSomeoneWaits(t *testing.T) {
	addr, cli := startRedis(t)
	ctx := context.Background()
	sub := cli.PSubscribe(ctx, "t:*")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, store(addr, nil))
	limits := &limiter.Limits{Max: []int64{1}}
	z, _ := zoneOf(s, "quiet", limits)
	req := request(limits, "k")
	if res := z.Acquire(ctx, req, limiter.WaitOptions{}); res.Outcome != limiter.Admitted {
		t.Fatalf("acquire: %v", res.Outcome)
	}
	z.Release(req)
	eventually(t, "released", func() bool { return members(t, cli, "t") == 0 })
	cli.Publish(ctx, "t:marker", "after the release")
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Channel != "t:marker" {
		t.Fatalf("first notice on %s, want none before the marker: a release published with no waiter", msg.Channel)
	}
}

// Release does not wait for Redis: the response's end is not delayed.
func TestReleaseDoesNotWaitForRedis(t *testing.T) {
	addr, cli := startRedis(t)
	p := newFaultProxy(t, addr)
	s := newStore(t, store(p.addr, func(s *Store) { s.Timeout = caddy.Duration(time.Minute) }))
	limits := &limiter.Limits{Max: []int64{1}}
	z, local := zoneOf(s, "fast", limits)
	req := request(limits, "k")
	mustAdmit(t, z, req, "acquire")
	p.setStall(true)
	done := make(chan struct{})
	go func() { z.Release(req); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Release waited for a stalled Redis")
	}
	if n := local.Held(0); n != 0 {
		t.Fatalf("local count %d after Release, want 0", n)
	}
	p.setStall(false)
	eventually(t, "lease removed once Redis answers", func() bool { return members(t, cli, "t") == 0 })
}

// A zone that left and came back counts its requests in its new local
// zone: metrics show what Redis holds for it, not 0.
func TestZoneThatCameBackCountsLocally(t *testing.T) {
	addr, _ := startRedis(t)
	s := newStore(t, store(addr, nil))
	limits := &limiter.Limits{Max: []int64{5}}
	zoneOf(s, "back", limits)
	z, local := zoneOf(s, "back", limits) // a new local zone, same name
	mustAdmit(t, z, request(limits, "k"), "acquire")
	if n := local.Held(0); n != 1 {
		t.Fatalf("the zone's local count is %d with one request held, want 1", n)
	}
}

// An outage is logged once when it starts and once when it ends, a quiet
// after Redis answered (outageQuiet, a second; the test sets its own, and
// the integration fault suite checks the second), however the connections
// flap within it; clients that cancel log nothing (not "unreachable" each
// time).
func TestOutageLoggedOnceEachWay(t *testing.T) {
	addr, _ := startRedis(t)
	p := newFaultProxy(t, addr)
	s := newStore(t, store(p.addr, func(s *Store) { s.Timeout = caddy.Duration(200 * time.Millisecond) }))
	core, logs := observer.New(zap.InfoLevel)
	s.book.outageLog.logger = zap.New(core)
	limits := &limiter.Limits{Max: []int64{100}}
	z, _ := zoneOf(s, "log", limits)
	for range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if req := request(limits, "leaver"); z.Acquire(ctx, req, limiter.WaitOptions{}).Outcome == limiter.Admitted {
			z.Release(req)
		}
		mustAdmit(t, z, request(limits, "stayer"), "a client after another cancelled")
	}
	if n := logs.Len(); n != 0 {
		t.Fatalf("%d log lines while clients cancelled, want none: %v", n, logs.All())
	}
	// A quiet no step of the test outlasts, however slow the machine: each
	// failure after a recovery is a flap, and the log waits until told.
	setQuiet := func(d time.Duration) {
		s.book.outageLog.mu.Lock()
		s.book.outageLog.quiet = d
		s.book.outageLog.mu.Unlock()
	}
	setQuiet(time.Hour)
	p.setDown(true)
	for range 3 {
		s.book.downUntil.Store(0) // try Redis again at once, as a second later
		z.Acquire(context.Background(), request(limits, "k"), limiter.WaitOptions{})
	}
	reachable := func() bool {
		if req := request(limits, "k"); z.Acquire(context.Background(), req, limiter.WaitOptions{}).Outcome == limiter.Admitted {
			z.Release(req)
		}
		return z.(storestatus.Reporter).Health().Reachable
	}
	for range 2 { // answers, then fails again within the second: a flap
		p.setDown(false)
		s.book.downUntil.Store(0)
		eventually(t, "the store reachable", reachable)
		p.setDown(true)
		// A call sent before the latest answer is the outage's tail, not a
		// flap (a renewal may answer after it started), though it too makes
		// Health unreachable for the back-off: fail until an outage opens.
		eventually(t, "the outage open again", func() bool {
			s.book.downUntil.Store(0)
			z.Acquire(context.Background(), request(limits, "k"), limiter.WaitOptions{})
			return s.book.outage.Load()
		})
	}
	p.setDown(false)
	s.book.downUntil.Store(0)
	mustAdmit(t, z, request(limits, "k"), "once Redis answers")
	eventually(t, "the store reachable", func() bool { return z.(storestatus.Reporter).Health().Reachable })
	if n := logs.FilterMessage("redis store reachable again").Len(); n != 0 {
		t.Fatal("the outage logged as over before the store was reachable, want only the log to wait")
	}
	setQuiet(10 * time.Millisecond)
	s.book.outageLog.up() // armed again with the short quiet, as a later answer would
	eventually(t, "the outage logged as over", func() bool { return logs.FilterMessage("redis store reachable again").Len() > 0 })
	if f := logs.FilterMessage("redis store reachable again").All()[0].ContextMap()["flaps"]; f != int64(2) {
		t.Errorf("the closing line counts %v flaps, want 2", f)
	}
	got := []string{}
	explained := map[any]int{}
	for _, e := range logs.All() {
		if e.Message == "redis store operation failed" { // another operation's first failure in the outage
			if explained[e.ContextMap()["op"]]++; explained[e.ContextMap()["op"]] > 1 {
				t.Errorf("op %v's failure logged more than once in one outage", e.ContextMap()["op"])
			}
			continue
		}
		got = append(got, e.Message)
	}
	if !slices.Equal(got, []string{"redis store unreachable", "redis store reachable again"}) {
		t.Fatalf("log lines %q, want one when the outage starts and one when it ends", got)
	}
}

// With store redis, max_keys bounds the keys this instance holds.
func TestMaxKeysBoundsThisInstancesKeys(t *testing.T) {
	addr, cli := startRedis(t)
	s := newStore(t, store(addr, nil))
	limits := &limiter.Limits{Max: []int64{5}, MaxKeys: 2}
	z, local := zoneOf(s, "keys", limits)
	b := request(limits, "b")
	mustAdmit(t, z, request(limits, "a"), "key a")
	mustAdmit(t, z, b, "key b")
	if res := z.Acquire(context.Background(), request(limits, "c"), limiter.WaitOptions{}); res.Outcome != limiter.KeysFull || res.Dim != 0 {
		t.Fatalf("a third key under max_keys 2: %v (dim %d), want keys_full", res.Outcome, res.Dim)
	}
	mustAdmit(t, z, request(limits, "a"), "key a again")
	if n := members(t, cli, "t"); n != 3 {
		t.Fatalf("%d leases in Redis, want 3 (the refused key takes none)", n)
	}
	z.Release(b)
	mustAdmit(t, z, request(limits, "c"), "key c once b left")
	if n := local.Keys(0); n != 2 {
		t.Fatalf("%d keys held locally, want 2", n)
	}
}

// A reload that drops the old config's use of the client while one of its
// requests is being admitted does not close the client under it: the
// admission succeeds and Redis is not logged unreachable.
func TestReloadDuringAdmissionKeepsTheClient(t *testing.T) {
	addr, cli := startRedis(t)
	p := newFaultProxy(t, addr)
	old := newStore(t, store(p.addr, func(s *Store) { s.OnError = "closed" }))
	limits := &limiter.Limits{Max: []int64{5}}
	z, _ := zoneOf(old, "mid", limits)
	warmUp(t, z, limits, cli)

	p.setStall(true)
	admitted := make(chan limiter.Result, 1)
	go func() { admitted <- z.Acquire(context.Background(), request(limits, "k"), limiter.WaitOptions{}) }()
	eventually(t, "the admission reached Redis", func() bool { return members(t, cli, "t") == 1 })
	b := old.book
	old.Cleanup()    // the reload: nothing else holds the old client
	maintained(t, b) // it would close the client under the admission now, if it could
	p.setStall(false)
	if res := <-admitted; res.Outcome != limiter.Admitted {
		t.Fatalf("admission in flight across the reload: %v, want admitted", res.Outcome)
	}
}

// Releasing off the response path must not refuse a client's next request:
// a client with a cap of 1 that sends its next request as soon as it has a
// response is admitted every time.
func TestNextRequestAfterReleaseIsAdmitted(t *testing.T) {
	addr, _ := startRedis(t)
	s := newStore(t, store(addr, nil))
	limits := &limiter.Limits{Max: []int64{1}}
	z, _ := zoneOf(s, "next", limits)
	for i := range 200 {
		req := request(limits, "k")
		mustAdmit(t, z, req, fmt.Sprint("request ", i, " right after the previous one's release"))
		z.Release(req)
	}
}

// A renewal and a release run concurrently: if the removal reaches Redis
// before the renewal that still wrote the lease, the lease must be removed
// again, not left renewed in Redis.
func TestReleaseDuringRenewalLeavesNoLease(t *testing.T) {
	addr, cli := startRedis(t)
	s := newStore(t, store(addr, nil))
	limits := &limiter.Limits{Max: []int64{5}}
	z, _ := zoneOf(s, "race", limits)
	req := request(limits, "k")
	mustAdmit(t, z, req, "acquire")
	b := s.book
	member := onlyLease(t, b)
	b.mu.Lock()
	renewing := map[string]*lease{member: b.leases[member]} // a renewal's snapshot
	sets := b.leases[member].sets
	b.mu.Unlock()
	z.Release(req)
	eventually(t, "lease removed", func() bool { return members(t, cli, "t") == 0 })
	cli.ZAdd(context.Background(), sets[0], redis.Z{Score: float64(time.Now().Add(time.Minute).UnixMilli()), Member: member}) // the renewal lands late
	b.removeAgain(renewing, false)
	eventually(t, "lease removed again after the renewal", func() bool { return members(t, cli, "t") == 0 })
}

// A lease released while a renewal that wrote it was under way is removed
// again after that renewal, even when two scripts removed it first (a
// removal of its own and an admission call that overtook it): the zone's
// next admission call removes it before it checks the sets, so the fleet
// does not count it for a whole lease after its request ended.
func TestLeaseRemovedTwiceThenRenewedIsRemovedByTheNextCall(t *testing.T) {
	addr, cli := startRedis(t)
	s := newStore(t, store(addr, func(s *Store) { s.Lease = caddy.Duration(time.Minute) })) // no tick meanwhile
	limits := &limiter.Limits{Max: []int64{5}}
	z, _ := zoneOf(s, "removed-twice", limits)
	rz := z.(*redisZone)
	req := request(limits, "k")
	mustAdmit(t, z, req, "acquire")
	b := s.book
	member := onlyLease(t, b)
	b.mu.Lock()
	renewing := map[string]*lease{member: b.leases[member]} // a renewal's snapshot
	sets := b.leases[member].sets
	b.mu.Unlock()

	// An admission call is under way, so the release leaves the removal to
	// the calls: the test sends it, once alone and once in a call that
	// overtakes it, and the removal of its own is answered first.
	rz.callMu.Lock()
	rz.calling = true
	rz.callMu.Unlock()
	z.Release(req)
	alone, aloneSent := b.claim(rz.tag, true)
	_, callSent := b.claim(rz.tag, false)
	if len(aloneSent) != 1 || len(callSent) != 1 {
		t.Fatalf("the ended lease was sent by %d removals of its own and %d calls, want 1 each", len(aloneSent), len(callSent))
	}
	if err := releaseScript.Run(context.Background(), b.client, append([]string{rz.tag + ":waiting"}, alone.keys...), append([]any{rz.tag + ":released"}, alone.args...)...).Err(); err != nil {
		t.Fatal(err)
	}
	b.settle(rz.tag, aloneSent, true)
	b.settle(rz.tag, callSent, true)

	// The renewal lands after both removals and writes the lease back.
	cli.ZAdd(context.Background(), sets[0], redis.Z{Score: float64(time.Now().Add(time.Minute).UnixMilli()), Member: member})
	b.removeAgain(renewing, false)

	next := request(limits, "other")
	mustAdmit(t, z, next, "the next request")
	if n := members(t, cli, "t"); n != 1 {
		t.Fatalf("after the next admission call Redis holds %d leases, want 1 (the next request's): the ended lease the renewal wrote back was not removed", n)
	}
	z.Release(next)
	eventually(t, "the next request's lease removed", func() bool { return members(t, cli, "t") == 0 })
}

// A second Release of a request the store admitted panics, as the zone's
// own does, and gives nothing back twice, here or in Redis.
func TestSecondReleasePanics(t *testing.T) {
	addr, cli := startRedis(t)
	s := newStore(t, store(addr, nil))
	limits := &limiter.Limits{Max: []int64{5}, Total: 5}
	z, local := zoneOf(s, "twice", limits)
	a, b := request(limits, "k"), request(limits, "k")
	a.Cost, b.Cost = 3, 2
	for _, r := range []*limiter.Request{a, b} {
		if res := z.Acquire(context.Background(), r, limiter.WaitOptions{}); res.Outcome != limiter.Admitted {
			t.Fatalf("cost %d: %v, want admitted", r.Cost, res.Outcome)
		}
	}
	z.Release(a)
	if !panics(func() { z.Release(a) }) {
		t.Error("a second Release returned quietly, want a panic")
	}
	if n := local.Held(limiter.TotalDim); n != 2 {
		t.Errorf("local total %d units after a second Release, want 2 (b's)", n)
	}
	big := request(limits, "k")
	big.Cost = 4
	if res := z.Acquire(context.Background(), big, limiter.WaitOptions{}); res.Outcome != limiter.Full {
		t.Errorf("cost 4 beside b's 2 under a cap of 5: %v, want refused", res.Outcome)
		z.Release(big)
	}
	z.Release(b)
	eventually(t, "leases removed from Redis", func() bool { return members(t, cli, "t") == 0 })
}

func panics(f func()) (p bool) {
	defer func() { p = recover() != nil }()
	f()
	return false
}

// Under max_keys, requests that wait and newcomers admitted through Redis
// at once, behind a network of 3 ms, never exceed a key's cap or the key
// bound in this instance, and leave every count at zero: the store's calls
// write no field of a waiting request that its queue reads (go test -race).
func TestMaxKeysUnderConcurrentWaiters(t *testing.T) {
	addr, cli := startRedis(t)
	p := newFaultProxy(t, addr)
	p.mu.Lock()
	p.delay = 3 * time.Millisecond
	p.mu.Unlock()
	s := newStore(t, store(p.addr, nil))
	limits := &limiter.Limits{Max: []int64{2}, MaxKeys: 3}
	z, local := zoneOf(s, "keysrace", limits)
	const workers, rounds = 24, 8
	var inFlight [4]atomic.Int64
	var over, admitted atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				k := (w + i) % len(inFlight)
				req := request(limits, fmt.Sprint("key", k))
				req.Cost = int64(1 + i%2)
				res := z.Acquire(context.Background(), req, limiter.WaitOptions{Wait: 2 * time.Second, Class: limiter.Class(w % 3)})
				if res.Outcome != limiter.Admitted {
					continue
				}
				admitted.Add(1)
				if n := inFlight[k].Add(req.Units()); n > 2 {
					over.Add(1)
				}
				if local.Keys(0) > 3 {
					over.Add(1)
				}
				time.Sleep(time.Millisecond)
				inFlight[k].Add(-req.Units())
				z.Release(req)
			}
		})
	}
	wg.Wait()
	if over.Load() != 0 || admitted.Load() == 0 {
		t.Fatalf("%d admissions over a cap or the key bound, %d admitted; want 0 over, some admitted", over.Load(), admitted.Load())
	}
	if local.Held(0) != 0 || local.Keys(0) != 0 {
		t.Fatalf("after every release: %d units and %d keys held locally, want 0", local.Held(0), local.Keys(0))
	}
	eventually(t, "leases removed from Redis", func() bool { return members(t, cli, "t") == 0 })
}

// noPoll is a clock whose timers never fire: a shared queue on it never
// polls, so only a release notice can wake its waiters.
type noPoll struct{}

func (noPoll) Now() time.Time { return time.Now() }
func (noPoll) After(time.Duration) (<-chan time.Time, func() bool) {
	return nil, func() bool { return true }
}

// A waiter is woken by the notice of a release on another instance, not
// by its poll: its queue never polls here, and it is admitted once the
// other instance gives the slot back.
func TestWaiterWokenByAnotherInstancesRelease(t *testing.T) {
	addr, _ := startRedis(t)
	limits := &limiter.Limits{Max: []int64{1}}
	other, _ := zoneOf(newStore(t, store(addr, nil)), "wake", limits)
	holder := request(limits, "k")
	mustAdmit(t, other, holder, "holder")

	local := limiter.NewZone(1, false, noPoll{})
	local.Adopt(limits)
	z := newStore(t, store(addr, nil)).Bind("wake", []string{"client"}, false, local)
	waiter := request(limits, "k")
	waited := make(chan limiter.Result, 1)
	go func() { waited <- z.Acquire(context.Background(), waiter, limiter.WaitOptions{Wait: time.Hour}) }()
	eventually(t, "waiter queued", func() bool { return local.WaitingOutside() == 1 })
	other.Release(holder)
	select {
	case res := <-waited:
		if res.Outcome != limiter.Admitted {
			t.Fatalf("waiter: %v, want admitted", res.Outcome)
		}
		z.Release(waiter)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not admitted 10 s after the other instance's release: no notice woke it (its queue never polls)")
	}
}
