package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// levelOf returns res's level of dimension d, failing if it has none.
func levelOf(t *testing.T, what string, res limiter.Result, d int) limiter.Level {
	t.Helper()
	l, ok := res.Levels.Of(d)
	if !ok {
		t.Fatalf("%s: no level of dimension %d in %+v", what, d, res)
	}
	return l
}

// The verdicts carry the fleet's level from the admission script: a
// request at instance A sees the units held at instance B, admitted at
// once, refused, and admitted after waiting (its level from the call that
// granted it); with costs, in units.
func TestLevelsAreTheFleets(t *testing.T) {
	addr, _ := startRedis(t)
	limits := &limiter.Limits{Max: []int64{5}, Total: 8}
	a, localA := zoneOf(newStore(t, store(addr, nil)), "levels", limits)
	b, _ := zoneOf(secondInstance(t, addr), "levels", limits)
	atB := []*limiter.Request{request(limits, "k"), request(limits, "k"), request(limits, "other")}
	atB[1].Cost = 2
	for _, req := range atB {
		mustAdmit(t, b, req, "at B")
	}
	mine := request(limits, "k")
	res := a.Acquire(context.Background(), mine, limiter.WaitOptions{})
	if res.Outcome != limiter.Admitted {
		t.Fatalf("at A: %v, want admitted", res.Outcome)
	}
	if l := levelOf(t, "admitted at A", res, 0); l != (limiter.Level{Cap: 5, Held: 4}) {
		t.Errorf("key's level at A %+v, want cap 5, 4 held (3 at B, 1 here)", l)
	}
	if l := levelOf(t, "admitted at A", res, limiter.TotalDim); l != (limiter.Level{Cap: 8, Held: 5}) {
		t.Errorf("total's level at A %+v, want cap 8, 5 held", l)
	}

	big := request(limits, "k")
	big.Cost = 2
	res = a.Acquire(context.Background(), big, limiter.WaitOptions{})
	if res.Outcome != limiter.Full || res.Dim != 0 {
		t.Fatalf("2 more units of k: %v (dim %d), want full by the key", res.Outcome, res.Dim)
	}
	if l := levelOf(t, "refused at A", res, 0); l != (limiter.Level{Cap: 5, Held: 4}) {
		t.Errorf("refused: key's level %+v, want cap 5, 4 held", l)
	}
	if _, ok := res.Levels.Of(limiter.TotalDim); ok {
		t.Errorf("refused by the key: the total, not read, has a level: %+v", res.Levels)
	}

	done := make(chan limiter.Result, 1)
	go func() { done <- a.Acquire(context.Background(), big, limiter.WaitOptions{Wait: 10 * time.Second}) }()
	eventually(t, "the request waits at A", func() bool { return localA.WaitingOutside() == 1 })
	b.Release(atB[1]) // 2 units of k come back at B
	res = <-done
	if res.Outcome != limiter.Admitted || res.Waited <= 0 {
		t.Fatalf("waiter: %v after %v, want admitted after waiting", res.Outcome, res.Waited)
	}
	if l := levelOf(t, "admitted after waiting", res, 0); l != (limiter.Level{Cap: 5, Held: 4}) {
		t.Errorf("waiter's key level %+v, want cap 5, 4 held (1 at B, 1+2 here)", l)
	}
	if l := levelOf(t, "admitted after waiting", res, limiter.TotalDim); l != (limiter.Level{Cap: 8, Held: 5}) {
		t.Errorf("waiter's total level %+v, want cap 8, 5 held", l)
	}
	a.Release(big)
	a.Release(mine)
	b.Release(atB[0])
	b.Release(atB[2])
}

// While Redis cannot be reached and the store fails open, a request is
// decided by this instance alone: its result says so and carries no
// fleet level.
func TestLevelsAloneWhileRedisIsDown(t *testing.T) {
	addr, _ := startRedis(t)
	p := newFaultProxy(t, addr)
	s := newStore(t, store(p.addr, func(s *Store) { s.Timeout = caddy.Duration(200 * time.Millisecond) }))
	limits := &limiter.Limits{Max: []int64{2}}
	z, _ := zoneOf(s, "levels-down", limits)
	p.setDown(true)
	req := request(limits, "k")
	res := z.Acquire(context.Background(), req, limiter.WaitOptions{})
	if res.Outcome != limiter.Admitted || !res.Alone || res.Levels != nil {
		t.Fatalf("while Redis is down: %+v, want admitted alone, without a fleet level", res)
	}
	z.Release(req)
	p.setDown(false)
}
