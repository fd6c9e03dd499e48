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
// batch behind them, so they never overtake a waiter that fits.
type queue struct {
	mu      sync.Mutex
	waiters []*waiter
	seq     uint64
	serving bool
	wakeup  chan struct{}

	dispatching sync.Mutex     // one batch at a time, in queue order
	shares      limiter.Shares // fair sharing's state; guarded by dispatching
}

type waiter struct {
	limiter.Place
	req     *limiter.Request // the waiter's own copy: the dispatcher writes its Lease
	opt     limiter.WaitOptions
	ready   chan struct{}
	granted bool
}

// admitNewcomer admits req alone, or behind this instance's waiters when
// there are any.
func (z *redisZone) admitNewcomer(req *limiter.Request, willWait bool) (verdict, error) {
	z.mu.Lock()
	queued := len(z.waiters) > 0
	z.mu.Unlock()
	if queued {
		return z.dispatch(req, willWait)
	}
	v, err := z.admit([]*limiter.Request{req}, []bool{willWait})
	if err != nil {
		return verdict{}, err
	}
	return v[0], nil
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
	own := &limiter.Request{Keys: slices.Clone(req.Keys), Max: slices.Clone(req.Max), Limits: req.Limits}
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
		req.Lease = w.req.Lease
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
		req.Lease = w.req.Lease
		return limiter.Result{Outcome: limiter.Admitted, Waited: waited}
	}
	return limiter.Result{Outcome: outcome, Dim: dim, Waited: waited}
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
			z.dispatch(nil, false)
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

// dispatch offers the slots to the waiters, best first, then to newcomer if
// any, in one batch: each that fits is admitted, so one whose key is full
// blocks nobody. It returns newcomer's verdict.
func (z *redisZone) dispatch(newcomer *limiter.Request, willWait bool) (verdict, error) {
	z.dispatching.Lock()
	defer z.dispatching.Unlock()
	z.mu.Lock()
	now := time.Now()
	queue := slices.Clone(z.waiters)
	z.mu.Unlock()
	z.order(queue, now)
	reqs := make([]*limiter.Request, 0, len(queue)+1)
	waits := make([]bool, 0, len(queue)+1)
	for _, w := range queue {
		reqs, waits = append(reqs, w.req), append(waits, true)
	}
	if newcomer != nil {
		reqs, waits = append(reqs, newcomer), append(waits, willWait)
	}
	if len(reqs) == 0 {
		return verdict{}, nil
	}
	verdicts, err := z.admit(reqs, waits)
	if err != nil {
		return verdict{}, err
	}
	z.mu.Lock()
	for i, w := range queue {
		if verdicts[i].outcome != limiter.Admitted {
			continue
		}
		if w.opt.Fair {
			z.shares.Charge(w.fairItem())
		}
		if !slices.Contains(z.waiters, w) { // it left while the script ran
			z.Release(w.req) // its own copy: safe after it returned
			continue
		}
		w.granted = true
		z.remove(w)
		close(w.ready)
	}
	z.mu.Unlock()
	if newcomer == nil {
		return verdict{}, nil
	}
	return verdicts[len(queue)], nil
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
