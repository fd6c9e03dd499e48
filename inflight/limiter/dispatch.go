package limiter

// dispatch tries the candidate flows (z.cands) and admits their waiters
// while any fits, the best first; a flow that does not fit is filed under
// what blocks it now. mu must be held.
//
// Each round tries every candidate's head once and either admits one
// waiter or has filed every candidate, so a release costs the flows it
// could unblock, once per waiter it admits and once more.
func (z *Zone) dispatch() {
	cands := z.cands
	for len(cands) > 0 {
		fit := cands[:0]
		for _, f := range cands {
			o, d := z.tryAcquire(f.head.req, false)
			if o != Admitted {
				z.file(f, z.blockerOf(f.head.req, o, d))
				continue
			}
			fit = append(fit, f)
		}
		cands = fit
		if len(cands) == 0 {
			break
		}
		i := z.best(cands)
		f := cands[i]
		if o, _ := z.tryAcquire(f.head.req, true); o != Admitted {
			continue // a newcomer that read pending == 0 took the room: the next round files f
		}
		if f.fair {
			z.charge(f, f.head.req.taken)
		}
		z.grant(f.head)
		if f.n == 0 {
			cands[i] = cands[len(cands)-1]
			cands = cands[:len(cands)-1]
		}
	}
	clear(z.cands[:cap(z.cands)])
	z.cands = z.cands[:0]
}

// grant hands w the slots it was just admitted to, and wakes it.
func (z *Zone) grant(w *waiter) {
	z.dequeue(w)
	z.pending.Add(-1)
	w.granted = true
	close(w.ready)
}

// best returns the index of the flow whose head goes first.
func (z *Zone) best(cands []*flow) int {
	b := 0
	if len(cands) == 1 {
		return b
	}
	now := z.clock.Now()
	for i := 1; i < len(cands); i++ {
		if z.before(cands[i], cands[b], now) {
			b = i
		}
	}
	return b
}
