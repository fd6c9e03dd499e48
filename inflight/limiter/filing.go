package limiter

import (
	"container/heap"
	"time"
)

// A filing is the flows listed under one blocker, kept in order so that a
// release serves the best of them without looking at the rest: a release
// costs O(log flows listed there), however many wait. A flow is listed
// under every blocker that refused it since it started waiting (see
// serve), so it can be in several filings at once, once in each.
//
// The queue order (see Place.Before and Zone.before) changes with time
// between waiters of different weights (a score ages by its weight), so no
// single heap can keep it. A filing therefore has lanes whose order is
// fixed: one per priority class for flows without fair sharing (within a
// class the score order is the arrival order), and one per fair dimension,
// ordered by their keys' virtual-time tags, then arrival. The best flow of
// the filing is the best of the lanes' first flows at the time, by the queue
// order.
//
// A fair flow's place in a lane is its key's tag when it was listed. The
// tag grows while it waits (a grant to another flow of the same key, a
// correction up), so a stale place is too early: the lane's first listing
// is checked and moved back until its place is current (see first). A
// correction down moves the key's listings forward at once (moveBack), so
// a place is never too late.
type filing struct {
	lanes []*lane
	n     int // flows listed
}

// listing is a flow's entry in the filing of one blocker.
type listing struct {
	f     *flow
	b     blocker
	dim   int  // the dimension refused (TotalDim: the total)
	keys  bool // refused by the dimension's key bound, not a count
	lane  *lane
	idx   int
	place float64 // fair: the key's tag when listed
}

// lane is a binary heap of listings in a fixed order.
type lane struct {
	fair   bool
	class  Class // without fair
	keyDim int   // with fair
	items  []*listing
}

func (l *lane) Len() int { return len(l.items) }

func (l *lane) Less(i, j int) bool {
	a, b := l.items[i], l.items[j]
	if l.fair && a.place != b.place {
		return a.place < b.place
	}
	return a.f.head.Seq < b.f.head.Seq
}

func (l *lane) Swap(i, j int) {
	l.items[i], l.items[j] = l.items[j], l.items[i]
	l.items[i].idx, l.items[j].idx = i, j
}

func (l *lane) Push(x any) {
	e := x.(*listing)
	e.idx = len(l.items)
	l.items = append(l.items, e)
}

func (l *lane) Pop() any {
	e := l.items[len(l.items)-1]
	l.items[len(l.items)-1] = nil
	l.items = l.items[:len(l.items)-1]
	return e
}

// laneFor returns the lane of fl that f goes in, made if needed.
func (fl *filing) laneFor(f *flow) *lane {
	for _, l := range fl.lanes {
		if l.fair == f.fair && (f.fair && l.keyDim == f.keyDim || !f.fair && l.class == f.class) {
			return l
		}
	}
	l := &lane{fair: f.fair, class: f.class, keyDim: f.keyDim}
	fl.lanes = append(fl.lanes, l)
	return l
}

// filingOf returns the filing of b, or nil if nothing is listed there.
func (q *queue) filingOf(b blocker) *filing {
	if b.total {
		return q.onTotal
	}
	return q.blocked[b.key]
}

// file lists f under what refused its head: outcome o on dimension d
// (see blockerOf), unless it is listed there already.
func (q *queue) file(f *flow, o Outcome, d int) {
	b := q.blockerOf(f.head.req, o, d)
	for _, e := range f.listed {
		if e.b == b {
			return
		}
	}
	fl := q.filingOf(b)
	if fl == nil {
		fl = &filing{}
		if b.total {
			q.onTotal = fl
		} else {
			q.blocked[b.key] = fl
		}
	}
	e := &listing{f: f, b: b, dim: d, keys: o == KeysFull, lane: fl.laneFor(f)}
	if f.fair {
		e.place = q.vclock.place(f.fairKey)
	}
	f.listed = append(f.listed, e)
	heap.Push(e.lane, e)
	fl.n++
}

// unlist takes f from every filing it is listed in, and appends to freed
// the blockers whose room it held.
func (q *queue) unlist(f *flow) {
	for _, e := range f.listed {
		heap.Remove(e.lane, e.idx)
		fl := q.filingOf(e.b)
		if fl.n--; fl.n == 0 {
			if e.b.total {
				q.onTotal = nil
			} else {
				delete(q.blocked, e.b.key)
			}
		}
		q.freed = append(q.freed, e.b)
	}
	f.listed = nil
}

// held returns the dimensions (TotalDim: the total) whose counts refused
// f, for a ledger to hold their room (see Claim.Hold).
func (f *flow) held() []int {
	var dims []int
	for _, e := range f.listed {
		if !e.keys {
			dims = append(dims, e.dim)
		}
	}
	return dims
}

// headLeft keeps f's places after its head left it (a waiter that gave
// up): its next waiter arrived later.
func (q *queue) headLeft(f *flow) {
	for _, e := range f.listed {
		heap.Fix(e.lane, e.idx)
	}
}

// first returns the best flow listed in fl at time now.
func (q *queue) first(fl *filing, now time.Time) *flow {
	var best *flow
	for _, l := range fl.lanes {
		if len(l.items) == 0 {
			continue
		}
		for l.fair { // bring stale places up to date; they only grow
			e := l.items[0]
			p := q.vclock.place(e.f.fairKey)
			if p <= e.place {
				break
			}
			e.place = p
			heap.Fix(l, 0)
		}
		if f := l.items[0].f; best == nil || q.before(f, best, now) {
			best = f
		}
	}
	return best
}

// filed reports whether any flow is listed under b: its room is held (see
// serve).
func (q *queue) filed(b blocker) bool { return q.filingOf(b) != nil }
