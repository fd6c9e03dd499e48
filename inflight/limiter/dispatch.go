package limiter

import (
	"container/heap"
	"slices"
	"time"
)

// dispatch hands the room of the constraints in z.freed (given back by a
// release, no longer held for a head, or under changed caps) to the
// waiters listed under them: always the first of them in the queue order
// that fits, beyond the head's reservation (see reservation), until none
// fits, all at one time (the queue order changes with time). mu must be
// held. It returns the head's reservation once done, for a newcomer's
// try.
//
// A waiter not listed under a freed constraint cannot fit: each waiting
// flow is listed under a constraint that refused it, or, refused by a
// shared one (the total, a key bound), under that and under each of its
// own keys, which is where room comes back from (see file). A flow tried
// and refused is parked until the dispatch ends: the room it was refused
// by only shrinks as others are admitted. Only a change of holder gives
// back held room; the flows are then tried again.
//
// Each try admits a waiter or parks a flow, so a dispatch costs O(log
// flows) per waiter it admits and per flow it passes over, not the number
// of waiters.
func (z *Zone) dispatch() reservation {
	now := z.clock.Now()
	r := z.reserve(now)
	if len(z.freed) == 0 {
		return r
	}
	z.epoch++
	z.freed = compactBlockers(z.freed)
	// Each change of holders tries the flows again; a flow whose try
	// changes them back (going short makes another the holder, whose
	// room then refuses it by a cap, which makes it the holder again)
	// would go on for ever with mu held: past this many changes the
	// flows are tried once more each, and the next dispatch goes on.
	changes := 2*len(z.byID) + 2
	for {
		f := z.nextToTry(now)
		if f == nil {
			break
		}
		o, d := z.tryAcquire(f.head.req, r.against(z, f, now))
		charge := f.fair && f.head.req.fair == nil // not charged at its turn already
		switch o {
		case Admitted:
			if charge {
				z.chargeGrant(f.head, f.head.req.taken)
			} else if c := f.head.req.fair; c != nil { // charged at its turn: held from now
				c.at = now
				z.vclock.turn(c.key, -1)
			}
			z.grant(f.head)
		case short: // its turn, but for this instance's allowance
			if charge {
				f.shortPlace = z.turn(f).tag
				z.chargeGrant(f.head, z.unitsOf(f))
				z.vclock.turn(f.fairKey, 1)
			}
			fallthrough
		default:
			f.tried = z.epoch
			z.fileRefusal(f, o, d)
		}
		// A grant, or a refusal that found a flow's keys with room, may
		// change the holders; room they no longer hold goes to freed.
		head, sharer := z.head, z.sharer
		if r = z.reserve(now); (z.head != head || z.sharer != sharer) && changes > 0 {
			changes--
			z.unpark()
			z.epoch++
			z.freed = compactBlockers(z.freed)
		}
	}
	z.unpark()
	z.freed = z.freed[:0]
	return r
}

// nextToTry returns the first flow in the queue order at now listed under
// a freed constraint and not tried since the head last changed, parking
// the tried ones it meets.
func (z *Zone) nextToTry(now time.Time) *flow {
	var best *flow
	for _, b := range z.freed {
		fl := z.filingOf(b)
		if fl == nil {
			continue
		}
		if f := z.firstUntried(fl, now); f != nil && (best == nil || z.before(f, best, now)) {
			best = f
		}
	}
	return best
}

// firstUntried returns the first flow of fl not tried since the head last
// changed, parking those that were.
func (q *queue) firstUntried(fl *filing, now time.Time) *flow {
	var best *flow
	for _, l := range fl.lanes {
		for e := q.top(l); e != nil; e = q.top(l) {
			if e.f.tried != q.epoch {
				if best == nil || q.before(e.f, best, now) {
					best = e.f
				}
				break
			}
			heap.Pop(l)
			e.parked = true
			q.parked = append(q.parked, e)
		}
	}
	return best
}

// unpark puts the parked listings back in their lanes, but those unlisted
// meanwhile.
func (q *queue) unpark() {
	for _, e := range q.parked {
		if e.parked {
			e.parked = false
			heap.Push(e.lane, e)
		}
	}
	clear(q.parked)
	q.parked = q.parked[:0]
}

// compactBlockers sorts bs and drops repeats.
func compactBlockers(bs []blocker) []blocker {
	slices.SortFunc(bs, func(a, b blocker) int {
		switch {
		case a.total != b.total:
			if a.total {
				return -1
			}
			return 1
		case a.key < b.key:
			return -1
		case a.key > b.key:
			return 1
		}
		return 0
	})
	return slices.Compact(bs)
}

// grant hands w the units it was just admitted to, and wakes it.
func (q *queue) grant(w *waiter) {
	delete(q.short, w.flow)
	w.granted = true
	q.dequeue(w)
	q.pending.Add(-1)
	close(w.ready)
}
