package redisstore

import (
	"context"
	"fmt"
	"runtime"
	"strings"
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

// A book's client closes once nothing uses it. These tests are the ways
// something still did when it closed: CI saw "use of closed network
// connection" logged as an outage while reloads changed store options.

// isOpen reports whether b's client is open.
func isOpen(b *book) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.client != nil
}

// maintained waits until b's maintainer has run a whole round (its
// removals, then closing the book if nothing needs it) that began after
// the call: it takes a poke only between rounds, so once it has taken two
// in turn, the round the first began is over. A book that closed has no
// maintainer, and its last round is over too.
func maintained(t *testing.T, b *book) {
	t.Helper()
	for range 2 {
		b.poke()
		eventually(t, "the book's maintainer took its poke", func() bool { return len(b.work) == 0 || !isOpen(b) })
	}
}

// observeLogs sends b's log lines to the returned recorder.
func observeLogs(b *book) *observer.ObservedLogs {
	core, logs := observer.New(zap.InfoLevel)
	b.outageLog.logger = zap.New(core)
	return logs
}

// Caddy cleans up an old config without waiting for its servers, so a
// request the old server read just before a reload can reach the old
// handler after the old config's book closed. It is admitted in Redis all
// the same, and the book closes again once the request is over.
func TestRequestAfterCleanupIsAdmitted(t *testing.T) {
	addr, cli := startRedis(t)
	old := newStore(t, store(addr, func(s *Store) { s.OnError = "closed" }))
	logs := observeLogs(old.book)
	limits := &limiter.Limits{Max: []int64{1}}
	z, _ := zoneOf(old, "late", limits)
	warmUp(t, z, limits, cli)
	b := old.book
	old.Cleanup() // the reload: nothing else uses the book
	eventually(t, "the unused book closed", func() bool { return !isOpen(b) })

	req := request(limits, "k")
	mustAdmit(t, z, req, "a request reaching the old handler after its cleanup")
	if n := members(t, cli, "t"); n != 1 {
		t.Fatalf("%d leases in Redis while the late request runs, want 1", n)
	}
	if res := z.Acquire(context.Background(), request(limits, "k"), limiter.WaitOptions{}); res.Outcome != limiter.Full {
		t.Fatalf("a second request of the capped key: %v, want full", res.Outcome)
	}
	z.Release(req)
	eventually(t, "the late request's lease removed", func() bool { return members(t, cli, "t") == 0 })
	eventually(t, "the book closed again", func() bool { return !isOpen(b) })
	if n := logs.Len(); n != 0 {
		t.Fatalf("%d log lines, want none (Redis always answered): %v", n, logs.All())
	}
}

// The dispatcher of a zone's waiters runs a batch of its own: a waiter that
// leaves while the batch is in Redis, in a config being cleaned up, must
// not let the book close under the batch: the batch does not fail on a
// closed client, and leaves no lease in Redis to expire.
func TestCleanupDuringDispatchLeavesNoLease(t *testing.T) {
	addr, cli := startRedis(t)
	p := newFaultProxy(t, addr)
	limits := &limiter.Limits{Max: []int64{1}}
	other := newStore(t, store(addr, nil)) // another instance: its own book
	zOther, _ := zoneOf(other, "q", limits)
	old := newStore(t, store(p.addr, func(s *Store) { s.OnError = "closed"; s.Timeout = caddy.Duration(5 * time.Second) }))
	logs := observeLogs(old.book)
	z, local := zoneOf(old, "q", limits)
	warmUp(t, z, limits, cli)

	held := request(limits, "k")
	mustAdmit(t, zOther, held, "the other instance takes the key's slot")
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan limiter.Result, 1)
	go func() { left <- z.Acquire(ctx, request(limits, "k"), limiter.WaitOptions{Wait: time.Minute}) }()
	eventually(t, "the request waits", func() bool { return local.WaitingOutside() == 1 })

	// The queue's next call runs in Redis after the slot is free, its
	// reply held back. A gate keeps its polls (every 250ms) out until
	// then: a poll sent before the release would be refused and have its
	// reply held, and on a busy machine that took the whole deadline (2
	// runs in 8 with both cores busy).
	rz := z.(*redisZone)
	gate := make(chan struct{})
	rz.callGate.Store(&gate)
	eventually(t, "no call in Redis", func() bool {
		rz.callMu.Lock()
		defer rz.callMu.Unlock()
		return !rz.calling
	})
	p.setStall(true)
	zOther.Release(held)
	eventually(t, "the released slot is gone from Redis", func() bool { return members(t, cli, "t") == 0 })
	rz.callGate.Store(nil)
	close(gate) // the call held at the gate (or the next poll's) goes now
	eventually(t, "the dispatcher admitted the waiter in Redis", func() bool { return holdsMember(t, cli, old.book.instance) })
	cancel()
	if res := <-left; res.Outcome != limiter.Aborted {
		t.Fatalf("the waiter that left: %v, want aborted", res.Outcome)
	}
	b := old.book
	old.Cleanup()
	maintained(t, b) // it would close the book under the batch now, if it could
	p.setStall(false)
	eventually(t, "the lease of the waiter that left removed", func() bool { return members(t, cli, "t") == 0 })
	for _, e := range logs.All() {
		if strings.Contains(e.Message, "unreachable") {
			t.Fatalf("logged %q (%v), though Redis answered within timeout", e.Message, e.ContextMap())
		}
	}
}

// holdsMember reports whether a lease of the given instance is in Redis.
func holdsMember(t *testing.T, cli *redis.Client, instance string) bool {
	t.Helper()
	ctx := context.Background()
	keys, err := cli.Keys(ctx, "t:*:client:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		ms, _ := cli.ZRange(ctx, k, 0, -1).Result()
		for _, m := range ms {
			if strings.HasPrefix(m, instance+":") {
				return true
			}
		}
	}
	return false
}

// Late requests on an old config's handler, admitted, waiting and leaving,
// reopen and close its book a hundred times and more while maintain,
// renewal and the dispatcher run: nothing is logged, and in the end the
// book is closed with no lease in Redis and no goroutine left.
func TestBookReopenedAndClosedUnderLoad(t *testing.T) {
	addr, cli := startRedis(t)
	old := newStore(t, store(addr, func(s *Store) { s.Lease = caddy.Duration(time.Second) }))
	limits := &limiter.Limits{Max: []int64{1}}
	z, _ := zoneOf(old, "hammer", limits)
	b := old.book
	logs := observeLogs(b)
	warmUp(t, z, limits, cli)
	eventually(t, "the warm-up's book idle", func() bool { return members(t, cli, "t") == 0 })
	goroutines := runtime.NumGoroutine()
	old.Cleanup()
	var closedSeen atomic.Int64
	// Each opening makes a new stop channel: the openings seen between
	// requests, counted until 150 (at most 20s: on a busy machine the
	// maintainer may not run in the gaps for long).
	var reopenings atomic.Int64
	var lastStop chan struct{}
	reopened := func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.stop != lastStop {
			lastStop = b.stop
			reopenings.Add(1)
		}
	}
	var wg sync.WaitGroup
	start := time.Now()
	hammering := func() bool { return reopenings.Load() < 150 && time.Since(start) < 20*time.Second }
	for g := range 4 {
		wg.Go(func() {
			for i := 0; hammering(); i++ {
				if !isOpen(b) {
					closedSeen.Add(1)
				}
				reopened()
				req := request(limits, fmt.Sprint("k", g%2))
				if z.Acquire(context.Background(), req, limiter.WaitOptions{Wait: time.Duration(i%3) * time.Millisecond}).Outcome == limiter.Admitted {
					z.Release(req)
				}
				time.Sleep(time.Duration(i%3) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	eventually(t, "the book closed at the end", func() bool { return !isOpen(b) })
	eventually(t, "no lease left", func() bool { return members(t, cli, "t") == 0 })
	eventually(t, "no goroutine left", func() bool { return runtime.NumGoroutine() <= goroutines })
	if closedSeen.Load() == 0 {
		t.Fatal("the book was never seen closed between requests: nothing reopened it")
	}
	if n := logs.Len(); n != 0 {
		t.Fatalf("%d log lines, want none: %v", n, logs.All())
	}
	t.Logf("the book was seen closed %d times and opened %d times in %v", closedSeen.Load(), reopenings.Load(), time.Since(start).Round(time.Millisecond))
}
