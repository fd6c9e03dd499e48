package redisstore

import (
	"slices"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight"
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// Fair sharing and the per-key waiting bound apply to this instance's own
// waiters: the fleet shares the slots in Redis, and each instance offers
// them to its waiters in the order its in-process queue would.

// overPerKey reports whether req's key already has opt.MaxWaitingPerKey
// waiters, here and in others (the zone's other queues). mu must be held.
func (z *redisZone) overPerKey(req *limiter.Request, opt limiter.WaitOptions, others int) bool {
	d := opt.KeyDim
	if opt.MaxWaitingPerKey <= 0 || d >= len(req.Keys) || req.Keys[d] == "" {
		return false
	}
	return others+z.keyWaiters(d, req.Keys[d]) >= opt.MaxWaitingPerKey
}

// othersWaiting counts the waiters of req's key in the zone's other queues:
// a reload that changed the store's options keeps the old queue serving its
// waiters (which it only loses from then on) beside this one. z.mu must
// not be held: each queue's own lock is taken in turn.
func (z *redisZone) othersWaiting(req *limiter.Request, opt limiter.WaitOptions) int {
	d := opt.KeyDim
	if opt.MaxWaitingPerKey <= 0 || d >= len(req.Keys) || req.Keys[d] == "" {
		return 0
	}
	n := 0
	for _, q := range inflight.QueuesOf(z.local) {
		if other, ok := q.(*redisZone); ok && other != z {
			other.mu.Lock()
			n += other.keyWaiters(d, req.Keys[d])
			other.mu.Unlock()
		}
	}
	return n
}

// keyWaiters counts this queue's waiters with key in dimension d. mu must
// be held.
func (z *redisZone) keyWaiters(d int, key string) int {
	n := 0
	for _, w := range z.waiters {
		if d < len(w.req.Keys) && w.req.Keys[d] == key {
			n++
		}
	}
	return n
}

// order sorts a batch of waiters best first: by fair share among those
// with fair (the order of the in-process queue, see limiter.Shares), the
// others by priority after them. dispatching must be held.
func (z *redisZone) order(queue []*waiter, now time.Time) {
	byPriority := func(a, b *waiter) int {
		switch {
		case a.Before(b.Place, now):
			return -1
		case b.Before(a.Place, now):
			return 1
		}
		return 0
	}
	fair := slices.DeleteFunc(slices.Clone(queue), func(w *waiter) bool { return !w.opt.Fair })
	if len(fair) == 0 {
		slices.SortFunc(queue, byPriority)
		return
	}
	rest := slices.DeleteFunc(slices.Clone(queue), func(w *waiter) bool { return w.opt.Fair })
	slices.SortFunc(rest, byPriority)
	items := make([]limiter.FairItem, len(fair))
	for i, w := range fair {
		items[i] = w.fairItem(z.units(z.local.LimitsOf(w.req), w.req))
	}
	for i, j := range z.shares.Order(items, now) {
		queue[i] = fair[j]
	}
	copy(queue[len(fair):], rest)
}

// fairItem is w as fair sharing orders it, when it takes units.
func (w *waiter) fairItem(units int64) limiter.FairItem {
	key := ""
	if d := w.opt.KeyDim; d < len(w.req.Keys) {
		key = w.req.Keys[d]
	}
	return limiter.FairItem{Key: key, Weight: w.opt.Weight, Units: units, Place: w.Place}
}
