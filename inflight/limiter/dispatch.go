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
// by only shrinks as others are admitted. So is a flow the fleet just
// refused (see unshort). Only a change of holder gives back held room;
// the flows are then tried again.
//
// The short waiters (see waiter.short) go first: they count as admitted
// at their turns, and wait only for this instance's allowance.
//
// Each try admits a waiter, makes it short (its flow's next waiter is
// then tried in its place) or parks a flow, so a dispatch costs O(log
// flows) per waiter it admits or makes short and per flow it passes
// over, not the number of waiters.
func (z *Zone) dispatch() reservation {
	now := z.clock.Now()
	r := z.reserve(now)
	if len(z.freed) == 0 {
		z.unpark()
		return r
	}
	z.epoch++
	z.freed = compactBlockers(z.freed)
	z.admitShort(now)
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
		w := f.holder()
		switch o, d := z.tryAcquire(w.req, r.against(z, f, now)); {
		case o == Admitted:
			z.admit(w, now)
		case o == short: // its turn, but for this instance's allowance
			if !z.shortAtTurn(f, w, d, &r, now) {
				f.tried = z.epoch
			}
		default:
			f.tried = z.epoch
			z.fileRefusal(f, w, o, d)
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

// shortAtTurn deals with w, f's holder, short of allowance at its turn (r
// readied for its try): it waits, as refused, for its flow's short
// waiters if they pile up (see pilesUp); else it goes short, charged at
// its turn as admitted, and its flow's next waiter is tried in its place;
// it is admitted at once if short only of what the holds before it took,
// which the caps let it pass. It reports whether w went short (or was
// admitted). mu must be held.
func (z *Zone) shortAtTurn(f *flow, w *waiter, d int, r *reservation, now time.Time) bool {
	if f.head.short && z.pilesUp(w, r) {
		z.file(f, short, d)
		return false
	}
	w.shortPlace = z.turn(f).tag          // where it stood at its turn, before its charge
	if f.fair && w.req.slot.fair == nil { // charged at its turn, as admitted
		z.chargeGrant(w, z.unitsOfWaiter(w))
		z.vclock.turn(f.fairKey, 1)
	}
	if z.fileRefusal(f, w, short, d); !w.short {
		return false
	}
	if o, _ := z.tryAcquire(w.req, r.pendingFor(z, w, now)); o == Admitted {
		z.admit(w, now)
	}
	return true
}

// admitShort admits the short waiters (see waiter.short) that this
// instance's allowance now covers, each against those before it in their
// one order (see orderShorts). They count as admitted at their turns, so
// they go before any waiter is tried. Those still short are asked for
// again. mu must be held.
func (z *Zone) admitShort(now time.Time) {
	if len(z.short) == 0 {
		return
	}
	var r reservation
	for _, s := range z.shortsInOrder(now) {
		o, _ := z.tryAcquire(s.req, r.pendingFor(z, s, now))
		if o == Admitted {
			z.admit(s, now)
			continue
		}
		z.short[s] = z.unitsOfWaiter(s) // under the limits that apply now
		z.startAsking()
	}
}

// pilesUp reports whether w, short of allowance behind a short waiter of
// its own flow, needs more than the fleet had room for in one of its
// sets as this instance last read it (its cap less the units in flight
// elsewhere): what it and the short waiters before it would hold there.
// If so it waits, as refused, for its flow's short waiters' grants. The
// caps are checked against this instance's counts, so without this short
// waiters would pile up at every instance of a busy fleet, up to each
// cap, holding room and asking for more than the fleet has; the flows
// with the larger caps would take more than their fair shares. A flow's
// first short waiter always asks, so that the fleet records its want.
func (z *Zone) pilesUp(w *waiter, r *reservation) bool {
	lim := z.limitsFor(w.req)
	units := z.unitsOfWaiter(w)
	for _, set := range z.setsOf(w.req) {
		st := z.stateOf(set)
		var held, cap int64
		if set.Dim == TotalDim {
			held, cap = r.holdsTotal(), z.totalCap(lim)
		} else {
			held, cap = r.holdsKey(set.Dim, set.Hash), z.capFor(lim, w.req, set.Dim)
		}
		if cap > 0 && st.inFlight+units+held > cap-st.elsewhere() {
			return true
		}
	}
	return false
}

// shortsInOrder returns the short waiters in their one order (see
// orderShorts). mu must be held.
func (z *Zone) shortsInOrder(now time.Time) []*waiter {
	r := reservation{q: &z.queue, now: now}
	r.orderShorts()
	return r.shorts
}

// admit grants w the units it was just admitted to, charged to its fair
// key if it was not at its turn. mu must be held.
func (z *Zone) admit(w *waiter, now time.Time) {
	if w.short {
		w.flow.turned = time.Time{}
	}
	switch c := w.req.slot.fair; {
	case c != nil: // charged at its turn: held from now
		c.at = now
		z.vclock.turn(c.key, -1)
	case w.flow.fair:
		z.chargeGrant(w, w.req.slot.taken)
	}
	z.grant(w)
	z.reportsMoved()
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
// changed, parking those that were, and those all of whose waiters are
// short (see admitShort).
func (q *queue) firstUntried(fl *filing, now time.Time) *flow {
	var best *flow
	for _, l := range fl.lanes {
		for e := q.top(l); e != nil; e = q.top(l) {
			if e.f.tried != q.epoch && e.f.holder() != nil {
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

// park takes f out of the lanes it is listed in until the dispatch ends,
// as if tried.
func (q *queue) park(f *flow) {
	for _, e := range f.listed {
		if !e.parked {
			heap.Remove(e.lane, e.idx)
			e.parked = true
			q.parked = append(q.parked, e)
		}
	}
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
	if w.short { // its held room is now taken
		delete(q.short, w)
		w.short = false
	}
	w.granted = true
	q.dequeue(w)
	q.pending.Add(-1)
	close(w.ready)
}
