package redisstore

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// A zone makes one admission call to Redis at a time (group commit): the
// newcomers that arrive while a call is under way wait for it to end and go
// together in the next one, behind the zone's waiters, with the leases
// released meanwhile to remove first. A lone request goes at once, so a
// quiet zone adds no latency, while a busy one sends one script per round
// trip, whatever the rate of requests.

// errUnavailable fails the newcomers of a call made while Redis is left
// alone after a failure: they fall back as a request that found it so.
var errUnavailable = errors.New("redis is left alone after a failure")

// calls is the state of a zone's admission calls.
type calls struct {
	mu   sync.Mutex
	busy bool // a call is under way
	// next holds the newcomers that arrived while busy: the next call's.
	next []*newcomer
	// again asks for one more call after this one: waiters may fit after
	// the call read Redis.
	again bool
	// removals says leases were released while a call was under way.
	removals bool
}

// newcomer is one request that joins a call, and its verdict.
type newcomer struct {
	req      *limiter.Request
	willWait bool
	done     chan struct{} // closed when v and err are set, or lead is
	v        verdict
	err      error
	// lead is set when the newcomer makes the next call, for these
	// newcomers (itself first).
	lead []*newcomer
}

// admitNewcomer admits req behind this instance's waiters, in the call
// under way's successor if there is one under way.
func (z *redisZone) admitNewcomer(req *limiter.Request, willWait bool) (verdict, error) {
	n := &newcomer{req: req, willWait: willWait}
	batch := []*newcomer{n}
	z.calls.mu.Lock()
	if z.calls.busy {
		n.done = make(chan struct{})
		z.calls.next = append(z.calls.next, n)
		z.calls.mu.Unlock()
		<-n.done
		if n.lead == nil {
			return n.v, n.err
		}
		batch = n.lead
	} else {
		z.calls.busy = true
		z.calls.mu.Unlock()
	}
	z.run(batch)
	return n.v, n.err
}

// dispatchWaiters makes a call for the waiters and the leases released,
// or asks the call under way for one more.
func (z *redisZone) dispatchWaiters() {
	if z.claimCall() {
		z.run(nil)
	}
}

// send has the leases released in the zone removed, off the caller's
// path: by the admission call under way's successor, or by a removal of
// their own, which does not hold back the zone's next admission call.
func (z *redisZone) send() {
	z.calls.mu.Lock()
	busy := z.calls.busy
	z.calls.removals = z.calls.removals || busy
	z.calls.mu.Unlock()
	if !busy {
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

// runOffPath makes a call for the waiters, as a user of the book.
func (z *redisZone) runOffPath() {
	if !z.book.tryEnter() {
		z.handOff(false) // the book closed: nothing to send
		return
	}
	z.run(nil)
	z.book.exit()
}

// claimCall makes the caller the zone's next call, unless one is under
// way: that one is then asked for one more.
func (z *redisZone) claimCall() bool {
	z.calls.mu.Lock()
	defer z.calls.mu.Unlock()
	if z.calls.busy {
		z.calls.again = true
		return false
	}
	z.calls.busy = true
	return true
}

// run makes the call for batch (nil: no newcomers), then hands the next
// call to the newcomers that arrived meanwhile, or makes it off the
// caller's path if one more was asked.
func (z *redisZone) run(batch []*newcomer) {
	z.calls.mu.Lock()
	z.calls.again = false
	z.calls.mu.Unlock()
	// Leases released meanwhile (or more than a script takes) go in the
	// next call, or alone; after a failure they wait for a tick (see
	// removeReleased).
	removals := z.call(batch) && z.book.unclaimed(z.tag)
	for _, n := range batch[min(1, len(batch)):] {
		close(n.done)
	}
	z.handOff(removals)
}

// handOff passes the zone's next call to the newcomers that arrived
// meanwhile, or makes it off the caller's path if one more was asked for
// the waiters, or leaves the zone with no call under way (removing the
// leases released if any).
func (z *redisZone) handOff(removals bool) {
	z.calls.mu.Lock()
	next := z.calls.next
	z.calls.next = nil
	again := z.calls.again
	removals = removals || z.calls.removals
	z.calls.again, z.calls.removals = false, false
	idle := len(next) == 0 && !again
	if idle {
		z.calls.busy = false
	}
	z.calls.mu.Unlock()
	switch {
	case len(next) > 0:
		next[0].lead = next
		close(next[0].done)
	case again:
		go z.runOffPath()
	case removals:
		go z.removeAlone()
	}
}

// call offers Redis to the waiters, best first, then to the newcomers in
// their order of arrival, in one script that removes the leases released
// first: each that fits is admitted, so one whose key is full blocks
// nobody, and a newcomer never overtakes a waiter that fits. It reports
// whether Redis answered.
func (z *redisZone) call(batch []*newcomer) bool {
	if !z.book.available() {
		for _, n := range batch {
			n.err = errUnavailable
		}
		return false // the waiters wait; the leases are removed on a tick
	}
	queue := z.waitersInOrder()
	reqs := make([]*limiter.Request, 0, len(queue)+len(batch))
	waits := make([]bool, 0, len(queue)+len(batch))
	for _, w := range queue {
		reqs, waits = append(reqs, w.req), append(waits, true)
	}
	for _, n := range batch {
		reqs, waits = append(reqs, n.req), append(waits, n.willWait)
	}
	verdicts, err := z.admit(reqs, waits)
	for i, n := range batch {
		if err != nil {
			n.err = err
			continue
		}
		n.v = verdicts[len(queue)+i]
	}
	if err != nil {
		return false
	}
	z.granted(queue, verdicts)
	return true
}
