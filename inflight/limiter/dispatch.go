package limiter

import "time"

// dispatch serves the blockers a release or a change of caps gave room in
// (z.freed), in turn, all at one time (the queue order changes with time).
// mu must be held.
func (z *Zone) dispatch() {
	now := z.clock.Now()
	for i := 0; i < len(z.freed); i++ {
		z.serve(z.freed[i], now)
	}
	z.freed = z.freed[:0]
}

// serve admits the flows listed under b while the best of them fits, and
// holds b's room for the best when it does not.
//
// The best flow is tried: admitted, one waiter is granted its units (the
// flow, if it has more, may be best again); refused, the flow is listed
// under the blocker that refused it and serving stops: b's room stays held
// for it. A flow keeps every listing until it is admitted or gone, and a
// blocker's room is held for the best flow listed under it: any other try
// that needs the blocker, a newcomer's or a flow's that is not better, is
// refused there (see holds). A flow refused by another's hold makes that
// blocker served next (its best may fit now), each time by a strictly
// better flow, so a dispatch ends.
//
// So no waiter is passed for ever, however many caps it needs: let F be
// the best flow waiting. Every blocker F is listed under has F as its best,
// so no other request takes room there, and serving it tries F first: its
// count only falls. F is listed under each blocker that refuses it, and
// its units are clamped to each cap (see units): once the requests holding
// its blockers have given back enough, within one service time of the
// last blocker it was refused by, F fits. Only a flow that becomes better
// than F (a higher class before F has aged, or a fair share due) is served
// before it, and the queue order bounds those (see Place.Before, fair.go).
// The price: a blocker held for a flow that waits for another does not
// serve the flows behind it meanwhile.
//
// Each try admits a waiter or ends the serving: a release costs
// O(log flows) per waiter it admits, not the number of waiters.
func (z *Zone) serve(b blocker, now time.Time) {
	for {
		fl := z.filingOf(b)
		if fl == nil {
			return
		}
		f := z.first(fl, now)
		r := reservation{f: f, now: now}
		o, d := z.tryAcquire(f.head.req, &r)
		if o != Admitted {
			z.file(f, o, d)
			if r.byHold {
				z.freed = append(z.freed, z.blockerOf(f.head.req, o, d))
			}
			return
		}
		if f.fair {
			z.chargeGrant(f.head)
		}
		z.grant(f.head)
	}
}

// grant hands w the units it was just admitted to, and wakes it.
func (q *queue) grant(w *waiter) {
	q.dequeue(w)
	q.pending.Add(-1)
	w.granted = true
	close(w.ready)
}

// reservation says whose try it is, for the holds on blockers' room (nil:
// none, for a try without mu): a blocker with flows listed under it
// refuses a newcomer (f nil), and a flow that is not its best at now.
type reservation struct {
	f      *flow
	now    time.Time
	byHold bool // set when a hold refused the try
}

// reservedAll respects every blocker's waiters: a newcomer's try while
// requests wait.
var reservedAll = &reservation{}

// holds reports whether b's room is held against r's try: some flow is
// listed under b and r is no flow, or one that is not b's best at r.now.
func (q *queue) holds(r *reservation, b blocker) bool {
	fl := q.filingOf(b)
	if fl == nil {
		return false
	}
	held := r.f == nil
	if !held {
		best := q.first(fl, r.now)
		held = best != r.f && q.before(best, r.f, r.now)
	}
	if held && r.f != nil {
		r.byHold = true
	}
	return held
}
