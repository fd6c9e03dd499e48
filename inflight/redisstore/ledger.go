package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// A zone is a limiter.Ledger: the engine's queue (limiter.SharedQueue)
// decides who is tried, in what order, and makes one call at a time,
// newcomers that arrive meanwhile going together in the next (group
// commit); Take is that call, one admission script that removes this
// instance's leases released since the previous call before it checks the
// sets. So this instance's releases are never late for its own next
// admission (a client that sends its next request as soon as it has a
// response): a release went in an earlier call, or goes in this one, or in
// a removal of its own that the call sends again (it may overtake it).

// fallbackPoll bounds how long a waiter can miss a release notice (lost
// messages, a reconnecting subscription) before it is tried again.
const fallbackPoll = 250 * time.Millisecond

// listing is how long an instance stays in a zone's waiting set after a
// call left waiters: the queue's calls refresh it every fallbackPoll.
const listing = 4 * fallbackPoll

// fairListing is how long a key stays listed as waiting on the zone's fair
// clock after a call that it waited in: the calls of its instance refresh
// it every fallbackPoll. A key whose last waiter left, or whose instance
// went, keeps the room it waited for from the others at most this long.
const fairListing = 2 * fallbackPoll

// fairClockLife is how long a zone's fair clock outlives its last call:
// a zone idle longer starts afresh.
const fairClockLife = 10 * time.Minute

// errUnavailable fails a call made while Redis is left alone after a
// failure, or after the book closed: its newcomers fall back.
var errUnavailable = errors.New("redis is left alone after a failure")

// Take admits claims in Redis, in order, in one admission script (see
// admit). A call counts as a user of the book: its requests may all leave,
// and the config go, while it is in Redis.
func (z *redisZone) Take(claims []limiter.Claim) ([]limiter.Verdict, error) {
	if !z.book.tryEnter() {
		return nil, errUnavailable
	}
	defer z.book.exit()
	if g := z.callGate.Load(); g != nil {
		<-*g
	}
	if !z.book.available() {
		return nil, errUnavailable // the waiters wait; the leases go on a tick
	}
	z.callMu.Lock()
	z.calling = true
	z.callMu.Unlock()
	verdicts, err := z.admit(claims)
	z.callMu.Lock()
	z.lastFailed = err != nil
	z.callMu.Unlock()
	return verdicts, err
}

// Idle removes, alone, the leases released during the calls (or more than
// a script takes), which no call follows to remove; after a failure they
// go on a tick (see removeReleased).
func (z *redisZone) Idle() {
	z.callMu.Lock()
	z.calling = false
	failed := z.lastFailed
	z.callMu.Unlock()
	if !failed && z.book.unclaimed(z.tag) {
		go z.removeAlone()
	}
}

// Give has the lease of a request that ended removed from Redis, off the
// response path: by the queue's call for its waiters in a hand-off, else
// as send says.
func (z *redisZone) Give(lease string, handOff bool) { z.book.release(lease, !handOff) }

// send has the leases released in the zone removed, off the caller's
// path: by the next call while calls follow one another (or alone once
// the queue is idle), or now by a removal of their own, which does not
// hold back the zone's next call.
func (z *redisZone) send() {
	z.callMu.Lock()
	calling := z.calling
	z.callMu.Unlock()
	if !calling {
		go z.removeAlone()
	}
}

// removeAlone removes the zone's leases that ended and that no script is
// removing, in scripts of their own.
func (z *redisZone) removeAlone() {
	if !z.book.tryEnter() {
		return // the book closed: nothing to send
	}
	defer z.book.exit()
	for ok := true; ok && z.book.available(); { // else on a tick
		e, ids := z.book.claim(z.tag, true)
		if len(ids) == 0 {
			return
		}
		ok = z.book.pipeline("release", []string{z.label}, func(ctx context.Context, p redis.Pipeliner) error {
			releaseScript.Eval(ctx, p, append([]string{z.tag + ":waiting"}, e.keys...), append([]any{z.tag + ":released"}, e.args...)...)
			return nil
		})
		z.book.settle(z.tag, ids, ok)
	}
}
