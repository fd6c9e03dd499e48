package redisstore

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight"
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// fallbackPoll bounds how long a waiter can miss a release notice (lost
// messages, a reconnecting subscription) before it tries again.
const fallbackPoll = 250 * time.Millisecond

// listing is how long an instance stays in a zone's waiting set after a
// dispatch left waiters: dispatches refresh it every fallbackPoll.
const listing = 4 * fallbackPoll

// queue holds the requests of one zone waiting in this instance. While it
// is not empty, one goroutine (serve) tries the waiters on every release
// notice and every fallbackPoll, and newcomers are admitted in the same
// call behind them (see calls.go), so they never overtake a waiter that
// fits.
type queue struct {
	mu      sync.Mutex
	waiters []*waiter
	seq     uint64
	serving bool
	wakeup  chan struct{}

	calls
	shares limiter.Shares // fair sharing's state; guarded by the call under way
}

type waiter struct {
	limiter.Place
	req     *limiter.Request // the waiter's own copy: the dispatcher writes its Lease
	opt     limiter.WaitOptions
	ready   chan struct{}
	granted bool
}

// wait queues req. Waiters are tried best first (score, class, arrival; by
// fair share with fair, see fair.go).
func (z *redisZone) wait(ctx context.Context, req *limiter.Request, opt limiter.WaitOptions, dim int) limiter.Result {
	others := z.othersWaiting(req, opt)
	z.mu.Lock()
	if z.overPerKey(req, opt, others) {
		z.mu.Unlock()
		return limiter.Result{Outcome: limiter.QueueFull, Dim: opt.KeyDim}
	}
	if !z.local.WaitOutside(opt.MaxWaiting) { // this zone's queues, old and new
		z.mu.Unlock()
		return limiter.Result{Outcome: limiter.QueueFull, Dim: dim}
	}
	z.seq++
	own := &limiter.Request{Keys: slices.Clone(req.Keys), Max: slices.Clone(req.Max), Cost: req.Cost, Limits: req.Limits}
	w := &waiter{Place: limiter.Place{Class: opt.Class, Arrived: time.Now(), Seq: z.seq}, req: own, ready: make(chan struct{}), opt: opt}
	z.waiters = append(z.waiters, w)
	if len(z.waiters) == 1 {
		inflight.QueueWaiting(z.local, z, true)
	}
	if !z.serving {
		z.serving = true
		go z.serve()
	}
	z.mu.Unlock()
	z.wake()
	if opt.Queued != nil {
		opt.Queued()
	}

	timer := time.NewTimer(opt.Wait)
	defer timer.Stop()
	outcome := limiter.Timeout
	select {
	case <-w.ready:
		z.adopt(req, w.req)
		return limiter.Result{Outcome: limiter.Admitted, Waited: time.Since(w.Arrived)}
	case <-ctx.Done():
		outcome = limiter.Aborted
	case <-timer.C:
	}
	z.mu.Lock()
	granted := w.granted
	z.remove(w)
	z.mu.Unlock()
	waited := time.Since(w.Arrived)
	switch {
	case granted && outcome == limiter.Aborted:
		z.Release(w.req)
	case granted:
		z.adopt(req, w.req)
		return limiter.Result{Outcome: limiter.Admitted, Waited: waited}
	}
	return limiter.Result{Outcome: outcome, Dim: dim, Waited: waited}
}

// adopt makes req, whose waiter's copy own was granted, the holder of own's
// lease and local count, so that req's Release gives back exactly the
// units own took. The count is taken before it is given back: it never
// reads lower than what is held.
func (z *redisZone) adopt(req, own *limiter.Request) {
	req.Lease = own.Lease
	z.local.Hold(req, own.Units())
	z.local.Release(own)
}

// remove takes w out of the queue, if it is still there. z.mu must be held.
func (z *redisZone) remove(w *waiter) {
	n := len(z.waiters)
	z.waiters = slices.DeleteFunc(z.waiters, func(x *waiter) bool { return x == w })
	if len(z.waiters) == n {
		return // already gone
	}
	z.local.DoneWaitingOutside()
	if len(z.waiters) == 0 {
		inflight.QueueWaiting(z.local, z, false)
	}
}

// wake asks serve to try the waiters.
func (z *redisZone) wake() {
	select {
	case z.wakeup <- struct{}{}:
	default:
	}
}

// serve tries the waiters when woken, and every fallbackPoll, until none is
// left.
func (z *redisZone) serve() {
	poll := time.NewTicker(fallbackPoll)
	defer poll.Stop()
	for {
		select {
		case <-z.wakeup:
		case <-poll.C:
		}
		// The batch counts as a user of the book: the waiters may all
		// leave, and the config go, while it is in Redis.
		if z.book.available() && z.book.tryEnter() {
			z.dispatchWaiters()
			z.book.exit()
		}
		z.mu.Lock()
		if len(z.waiters) == 0 {
			z.serving = false
			z.mu.Unlock()
			return
		}
		z.mu.Unlock()
	}
}

// waitersInOrder returns the waiters, best first. The call under way
// guards the fair shares.
func (z *redisZone) waitersInOrder() []*waiter {
	z.mu.Lock()
	now := time.Now()
	queue := slices.Clone(z.waiters)
	z.mu.Unlock()
	z.order(queue, now)
	return queue
}

// granted hands their slots to the waiters the call admitted: verdicts
// starts with theirs, in queue's order. One that left meanwhile gives its
// slot back at once.
func (z *redisZone) granted(queue []*waiter, verdicts []verdict) {
	z.mu.Lock()
	defer z.mu.Unlock()
	for i, w := range queue {
		if verdicts[i].outcome != limiter.Admitted {
			continue
		}
		if w.opt.Fair {
			z.shares.Charge(w.fairItem(w.req.Units()))
		}
		if !slices.Contains(z.waiters, w) { // it left while the script ran
			z.Release(w.req) // its own copy: safe after it returned
			continue
		}
		w.granted = true
		z.remove(w)
		close(w.ready)
	}
}

// WaitingKeys returns the keys of dimension d with requests waiting in
// this instance, and how many wait for each.
func (z *redisZone) WaitingKeys(d int) []limiter.KeyWaiting {
	z.mu.Lock()
	reqs := make([]*limiter.Request, len(z.waiters))
	for i, w := range z.waiters {
		reqs[i] = w.req
	}
	z.mu.Unlock()
	return z.local.WaitingKeysOf(d, reqs)
}
