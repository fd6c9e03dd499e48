package limiter

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Class is a waiting request's priority class.
type Class uint8

// Priority classes, lowest first.
const (
	Low Class = iota
	Normal
	High
)

// ParseClass reads "high" or "low" (any case); anything else is Normal.
func ParseClass(s string) Class {
	switch {
	case strings.EqualFold(s, "high"):
		return High
	case strings.EqualFold(s, "low"):
		return Low
	}
	return Normal
}

// String returns the class name.
func (c Class) String() string {
	return [...]string{"low", "normal", "high"}[c]
}

// weight scales a class's score: high counts double, low half.
var weight = [...]float64{Low: 0.5, Normal: 1, High: 2}

// agingPeriod is the wait after which a waiter's score has doubled, so that a
// low request waiting long enough overtakes newer high ones.
const agingPeriod = 30 * time.Second

// Outcome is how an admission ended.
type Outcome uint8

// Outcomes of Acquire.
const (
	Admitted   Outcome = iota
	Full               // refused at once: a dimension had no room
	Timeout            // waited the whole wait without a slot
	QueueFull          // refused at once: max_waiting requests already wait
	Aborted            // the request's context ended while it waited
	KeysFull           // refused at once: a new key, and its dimension holds MaxKeys
	StoreError         // refused at once: a shared store was unreachable and fails closed
)

// Result reports an admission. Dim is the refusing dimension (TotalDim for
// the total) when Outcome is not Admitted; Waited is the time spent queued.
type Result struct {
	Outcome Outcome
	Dim     int
	Waited  time.Duration
}

// WaitOptions say whether and how a request may wait for a slot.
type WaitOptions struct {
	Wait       time.Duration // 0: refuse at once
	MaxWaiting int           // bound on queued requests in the zone; 0: none
	Class      Class
}

// queue holds the waiting requests of a zone, one FIFO list per class.
//
// Invariants, with mu held: no queued waiter fits (dispatchLocked runs
// after every change that can make one fit); pending counts the queued
// waiters plus the requests between entering the slow path and leaving it,
// so a Release that reads pending == 0 knows nobody can be missed: such a
// request raises pending before its own attempt, which then sees the freed
// slot.
type queue struct {
	clock   Clock
	mu      sync.Mutex
	pending atomic.Int64
	queued  atomic.Int64
	lists   [High + 1]waitList
	seq     uint64
}

// Place is where a waiting request stands in the queue order.
type Place struct {
	Class   Class
	Arrived time.Time
	Seq     uint64 // arrival order among requests with the same Arrived
}

// Before reports whether p goes before q at time now: the higher score
// (weight × (1 + waited / 30s), weights high 2, normal 1, low 0.5), then
// the higher class, then the earlier arrival.
func (p Place) Before(q Place, now time.Time) bool {
	sp, sq := p.score(now), q.score(now)
	if sp != sq {
		return sp > sq
	}
	if p.Class != q.Class {
		return p.Class > q.Class
	}
	return p.Seq < q.Seq
}

func (p Place) score(now time.Time) float64 {
	return weight[p.Class] * (1 + float64(now.Sub(p.Arrived))/float64(agingPeriod))
}

type waiter struct {
	Place
	req        *Request
	ready      chan struct{} // closed when a slot is handed over
	granted    bool
	prev, next *waiter
}

type waitList struct{ head, tail *waiter }

// Waiting returns how many requests are queued now.
func (z *Zone) Waiting() int64 { return z.queued.Load() }

// Acquire admits req, waiting up to opt.Wait for room. A request that waits
// uses no goroutine of its own beyond the caller's: a Release hands it the
// slot directly and wakes it.
func (z *Zone) Acquire(ctx context.Context, req *Request, opt WaitOptions) Result {
	if opt.Wait <= 0 {
		o, d := z.tryNow(req)
		return Result{Outcome: o, Dim: d}
	}
	if z.pending.Load() == 0 {
		if o, _ := z.tryAcquire(req, true); o == Admitted {
			return Result{Outcome: Admitted}
		}
	}

	z.mu.Lock()
	z.pending.Add(1)
	z.dispatchLocked()
	o, d := z.tryAcquire(req, true)
	if o == Admitted {
		z.pending.Add(-1)
		z.mu.Unlock()
		return Result{Outcome: Admitted}
	}
	if opt.MaxWaiting > 0 && z.queued.Load() >= int64(opt.MaxWaiting) {
		z.pending.Add(-1)
		z.mu.Unlock()
		return Result{Outcome: QueueFull, Dim: d}
	}
	z.seq++
	w := &waiter{Place: Place{Class: opt.Class, Arrived: z.clock.Now(), Seq: z.seq}, req: req, ready: make(chan struct{})}
	z.lists[w.Class].push(w)
	z.queued.Add(1)
	z.mu.Unlock()

	timeout, stop := z.clock.After(opt.Wait)
	defer stop()
	outcome := Timeout
	select {
	case <-w.ready:
		return Result{Outcome: Admitted, Waited: z.clock.Now().Sub(w.Arrived)}
	case <-ctx.Done():
		outcome = Aborted
	case <-timeout:
	}

	z.mu.Lock()
	waited := z.clock.Now().Sub(w.Arrived)
	if w.granted { // a slot came as the wait ended
		z.mu.Unlock()
		if outcome == Aborted {
			z.Release(req)
			return Result{Outcome: Aborted, Waited: waited}
		}
		return Result{Outcome: Admitted, Waited: waited}
	}
	z.lists[w.Class].remove(w)
	z.queued.Add(-1)
	z.pending.Add(-1)
	o, d = Full, 0
	if outcome == Timeout {
		o, d = z.tryAcquire(req, true)
	}
	z.mu.Unlock()
	if o == Admitted {
		return Result{Outcome: Admitted, Waited: waited}
	}
	return Result{Outcome: outcome, Dim: d, Waited: waited}
}

// kick hands free slots to waiters, if there are any.
func (z *Zone) kick() {
	if z.pending.Load() == 0 {
		return
	}
	z.mu.Lock()
	z.dispatchLocked()
	z.mu.Unlock()
}

// dispatchLocked admits waiters while any fits, best score first. Within a
// class the oldest waiter that fits is that class's best; a waiter whose key
// is full is skipped, so it never blocks waiters with other keys.
func (z *Zone) dispatchLocked() {
	for z.queued.Load() > 0 {
		now := z.clock.Now()
		var best *waiter
		for c := High; ; c-- {
			for w := z.lists[c].head; w != nil; w = w.next {
				if o, _ := z.tryAcquire(w.req, false); o == Admitted {
					if best == nil || w.Before(best.Place, now) {
						best = w
					}
					break
				}
			}
			if c == Low {
				break
			}
		}
		if best == nil {
			return
		}
		if o, _ := z.tryAcquire(best.req, true); o != Admitted {
			continue // a newcomer took the room in between; look again
		}
		z.lists[best.Class].remove(best)
		z.queued.Add(-1)
		z.pending.Add(-1)
		best.granted = true
		close(best.ready)
	}
}

func (l *waitList) push(w *waiter) {
	w.prev, w.next = l.tail, nil
	if l.tail == nil {
		l.head = w
	} else {
		l.tail.next = w
	}
	l.tail = w
}

func (l *waitList) remove(w *waiter) {
	if w.prev == nil {
		l.head = w.next
	} else {
		w.prev.next = w.next
	}
	if w.next == nil {
		l.tail = w.prev
	} else {
		w.next.prev = w.prev
	}
	w.prev, w.next = nil, nil
}
