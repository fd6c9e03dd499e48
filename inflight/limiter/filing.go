package limiter

import (
	"container/heap"
	"time"
)

// A filing is the flows listed under one blocker, kept in order so that a
// release serves the best of them without looking at the rest: a release
// costs O(log flows listed there), however many wait. A flow can be in
// several filings at once, once in each (see file); every waiting flow is
// also in the queue's line, the filing of the whole queue order, whose
// first is the head (see reservation).
//
// The queue order (see standing.before and Zone.before) changes with time
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
	f      *flow
	b      blocker
	lane   *lane
	idx    int
	place  float64 // fair: the key's tag when listed
	parked bool    // out of its lane until the dispatch ends (see dispatch)
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
	return a.f.lead().seq < b.f.lead().seq
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

// file lists f under what refused its holder: outcome o on dimension d.
// Refused by one of its own keys, it is listed there alone: it needs no
// shared room before that key frees. Refused by a shared constraint (the
// total, a key bound), it is listed there and under each of its own keys:
// the room it needs can come back at any of them. Either way each waiting
// flow is listed where room it needs comes back (see dispatch).
func (q *queue) file(f *flow, o Outcome, d int) {
	b := q.blockerOf(f, o, d)
	if o == Full && d != TotalDim {
		q.unlistBut(f, b)
		q.list(f, b)
		if f.eligible != nil {
			q.leave(&q.eligible, f.eligible)
			f.eligible = nil
		}
		return
	}
	if f.eligible == nil {
		f.eligible = q.enter(&q.eligible, f, blocker{})
	}
	q.list(f, b)
	for k := range f.hashes {
		if f.keyed(k) {
			q.list(f, keyBlocker(k, f.hashes[k]))
		}
	}
}

// list lists f under b, unless it is listed there already.
func (q *queue) list(f *flow, b blocker) {
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
	f.listed = append(f.listed, q.enter(fl, f, b))
}

// enter puts f in fl's lane for it, listed as b.
func (q *queue) enter(fl *filing, f *flow, b blocker) *listing {
	e := &listing{f: f, b: b, lane: fl.laneFor(f)}
	if f.fair {
		e.place = q.vclock.place(f.fairKey)
	}
	heap.Push(e.lane, e)
	fl.n++
	return e
}

// unlistBut takes f from every filing it is listed in but b's.
func (q *queue) unlistBut(f *flow, b blocker) {
	kept := f.listed[:0]
	for _, e := range f.listed {
		if e.b == b {
			kept = append(kept, e)
			continue
		}
		q.leaveFiling(e)
	}
	clear(f.listed[len(kept):])
	f.listed = kept
}

// unlist takes f from every filing it is listed in, and from the line.
func (q *queue) unlist(f *flow) {
	for _, e := range f.listed {
		q.leaveFiling(e)
	}
	f.listed = nil
	q.leave(&q.line, f.order)
	f.order = nil
	if f.eligible != nil {
		q.leave(&q.eligible, f.eligible)
		f.eligible = nil
	}
}

// leaveFiling takes e from its blocker's filing, dropping the filing once
// empty.
func (q *queue) leaveFiling(e *listing) {
	fl := q.filingOf(e.b)
	q.leave(fl, e)
	if fl.n == 0 {
		if e.b.total {
			q.onTotal = nil
		} else {
			delete(q.blocked, e.b.key)
		}
	}
}

// leave takes e out of fl; a parked e stays out.
func (q *queue) leave(fl *filing, e *listing) {
	if e.parked {
		e.parked = false
	} else {
		heap.Remove(e.lane, e.idx)
	}
	fl.n--
}

// fix moves e within its lane after its place or its flow's lead (see
// flow.lead) changed.
func fix(e *listing) {
	if !e.parked {
		heap.Fix(e.lane, e.idx)
	}
}

// headLeft keeps f's places after its lead (see flow.lead) changed: its
// head left it (a waiter that gave up, or went short), and its next
// waiter arrived later; or its short waiters came back (see unshort).
func (q *queue) headLeft(f *flow) {
	for _, e := range f.listed {
		fix(e)
	}
	fix(f.order)
	if f.eligible != nil {
		fix(f.eligible)
	}
}

// first returns the best flow listed in fl at time now.
func (q *queue) first(fl *filing, now time.Time) *flow {
	var best *flow
	for _, l := range fl.lanes {
		if e := q.top(l); e != nil && (best == nil || q.before(e.f, best, now)) {
			best = e.f
		}
	}
	return best
}

// top returns l's first listing, nil if none, once its place is current:
// a fair place can be stale, too early, as its key's tag only grows
// between corrections down (see moveBack).
func (q *queue) top(l *lane) *listing {
	for len(l.items) > 0 {
		e := l.items[0]
		if !l.fair {
			return e
		}
		p := q.vclock.place(e.f.fairKey)
		if p <= e.place {
			return e
		}
		e.place = p
		heap.Fix(l, 0)
	}
	return nil
}

// filed reports whether any flow is filed under b.
func (q *queue) filed(b blocker) bool { return q.filingOf(b) != nil }
