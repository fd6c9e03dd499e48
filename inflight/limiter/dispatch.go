package limiter

// dispatch serves the blockers a release or a change of caps gave room in
// (z.freed), in turn. mu must be held.
func (z *Zone) dispatch() {
	for i := 0; i < len(z.freed); i++ {
		z.serve(z.freed[i])
	}
	z.freed = z.freed[:0]
}

// serve admits the flows filed under b while the best of them fits, and
// holds b's room for the best when it does not.
//
// The best flow is taken out and tried: admitted, one waiter is granted its
// units and the flow is filed again (it may be best again); refused by
// another blocker, it is filed there and the next best is tried; refused
// by b itself, it is filed again and serving stops. Flows filed under a
// blocker hold its room: a newcomer, or a flow served from elsewhere, that
// needs b is refused while any flow is filed under b (see tryAcquire). So
// a request that needs many units is not passed by a stream of small ones:
// once it is the best waiting on b, the units b frees stay free until it
// fits, for about the service time of the requests holding b. Flows held
// by other blockers are not held up.
//
// Each try admits a waiter, moves a flow to another blocker, or ends the
// serving: a release costs O(log flows) per waiter it admits or flow it
// moves, not the number of waiters.
func (z *Zone) serve(b blocker) {
	for {
		fl := z.filingOf(b)
		if fl == nil {
			return
		}
		f := z.first(fl, z.clock.Now())
		z.unfile(f)
		o, d := z.tryAcquire(f.head.req, reservedExcept(b))
		if o != Admitted {
			nb := z.blockerOf(f.head.req, o, d)
			z.file(f, nb)
			if nb == b {
				return
			}
			continue
		}
		if f.fair {
			z.charge(f, f.head.req.taken)
		}
		z.grant(f.head)
		if f.n > 0 {
			z.file(f, b)
		}
	}
}

// grant hands w the units it was just admitted to, and wakes it.
func (q *queue) grant(w *waiter) {
	q.dequeue(w)
	q.pending.Add(-1)
	w.granted = true
	close(w.ready)
}

// reservation says which blockers' room a try respects (nil: none, for a
// try without mu): a blocker with flows filed under it refuses every
// request but those served from it (except, if any).
type reservation struct {
	except blocker
	any    bool // except is set
}

// reservedAll respects every blocker's waiters: a newcomer's try while
// requests wait.
var reservedAll = &reservation{}

// reservedExcept respects every blocker's waiters but b's, whose best flow
// is being served.
func reservedExcept(b blocker) *reservation { return &reservation{except: b, any: true} }

// holds reports whether b's room is held for flows filed under it.
func (q *queue) holds(r *reservation, b blocker) bool {
	return !(r.any && r.except == b) && q.filed(b)
}
