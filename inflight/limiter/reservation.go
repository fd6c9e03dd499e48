package limiter

import (
	"cmp"
	"slices"
	"time"
)

// While requests wait, room is held for two of them at most, as the queue
// order stands at the zone's latest event (an arrival, a release, a
// waiter leaving, a change of caps):
//   - the head, the first waiter, holds its own units in each of its own
//     keys (the key it has in each limit);
//   - the first waiter whose own keys all have room for it (beyond the
//     head's hold) holds its own units in the shared constraints: the
//     total, and one key of each key bound its new keys need.
//
// A hold refuses the waiters after its holder in the queue order, and
// newcomers, where they would leave the holder less than its units; it
// never refuses a waiter before it. Everyone else is admitted whenever it
// fits in the room beyond: a freed unit goes to the first waiter in the
// queue order that fits, and room sits idle only as these holds.
//
// Why the shared constraints go to a waiter whose keys have room: a head
// whose own key is full (a tenant at its cap) cannot use the total's room
// until one of its own requests ends, and that end frees a unit of the
// total anyway; holding the total for it meanwhile leaves the backend
// idle (with fair sharing the capped key is always first in the order),
// and lets small requests behind it pass big ones. Why the head holds its
// keys at all: a big request that needs several caps would otherwise be
// passed by small ones in each of them, one at a time, for ever.
//
// So no waiter is passed for ever, however many caps it needs: let H be
// the head. Nothing after H takes the room H needs: in each of H's keys
// the units in flight only fall (while H does not fit there) or stay
// where H fits (once it does); once its keys have room, H is the first
// waiter whose keys do, and holds the total and its key bounds alike.
// Each cap is at least H's units (see units), so once the requests
// holding H's constraints have given back enough, H fits, and is admitted
// at the release that makes it fit. Only a waiter that becomes better
// than H passes it, which the queue order bounds (aging, fair tags).
//
// The bound on idle room: the head's units in each of its keys, and the
// shared holder's units in the total (one key in a key bound), each for as
// long as its holder waits and does not fit there: until the requests
// holding the rest of its units end.

// reservation is the holds as a try under mu sees them: the try by f's
// holder (f nil: a newcomer's), or by the short waiter pend (see
// pending), set by against or pendingFor.
type reservation struct {
	head      *flow // nil: nobody waits
	headUnits int64
	// shared holds the total and the key bounds of its new keys (fresh
	// per limit); nil: no waiter's keys have room.
	shared      *flow
	sharedUnits int64
	fresh       []bool

	f           *flow
	pend        *waiter
	headFirst   bool // head goes before f
	sharedFirst bool // shared goes before f
	q           *queue
	now         time.Time
	// shortNew are the keys not in flight that the short waiters before
	// the try need: each holds one key of its limit's key bound.
	shortNew []Set
	// shorts are the short waiters in one order (see after).
	shorts []*waiter
}

// against readies r for a try by f's holder (f nil: a newcomer's) at
// now. mu must be held, and no shard lock.
func (r *reservation) against(z *Zone, f *flow, now time.Time) *reservation {
	return r.ready(z, f, nil, now)
}

// pendingFor readies r for a try by s, a short waiter, at now (see
// pending). mu must be held, and no shard lock.
func (r *reservation) pendingFor(z *Zone, s *waiter, now time.Time) *reservation {
	return r.ready(z, s.flow, s, now)
}

// ready readies r for a try by pend, or by f's holder if pend is nil.
func (r *reservation) ready(z *Zone, f *flow, pend *waiter, now time.Time) *reservation {
	q := &z.queue
	r.f, r.pend, r.q, r.now = f, pend, q, now
	r.shortNew = r.shortNew[:0]
	r.orderShorts()
	for s := range q.short {
		if !r.after(s) {
			continue
		}
		g := s.flow
		for d, h := range g.hashes {
			if k := (Set{Dim: d, Hash: h}); g.keyed(d) && !slices.Contains(r.shortNew, k) && z.countOf(d, h) == 0 {
				r.shortNew = append(r.shortNew, k)
			}
		}
	}
	// The holders are the first flows by their holders, the short waiters
	// counted as admitted: the head goes before any other, the shared
	// holder before those after it.
	r.headFirst = pend == nil && r.head != nil && r.head != f
	r.sharedFirst = pend == nil && r.shared != nil && r.shared != f && (f == nil || q.turn(r.shared).before(q.turn(f), now))
	return r
}

// holdsKey returns the units r holds in dimension d's key hash against
// its try: the head's, and those of the short waiters before the try.
func (r *reservation) holdsKey(d int, hash uint64) int64 {
	if r == nil {
		return 0
	}
	var n int64
	if r.headFirst && r.head.keyed(d) && r.head.hashes[d] == hash {
		n = r.headUnits
	}
	for s, units := range r.q.short {
		if g := s.flow; g.keyed(d) && g.hashes[d] == hash && r.after(s) {
			n += units
		}
	}
	return n
}

// pending reports whether r's try is by a short waiter. Its turn came:
// the caps and the holds let it in, as they would have admitted it
// without a ledger, and it waits for this instance's allowance alone. So
// its tries check the allowances (see tryAcquire), against the short
// waiters before it, and not the caps or the holders' room again: a
// change of holders that its own turn made (its charge moving its key
// back in the fair order, say) would otherwise refuse it, and let in
// another in its place that the caps had passed over.
func (r *reservation) pending() bool {
	return r != nil && r.pend != nil
}

// after reports whether r's try comes after the short waiter s, which
// then holds against it: a newcomer's does, and that of s's own flow's
// holder; another short waiter's if s comes first in their one order
// (see orderShorts); any other waiter's until the zone's next release
// since s's turn, as the model admits s at its turn and lets no one have
// its room, and from then only if it goes after s in the queue order as
// it stood at s's turn (see queue.turnOf): the room a release brings goes
// by the queue order, and a better waiter takes it rather than leave it
// idle for the ledger's round trip.
func (r *reservation) after(s *waiter) bool {
	switch {
	case r.pend != nil:
		return slices.Index(r.shorts, s) < slices.Index(r.shorts, r.pend)
	case r.f == nil || s.flow == r.f:
		return true
	case s.shortAt == r.q.releases:
		return true
	}
	return r.q.turnOf(s).before(r.q.turn(r.f), r.now)
}

// orderShorts puts the short waiters in r.shorts in one order: as the
// queue order stood at their turns (see queue.turnOf), by insertion from
// their arrival. The queue order is not one order over short waiters
// (flows of one key go by arrival, others by tag: over three short
// waiters, two of one key, each would go before the next), and each
// holding against the next, none would be admitted while the allowance
// they wait for sat idle.
func (r *reservation) orderShorts() {
	s := r.shorts[:0]
	for w := range r.q.short {
		s = append(s, w)
	}
	slices.SortFunc(s, func(a, b *waiter) int { return cmp.Compare(a.seq, b.seq) })
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && r.q.turnOf(s[j]).before(r.q.turnOf(s[j-1]), r.now); j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	r.shorts = s
}

// turn returns the candidate of f's holder where it stands in the queue
// order: fair flows by their keys' places, which rebases do not move, and
// never before its own short head's turn (a correction that moved its
// key's place back would put it before the short waiters between, which
// hold against its head).
func (q *queue) turn(f *flow) candidate {
	c := candidate{f: f, w: f.lead()}
	if f.fair {
		c.tag = q.vclock.place(f.fairKey)
		if f.head.short {
			c.tag = max(c.tag, f.head.shortPlace)
		}
	}
	return c
}

// turnOf returns the candidate of s, a short waiter, where it stood at
// its turn, before its charge then, so that its charge moves no one ahead
// of it.
func (q *queue) turnOf(s *waiter) candidate {
	return candidate{f: s.flow, w: s, tag: s.shortPlace}
}

// shortHolds reports whether a short waiter before r's try has dimension
// d's key hash, not in flight: counted as admitted at its turn, it puts
// the key in flight for the try, which its key bound does not refuse.
func (r *reservation) shortHolds(d int, hash uint64) bool {
	if r == nil {
		return false
	}
	for _, k := range r.shortNew {
		if k.Dim == d && k.Hash == hash {
			return true
		}
	}
	return false
}

// holdsNewKey returns the keys r holds in dimension d's key bound against
// a try whose key there (hash) is not in flight.
func (r *reservation) holdsNewKey(d int, hash uint64) int64 {
	if r == nil {
		return 0
	}
	var n int64
	if r.sharedFirst && r.fresh[d] && r.shared.hashes[d] != hash {
		n = 1
	}
	for _, k := range r.shortNew {
		if k.Dim == d && k.Hash != hash {
			n++
		}
	}
	return n
}

// holdsTotal returns the units r holds in the total against its try:
// the shared holder's, and those of the short waiters before the try.
func (r *reservation) holdsTotal() int64 {
	if r == nil {
		return 0
	}
	var n int64
	if r.sharedFirst {
		n = r.sharedUnits
	}
	for s, units := range r.q.short {
		if r.after(s) {
			n += units
		}
	}
	return n
}

// reserve finds the holders at now and returns their reservation. A
// holder that changed gives back the room it held: its constraints go to
// freed. mu must be held.
func (z *Zone) reserve(now time.Time) reservation {
	var r reservation
	if r.head = z.firstHolding(&z.line, orderListing, now); r.head != nil {
		r.headUnits = z.unitsOfWaiter(r.head.holder())
		r.shared = z.firstWithRoom(&r, now)
	}
	if r.shared != nil {
		r.sharedUnits = z.unitsOfWaiter(r.shared.holder())
		r.fresh = z.fresh[:0]
		for d := range r.shared.hashes {
			r.fresh = append(r.fresh, r.shared.keyed(d) && z.countOf(d, r.shared.hashes[d]) == 0)
		}
		z.fresh = r.fresh
	}
	if r.head != z.head {
		if z.head != nil {
			z.freed = z.head.keyBlockers(z.freed)
		}
		z.head = r.head
	}
	if r.shared != z.sharer {
		if z.sharer != nil {
			z.freed = z.sharer.sharedBlockers(z.freed)
		}
		z.sharer = r.shared
	}
	return r
}

// firstWithRoom returns the first waiter, in the queue order at now,
// whose own keys have room for it beyond r's head's hold. It looks among
// the flows last refused by a shared constraint (eligible); one whose
// keys no longer have room is filed under its key instead. mu must be
// held.
func (z *Zone) firstWithRoom(r *reservation, now time.Time) *flow {
	for {
		f := z.firstHolding(&z.eligible, eligibleListing, now)
		if f == nil {
			return nil
		}
		r.against(z, f, now)
		d, ok := z.keysFit(f, r)
		if ok {
			return f
		}
		if z.fleetKeyFull(f) { // it waits for the fleet's room, not this instance's
			z.fileFleetFull(f)
			continue
		}
		z.file(f, Full, d)
	}
}

// keysFit reports whether f's holder fits in each of its keys beyond r's
// hold, and if not, the first dimension it does not fit in. With a ledger
// the caps are the fleet's: a waiter short only of this instance's
// allowance has room in its keys, as far as the zone knows, and holds the
// shared constraints while its allowance is asked for; one the fleet
// refused by one of its keys has none there until it asks again.
func (z *Zone) keysFit(f *flow, r *reservation) (int, bool) {
	if z.fleetKeyFull(f) {
		return f.fleetSet.Dim, false
	}
	req := f.holder().req
	lim := z.limitsFor(req)
	units := z.units(lim, req)
	for d := range f.hashes {
		if f.keyed(d) && z.countOf(d, f.hashes[d])+units+r.holdsKey(d, f.hashes[d]) > z.capFor(lim, req, d) {
			return d, false
		}
	}
	return 0, true
}

// unitsOf returns the units of f's head under the limits that apply to it.
func (z *Zone) unitsOf(f *flow) int64 { return z.unitsOfWaiter(f.head) }

// unitsOfWaiter returns the units of w under the limits that apply to it.
func (z *Zone) unitsOfWaiter(w *waiter) int64 {
	return z.units(z.limitsFor(w.req), w.req)
}

// countOf returns the units in flight of dimension d's key hash.
func (z *Zone) countOf(d int, hash uint64) int64 {
	s := z.shardOf(d, hash)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count(hash)
}

// keyBlockers appends f's keys, whose room it holds as the head.
func (f *flow) keyBlockers(out []blocker) []blocker {
	for d := range f.hashes {
		if f.keyed(d) {
			out = append(out, keyBlocker(d, f.hashes[d]))
		}
	}
	return out
}

// sharedBlockers appends the total and f's key bounds, whose room it
// holds as the first waiter with room in its keys.
func (f *flow) sharedBlockers(out []blocker) []blocker {
	for d := range f.hashes {
		if f.keyed(d) {
			out = append(out, keysBlocker(d))
		}
	}
	return append(out, blocker{total: true})
}

// firstHolding returns the first flow of fl in the queue order at now
// that has a holder (see flow.holder): a short waiter counts as admitted
// (its units held) while its allowance is asked for, so the holders are
// found beyond it. at gives a flow's listing in fl.
func (q *queue) firstHolding(fl *filing, at func(*flow) **listing, now time.Time) *flow {
	f := q.first(fl, now)
	if len(q.short) == 0 {
		return f
	}
	var out []*flow
	for ; f != nil && f.holder() == nil; f = q.first(fl, now) {
		q.leave(fl, *at(f))
		out = append(out, f)
	}
	for _, g := range out {
		*at(g) = q.enter(fl, g, blocker{})
	}
	return f
}

func orderListing(f *flow) **listing    { return &f.order }
func eligibleListing(f *flow) **listing { return &f.eligible }
