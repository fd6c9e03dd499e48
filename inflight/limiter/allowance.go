package limiter

import (
	"sync/atomic"
	"time"
)

// With a ledger, a zone admits within allowances: in each set a request
// needs (its keys' and the total's), the units in flight plus its own may
// not pass this instance's allowance there, nor the cap. A request short
// of allowance is asked for (see asking.go). Units a request gives back
// stay in the allowance, idle, up to the set's spare (what the fleet lets
// this instance keep idle there, granted from the room beyond the fleet's
// reserve): the zone's next request takes them with no round trip. The
// rest goes back to the ledger in the zone's next call, and so does all
// of it where the ledger says the set is tight (another instance wants
// it), or once no request used it for linger.
//
// Invariants, besides the zone's:
//   - A set's allowance changes only under mu and its shard's lock (the
//     total's: under mu), so an admission under the shard locks reads one
//     value. It grows only by what an Ask answered (the wants admitted,
//     its Grants), and shrinks only by the returns the zone hands the
//     ledger in its next call: the fleet always counts at least what the
//     zone admits within.
//   - Idle allowance (units not in flight) is at most the set's spare once
//     a release has given back the excess, but while a want's grant waits
//     to be taken (a waiter that left meanwhile).

// linger is how long allowance no request used is kept before it goes
// back, where the set is not tight.
const linger = 100 * time.Millisecond

// allowance is this instance's allowance in one set: the units the fleet
// counts for it, in flight or idle, how many may stay idle (spare), and
// when a request last took units of it.
type allowance struct {
	units int64
	spare int64
	used  int64 // the zone's clock, unix nanoseconds
}

// totalAllowance is the total's allowance, read by admissions without mu.
type totalAllowance struct {
	units atomic.Int64
	spare atomic.Int64
	used  atomic.Int64
}

// allowanceOf returns the allowance of a key hash in shard s (nil: none).
// s's lock must be held.
func (s *shard) allowanceOf(hash uint64) *allowance { return s.allow[hash] }

// grow adds units to set's allowance, and sets its spare if spare is not
// negative. mu must be held.
func (z *Zone) grow(set Set, units, spare, now int64) {
	if set.Dim == TotalDim {
		z.totalAllow.units.Add(units)
		if spare >= 0 {
			z.totalAllow.spare.Store(spare)
		}
		z.totalAllow.used.Store(now)
		return
	}
	s := z.shardOf(set.Dim, set.Hash)
	s.mu.Lock()
	a := s.allow[set.Hash]
	if a == nil {
		if s.allow == nil {
			s.allow = map[uint64]*allowance{}
		}
		a = &allowance{}
		s.allow[set.Hash] = a
	}
	a.units += units
	if spare >= 0 {
		a.spare = spare
	}
	a.used = now
	s.mu.Unlock()
}

// allowanceState is a set's allowance as one read sees it.
type allowanceState struct {
	units, spare, inFlight, used int64
	exists                       bool
}

// idle is the units of the allowance not in flight.
func (a allowanceState) idle() int64 { return a.units - a.inFlight }

// stateOf reads set's allowance and its units in flight.
func (z *Zone) stateOf(set Set) allowanceState {
	if set.Dim == TotalDim {
		return allowanceState{units: z.totalAllow.units.Load(), spare: z.totalAllow.spare.Load(),
			inFlight: z.total.Load() & MaxCost, used: z.totalAllow.used.Load(), exists: true}
	}
	s := z.shardOf(set.Dim, set.Hash)
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.allow[set.Hash]
	if a == nil {
		return allowanceState{inFlight: s.count(set.Hash)}
	}
	return allowanceState{units: a.units, spare: a.spare, inFlight: s.count(set.Hash), used: a.used, exists: true}
}

// shrink takes units off set's allowance and sets its spare, for a
// return; a key's allowance is dropped once nothing is left of it. mu must
// be held.
func (z *Zone) shrink(set Set, units, spare int64) {
	if set.Dim == TotalDim {
		z.totalAllow.units.Add(-units)
		z.totalAllow.spare.Store(spare)
		return
	}
	s := z.shardOf(set.Dim, set.Hash)
	s.mu.Lock()
	if a := s.allow[set.Hash]; a != nil {
		a.units -= units
		a.spare = spare
		if a.units <= 0 && s.count(set.Hash) == 0 {
			delete(s.allow, set.Hash)
		}
	}
	s.mu.Unlock()
}

// setsOf returns the sets req needs: its keys' (hashed) and the total's.
func (z *Zone) setsOf(req *Request) []Set {
	sets := make([]Set, 0, len(req.Keys)+1)
	for d, key := range req.Keys {
		if key != "" {
			sets = append(sets, Set{Dim: d, Hash: z.hash(req, d)})
		}
	}
	if z.hasTotal {
		sets = append(sets, Set{Dim: TotalDim})
	}
	return sets
}

// excess reports whether one of sets holds more idle allowance than the
// zone keeps: its spare, or nothing where the ledger says it is tight.
func (z *Zone) excess(sets []Set) bool {
	for _, set := range sets {
		if a := z.stateOf(set); a.idle() > z.keep(set, a) {
			return true
		}
	}
	return false
}

// keep is how much idle allowance the zone keeps in set: its spare, or
// all of it while waiters here need the set (they take it at their next
// try), or nothing where the ledger says it is tight.
func (z *Zone) keep(set Set, a allowanceState) int64 {
	switch {
	case z.asks.closed || z.ledger.Tight(set):
		return 0
	case z.filed(set.blocker()):
		return a.units
	}
	return a.spare
}

// trim gives back, in the next call, the idle allowance of sets beyond
// what the zone keeps there. mu must be held.
func (z *Zone) trim(sets []Set) {
	for _, set := range sets {
		a := z.stateOf(set)
		if keep := z.keep(set, a); a.idle() > keep {
			z.giveBackLater(set, a.idle()-keep, min(a.spare, keep))
		}
	}
}
