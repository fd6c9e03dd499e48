package limiter

import (
	"container/heap"
	"time"
)

// A filing is the flows filed under one blocker, kept in order so that a
// release serves the best of them without looking at the rest: a release
// costs O(log flows filed there), however many wait.
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
// A fair flow's place in its lane is its key's tag when it was filed; the
// tag only grows while it waits (a grant to another flow of the same key),
// so a stale place is too early, never too late: the lane's first flow is
// checked and moved back until its place is current (see first).
type filing struct {
	lanes []*lane
	n     int // flows filed
}

// lane is a binary heap of flows in a fixed order.
type lane struct {
	fair   bool
	class  Class // without fair
	keyDim int   // with fair
	flows  []*flow
}

func (l *lane) Len() int { return len(l.flows) }

func (l *lane) Less(i, j int) bool {
	a, b := l.flows[i], l.flows[j]
	if l.fair && a.place != b.place {
		return a.place < b.place
	}
	return a.head.Seq < b.head.Seq
}

func (l *lane) Swap(i, j int) {
	l.flows[i], l.flows[j] = l.flows[j], l.flows[i]
	l.flows[i].idx, l.flows[j].idx = i, j
}

func (l *lane) Push(x any) {
	f := x.(*flow)
	f.idx = len(l.flows)
	l.flows = append(l.flows, f)
}

func (l *lane) Pop() any {
	f := l.flows[len(l.flows)-1]
	l.flows[len(l.flows)-1] = nil
	l.flows = l.flows[:len(l.flows)-1]
	return f
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

// filingOf returns the filing of b, or nil if nothing is filed there.
func (q *queue) filingOf(b blocker) *filing {
	if b.total {
		return q.onTotal
	}
	return q.blocked[b.key]
}

// file puts f under blocker b.
func (q *queue) file(f *flow, b blocker) {
	fl := q.filingOf(b)
	if fl == nil {
		fl = &filing{}
		if b.total {
			q.onTotal = fl
		} else {
			q.blocked[b.key] = fl
		}
	}
	if f.fair {
		f.place = q.vclock.place(f.fairKey)
	}
	f.filed, f.isFiled, f.lane = b, true, fl.laneFor(f)
	heap.Push(f.lane, f)
	fl.n++
}

// unfile takes f from under its blocker.
func (q *queue) unfile(f *flow) {
	heap.Remove(f.lane, f.idx)
	fl := q.filingOf(f.filed)
	if fl.n--; fl.n == 0 {
		if f.filed.total {
			q.onTotal = nil
		} else {
			delete(q.blocked, f.filed.key)
		}
	}
	f.isFiled, f.lane = false, nil
}

// headLeft keeps f's place in its lane after its head left it (a waiter
// that gave up): its next waiter arrived later.
func (q *queue) headLeft(f *flow) {
	if f.isFiled {
		heap.Fix(f.lane, f.idx)
	}
}

// first returns the best flow filed in fl at time now.
func (q *queue) first(fl *filing, now time.Time) *flow {
	var best *flow
	for _, l := range fl.lanes {
		if len(l.flows) == 0 {
			continue
		}
		for l.fair { // bring stale places up to date; they only grow
			f := l.flows[0]
			p := q.vclock.place(f.fairKey)
			if p <= f.place {
				break
			}
			f.place = p
			heap.Fix(l, 0)
		}
		if f := l.flows[0]; best == nil || q.before(f, best, now) {
			best = f
		}
	}
	return best
}

// filed reports whether any flow is filed under b: its room is held for
// them (see serve).
func (q *queue) filed(b blocker) bool { return q.filingOf(b) != nil }
