package limiter


// A zone with a ledger asks it for allowance in calls, one at a time,
// made by one goroutine of the zone (the asker) while it has something to
// ask, to give back or to keep: the requests short of allowance (waiters,
// in the queue order, then requests that do not wait, in their order of
// arrival, which wait only for the call's answer), and the allowance its
// requests left idle (see allowance.go). A request that arrives while a
// call is under way goes in the next one, so a busy zone makes one call
// per round trip whatever its rate. Waiters the fleet refused are asked
// for again when the ledger announces a change, and at least every
// fleetPoll.
//
// What a call granted for its waiters goes to them in the queue order (see
// dispatch): a waiter better than the one it was granted for takes it
// first. A newcomer the fleet granted is admitted at once, with the
// allowance granted for it.

// asking is the state of a zone's calls. Guarded by the zone's mu.
type asking struct {
	running bool          // the asker runs
	wake    chan struct{} // something new to ask or give back
	// changed says the fleet changed since the last call: every waiter
	// that needs allowance is asked for again, not only those new to it.
	changed   bool
	newcomers []*newcomer    // requests that do not wait, for the next call
	returns   map[Set]*Units // allowance to give back in the next call
	closed    bool           // the zone is no longer used: keep no idle allowance
}

// newcomer is a request that arrived short of allowance: the next call
// decides it, before it waits if it may (waits).
type newcomer struct {
	req   *Request
	waits bool
	done  chan Result
}

// SetLedger makes l the zone's ledger: from then on it admits within the
// allowances l grants. Call it once, before the zone admits anything.
func (z *Zone) SetLedger(l Ledger) {
	z.ledger = l
	z.asks.wake = make(chan struct{}, 1)
	z.asks.returns = map[Set]*Units{}
}

// askFor has the asker decide req, a newcomer short of allowance, in its
// next call; waits says it waits if refused. mu must be held; askFor
// releases it.
func (z *Zone) askFor(req *Request, waits bool) Result {
	n := &newcomer{req: req, waits: waits, done: make(chan Result, 1)}
	z.asks.newcomers = append(z.asks.newcomers, n)
	z.startAsking()
	z.mu.Unlock()
	return <-n.done
}

// startAsking wakes the asker, started if it does not run. mu must be
// held.
func (z *Zone) startAsking() {
	if !z.asks.running {
		z.asks.running = true
		go z.asker()
	}
	select {
	case z.asks.wake <- struct{}{}:
	default:
	}
}

// giveBackLater has units of set's idle allowance given back in the next
// call, taken off it now, and keeps spare idle there from now on. mu must
// be held.
func (z *Zone) giveBackLater(set Set, units, spare int64) {
	if units <= 0 {
		return
	}
	z.shrink(set, units, spare)
	r := z.asks.returns[set]
	if r == nil {
		r = &Units{Set: set}
		z.asks.returns[set] = r
	}
	r.Units += units
	r.Spare = spare
	z.startAsking()
}

// asker makes the zone's calls while it has anything to ask, to give back
// or to keep.
func (z *Zone) asker() {
	for {
		z.mu.Lock()
		c, ws := z.nextCall()
		if c == nil {
			if !z.askerHasWork() {
				z.asks.running = false
				z.mu.Unlock()
				return
			}
			wanting := z.wanting()
			z.mu.Unlock()
			z.waitForWork(wanting)
			continue
		}
		z.mu.Unlock()
		err := z.ledger.Ask(c)
		z.mu.Lock()
		z.answer(c, ws, err)
		z.mu.Unlock()
	}
}

// waitForWork waits for something new: a request to ask for, a change
// the ledger announces, the poll if waiters want allowance, and the sweep
// of idle allowance.
func (z *Zone) waitForWork(wanting bool) {
	poll := linger
	if wanting {
		poll = min(poll, fleetPoll)
	}
	timer, stop := z.clock.After(poll)
	defer stop()
	select {
	case <-z.asks.wake:
		return
	case <-z.ledger.Changed():
	case <-timer:
	}
	z.mu.Lock()
	z.asks.changed = true
	z.sweep(z.clock.Now().UnixNano())
	z.mu.Unlock()
}

// askerHasWork reports whether the asker has to stay: waiters want
// allowance (to ask for again), or the zone holds allowance (to sweep; a
// closed zone keeps none idle). mu must be held.
func (z *Zone) askerHasWork() bool {
	return z.wanting() || !z.asks.closed && z.holdsAllowance()
}

// Close gives back the zone's idle allowance, and keeps none from then
// on: the zone is no longer used. The requests still in flight give
// theirs back as they end.
func (z *Zone) Close() {
	if z.ledger == nil {
		return
	}
	z.mu.Lock()
	z.asks.closed = true
	z.sweep(z.clock.Now().UnixNano())
	z.mu.Unlock()
}

// wanting reports whether waiters want allowance. mu must be held.
func (z *Zone) wanting() bool {
	for _, f := range z.byID {
		for ; f != nil; f = f.collide {
			if f.asks {
				return true
			}
		}
	}
	return false
}

// asked pairs a call's want with the waiter it asks for; nil for a
// newcomer.
type asked struct {
	w *waiter
	n *newcomer
}

// nextCall returns the call to make now, and who each want is for; nil if
// there is nothing to ask or give back. mu must be held.
func (z *Zone) nextCall() (*Call, []asked) {
	c := &Call{}
	for _, r := range z.asks.returns {
		c.Returns = append(c.Returns, *r)
	}
	clear(z.asks.returns)
	var ws []asked
	for _, w := range z.order(z.clock.Now()) {
		f := w.flow
		if w != f.head || !f.asks || !(z.asks.changed || f.fresh) {
			continue
		}
		f.fresh = false
		c.Wants = append(c.Wants, z.wantOf(w.req, true, f))
		ws = append(ws, asked{w: w})
	}
	z.asks.changed = false
	for _, n := range z.asks.newcomers {
		c.Wants = append(c.Wants, z.wantOf(n.req, n.waits, nil))
		ws = append(ws, asked{n: n})
	}
	z.asks.newcomers = z.asks.newcomers[:0]
	if len(c.Returns) == 0 && len(c.Wants) == 0 {
		return nil, nil
	}
	return c, ws
}

// wantOf returns what req needs of the fleet: its units in each of its
// sets where this instance holds less idle, within the fleet's caps. f is
// its flow if it waits. mu must be held.
func (z *Zone) wantOf(req *Request, waits bool, f *flow) Want {
	lim := z.limitsFor(req)
	units := lim.units(req, z.hasTotal, true)
	want := Want{Req: req, Keys: req.Keys, Units: units, Waits: waits}
	for _, set := range z.setsOf(req) {
		a := z.stateOf(set)
		if a.idle() >= units {
			continue
		}
		spare := int64(0) // a set used lately asks for room ahead: twice what it holds
		if a.exists {
			spare = a.units + units
		}
		want.Sets = append(want.Sets, set)
		want.Caps = append(want.Caps, lim.capOf(req, set.Dim, true))
		want.Spares = append(want.Spares, spare)
	}
	if f != nil {
		want.Hold = f.refused
		if f.fair {
			want.Fair = z.fairWant(f, units)
		}
	}
	return want
}

// answer applies a call's answer: the grants, then each want's verdict. A
// want granted is admitted at once with its allowance; a waiter refused
// goes on waiting, to be asked for again at the next change. mu must be
// held.
func (z *Zone) answer(c *Call, ws []asked, err error) {
	now := z.clock.Now()
	for _, g := range c.Grants {
		z.grow(g.Set, g.Units, g.Spare, now.UnixNano())
		z.freed = append(z.freed, g.Set.blocker())
	}
	for i := range c.Wants {
		want, a := &c.Wants[i], ws[i]
		if err != nil {
			want.Outcome, want.Dim = Unavailable, firstDim(want.Req)
		}
		if want.Outcome == Admitted {
			for _, set := range want.Sets {
				z.grow(set, want.Units, -1, now.UnixNano())
				z.freed = append(z.freed, set.blocker())
			}
		}
		switch {
		case a.n != nil:
			z.decide(a.n, want)
		case a.w.left: // it left meanwhile
		case want.Outcome == Admitted: // what it was granted goes by the queue order
			a.w.levels = want.Levels
		case want.Outcome == Unavailable:
			z.refuseWaiter(a.w, Unavailable, want.Dim)
		default: // full in the fleet: it holds that room in the next calls
			a.w.levels = want.Levels
			a.w.flow.refusedBy(want.Dim)
		}
	}
	z.dispatch()
}

// decide answers a newcomer: admitted with the allowance granted for it,
// or refused.
func (z *Zone) decide(n *newcomer, want *Want) {
	res := Result{Outcome: want.Outcome, Dim: want.Dim, Levels: want.Levels}
	if want.Outcome == Admitted {
		if o, d := z.tryAcquire(n.req, nil); o != Admitted {
			res = Result{Outcome: Full, Dim: d, Levels: want.Levels}
		} else if f := want.Fair; f != nil { // charged on the fleet's clock alone
			z.charged(n.req, &fairCharge{fleet: z.ledger, dim: f.Dim, weight: f.Weight, est: f.Work / float64(want.Units)})
		}
	}
	n.done <- res
}

// blocker is the constraint s stands for in the queue.
func (s Set) blocker() blocker {
	if s.Dim == TotalDim {
		return blocker{total: true}
	}
	return keyBlocker(s.Dim, s.Hash)
}

// firstDim is req's first dimension with a key, or the total.
func firstDim(req *Request) int {
	for d, k := range req.Keys {
		if k != "" {
			return d
		}
	}
	return TotalDim
}

// sweep gives back the idle allowance of sets no request holds nor took
// for linger, and of those the ledger says are tight. mu must be held.
func (z *Zone) sweep(now int64) {
	old := now - int64(linger)
	visit := func(set Set) {
		a := z.stateOf(set)
		if a.exists && (z.asks.closed || a.inFlight == 0 && a.used < old || z.ledger.Tight(set)) {
			z.giveBackLater(set, a.idle(), 0)
			if a.idle() == 0 && a.inFlight == 0 {
				z.shrink(set, 0, 0) // drops a key's empty allowance
			}
		}
	}
	if z.hasTotal {
		visit(Set{Dim: TotalDim})
	}
	var sets []Set
	for i := range z.shards {
		s := &z.shards[i]
		s.mu.Lock()
		for h := range s.allow {
			sets = append(sets, Set{Dim: i / numShards, Hash: h})
		}
		s.mu.Unlock()
	}
	for _, set := range sets {
		visit(set)
	}
}

// holdsAllowance reports whether the zone holds any allowance. mu must be
// held.
func (z *Zone) holdsAllowance() bool {
	if z.totalAllow.units.Load() > 0 {
		return true
	}
	for i := range z.shards {
		s := &z.shards[i]
		s.mu.Lock()
		n := len(s.allow)
		s.mu.Unlock()
		if n > 0 {
			return true
		}
	}
	return false
}

// refuseWaiter takes w out of the queue with outcome o by dimension d, and
// wakes it. mu must be held.
func (z *Zone) refuseWaiter(w *waiter, o Outcome, d int) {
	z.dequeue(w)
	z.pending.Add(-1)
	w.outcome, w.dim = o, d
	close(w.ready)
}

// fileRefusal files f under what refused its head (see file) and, with a
// ledger, notes whether it needs the fleet: short of allowance, it is
// asked for in the asker's next call; refused by a cap, it waits for this
// instance's releases alone. mu must be held.
func (z *Zone) fileRefusal(f *flow, o Outcome, d int) {
	z.file(f, o, d)
	if z.ledger == nil {
		return
	}
	switch {
	case o == fleetFull: // asked for just now: again at the fleet's next change
		f.asks = true
		z.startAsking()
	case o == short && !f.asks:
		f.asks, f.fresh = true, true
		z.startAsking()
	case o != short:
		f.asks = false
	}
}

// acquireNow admits req if it fits now, after any waiter that fits,
// without waiting; with a ledger, one short of allowance is decided by the
// asker's next call.
func (z *Zone) acquireNow(req *Request) Result {
	if z.ledger == nil {
		o, d := z.tryNow(req)
		return Result{Outcome: o, Dim: d}
	}
	if z.pending.Load() == 0 {
		if o, d := z.tryAcquire(req, nil); o != short {
			return Result{Outcome: o, Dim: d}
		}
	}
	z.mu.Lock()
	if o, d := z.tryNewcomer(req); o != short {
		z.mu.Unlock()
		return Result{Outcome: o, Dim: d}
	}
	return z.askFor(req, false)
}
