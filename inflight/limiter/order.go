package limiter

import (
	"container/heap"
	"time"
)

// order returns every waiter in the order they would be served one after
// another at time now: the queue order of the flows' heads, each grant
// charged to its key's fair tag as if it were granted (its cost, unclamped:
// the ledger clamps), on a simulation of the queue's virtual clock. mu
// must be held.
func (q *queue) order(now time.Time) []*waiter {
	sim := q.vclock.simulate()
	tag := func(f *flow, w *waiter) float64 {
		switch {
		case !f.fair:
			return 0
		case w.short: // where it stood at its turn (see queue.turnOf)
			return w.shortPlace - q.vclock.base
		}
		return sim.tag(f.fairKey)
	}
	var h candidates
	h.now = now
	for _, f := range q.byID {
		for ; f != nil; f = f.collide {
			h.items = append(h.items, candidate{f: f, w: f.head, tag: tag(f, f.head)})
		}
	}
	heap.Init(&h)
	out := make([]*waiter, 0, q.queued.Load())
	for h.Len() > 0 {
		c := h.items[0]
		if s := tag(c.f, c.w); s > c.tag { // its key was charged meanwhile
			h.items[0].tag = s
			heap.Fix(&h, 0)
			continue
		}
		out = append(out, c.w)
		if c.f.fair {
			sim.advance(c.f.fairKey, float64(c.w.req.cost())*sim.estimate(c.f.fairKey), c.f.weight)
		}
		if c.w.next == nil {
			heap.Pop(&h)
			continue
		}
		h.items[0] = candidate{f: c.f, w: c.w.next, tag: tag(c.f, c.w.next)}
		heap.Fix(&h, 0)
	}
	return out
}

// candidates is a heap of candidates in the queue order at now.
type candidates struct {
	items []candidate
	now   time.Time
}

func (h *candidates) Len() int           { return len(h.items) }
func (h *candidates) Less(i, j int) bool { return h.items[i].before(h.items[j], h.now) }
func (h *candidates) Swap(i, j int)      { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *candidates) Push(x any)         { h.items = append(h.items, x.(candidate)) }
func (h *candidates) Pop() any {
	c := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return c
}

// waitingOf returns the requests of key waiting in the queue. mu must be
// held.
func (q *queue) waitingOf(key uint64) int {
	n := 0
	if kf := q.vclock.waiting[key]; kf != nil {
		for _, f := range kf.flows {
			n += f.n
		}
	}
	return n
}
