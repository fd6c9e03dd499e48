package limiter

import "time"

// Room is held for one waiter only: the head, the first in the queue
// order at the zone's latest event (an arrival, a release, a waiter
// leaving, a change of caps). The head holds at most its own units
// (one key, under a key bound) in each constraint it needs:
//   - in each of its own keys (a key of a limit it has a key in) always,
//   - in the shared constraints (the total, a limit's key bound for a key
//     not yet in flight) only while all its own keys have room for it.
//
// Everyone else, waiter or newcomer, is admitted whenever it fits in the
// room beyond that: a freed unit goes to the first waiter in the queue
// order that fits, and room sits idle only as the head's reservation.
//
// Why the head's keys first: a head whose own key is full (a tenant at
// its cap) cannot use the total's room until one of its own requests
// ends, and that end frees a unit of the total anyway; holding the total
// for it meanwhile would leave the backend idle (with fair sharing the
// capped key is always first in the order). Why its keys at all: a big
// request that needs several caps would otherwise be passed by small
// ones in each of them, one at a time, for ever.
//
// So no waiter is passed for ever, however many caps it needs: let H be
// the head. Nothing else takes the room H holds: in each constraint H
// needs, the units in flight only fall (while H does not fit there) or
// stay where H fits (once it does), and each of them is within its cap
// (see units). So once the requests holding H's constraints have given
// back enough, H fits, and is admitted at the release that makes it fit.
// Only a waiter that becomes better than H passes it, which the queue
// order bounds (aging, fair tags).
//
// The bound on idle room: the units of one request, the head's, in each
// constraint it needs, for as long as it is the head and does not fit:
// until the requests holding the rest of its units end.

// reservation is the head's hold on its constraints, as a try under mu
// sees it: f is the flow trying (nil for a newcomer), which the hold does
// not refuse if it is the head's own.
type reservation struct {
	head  *flow // nil: nobody waits
	units int64 // the head's units
	// shared says the head's own keys have room for it: it holds the
	// total and the key bounds of its new keys too.
	shared bool
	fresh  []bool // per dimension: the head's key there is not in flight
	f      *flow
}

// holdsKey reports whether r holds room in dimension d's key hash
// against the try.
func (r *reservation) holdsKey(d int, hash uint64) bool {
	return r.against() && r.head.keyed(d) && r.head.hashes[d] == hash
}

// holdsNewKey reports whether r holds a key of dimension d's key bound
// against a try whose key there (hash) is not in flight.
func (r *reservation) holdsNewKey(d int, hash uint64) bool {
	return r.against() && r.shared && r.fresh[d] && r.head.hashes[d] != hash
}

// holdsTotal reports whether r holds room in the total against the try.
func (r *reservation) holdsTotal() bool { return r.against() && r.shared }

// against reports whether r holds anything against its try.
func (r *reservation) against() bool { return r != nil && r.head != nil && r.f != r.head }

// reserve makes the first flow in the queue order at now the head, and
// returns its reservation. If the head changed, the constraints the old
// one held go to freed: their room is no longer held. mu must be held.
func (z *Zone) reserve(now time.Time) reservation {
	head := z.first(&z.line, now)
	if head != z.head {
		if old := z.head; old != nil {
			z.freed = old.blockers(z.freed)
		}
		z.head = head
	}
	if head == nil {
		return reservation{}
	}
	req := head.head.req
	lim := z.limitsFor(req)
	r := reservation{head: head, units: z.units(lim, req), shared: true, fresh: z.fresh[:0]}
	for d := range req.Keys {
		fresh := false
		if head.keyed(d) {
			n := z.countOf(d, head.hashes[d])
			fresh = n == 0
			if n+r.units > capFor(lim, req, d) {
				r.shared = false
			}
		}
		r.fresh = append(r.fresh, fresh)
	}
	z.fresh = r.fresh
	return r
}

// countOf returns the units in flight of dimension d's key hash.
func (z *Zone) countOf(d int, hash uint64) int64 {
	s := z.shardOf(d, hash)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count(hash)
}

// blockers appends the constraints f needs, whose room it holds as the
// head: its keys, their key bounds and the total.
func (f *flow) blockers(out []blocker) []blocker {
	for d := range f.hashes {
		if f.keyed(d) {
			out = append(out, keyBlocker(d, f.hashes[d]), keysBlocker(d))
		}
	}
	return append(out, blocker{total: true})
}
