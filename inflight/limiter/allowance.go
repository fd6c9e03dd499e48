package limiter

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"sync/atomic"
	"time"
)

// With a ledger, a zone admits within allowances: in each set a request
// needs (its keys' and the total's), the units in flight plus its own may
// not pass this instance's allowance there, nor the fleet's cap. A request
// short of allowance is asked for (see asking.go). Units a request gives
// back stay in the allowance, idle, as far as keep allows: for this
// instance's waiters that need the set, up to its target where other
// instances wait too (see target.go); else up to the set's spare (what
// the fleet lets it keep idle, from the room beyond its reserve), or none
// where another instance waits (Tight). The zone's next request takes them
// with no round trip. The rest is written back in the zone's next call,
// and so is all of it once no request used it for keepUnused.
//
// Invariants, besides the zone's:
//   - A set's allowance changes only under mu and its shard's lock (the
//     total's: under mu), so an admission under the shard locks reads one
//     value. It grows only by what a call granted (or, while the ledger
//     cannot answer and the zone fails open, by what it admitted within
//     its share: see fallback), and shrinks only by what the zone writes
//     back in a later call: so the ledger counts at least what the zone
//     admits within, at every moment, but for a fallback's admissions
//     until they are written.
//   - Idle allowance (units not in flight) is at most what keep allows
//     once a release, or a call's answer, has written back the excess,
//     but while a grant waits for its waiter's turn in the queue order.

// linger bounds how long units to write back wait for a call (one made
// anyway carries them), and is how often an idle asker sweeps.
const linger = 100 * time.Millisecond

// keepUnused is how long spare allowance no request used is kept before
// it goes back, and a key's empty entry forgotten: longer than the gaps
// between one key's requests at one instance of a busy fleet, so that a
// key in use does not lapse between them and ask Redis at its next
// request (at 100 ms, three Caddys sharing 1,000 keys made a call every
// other request). Units another instance waits for go back at once.
const keepUnused = time.Second

// allowance is this instance's allowance in one set: its name in the
// ledger, the units the fleet counts for it, in flight or idle, how many
// may stay idle (spare), and when a request last took units of it.
type allowance struct {
	name  string
	units int64
	spare int64
	used  int64 // the zone's clock, unix nanoseconds
	level int64 // the fleet's units in the set, as the latest call read them
	// heldSecs is the unit-seconds the key held here since the entry was
	// made, as of heldAt: what a fair key's report says it held (see
	// entries), kept as its count changes, so that every request counts,
	// however short, whenever the reports are read.
	heldSecs float64
	heldAt   int64
	// drain says the fleet granted these units under caps since changed
	// (see capsChanged): each goes back as it ends, till a grant under
	// the new caps.
	drain bool
}

// heldSecsAt returns a's unit-seconds held at now, the key holding n
// since a.heldAt.
func (a *allowance) heldSecsAt(now, n int64) float64 {
	if a.heldAt == 0 {
		return a.heldSecs
	}
	return a.heldSecs + float64(n)*float64(now-a.heldAt)/float64(time.Second)
}

// track brings a's unit-seconds up to date at now, as its key's count is
// to change from n: the shard's lock must be held.
func (a *allowance) track(now, n int64) {
	a.heldSecs, a.heldAt = a.heldSecsAt(now, n), now
}

// totalAllowance is the total's allowance, read by admissions without mu.
type totalAllowance struct {
	units atomic.Int64
	spare atomic.Int64
	used  atomic.Int64
	level atomic.Int64
	drain atomic.Bool // as allowance.drain
}

// totalSet names the total in a ledger.
const totalSet = "t"

// LedgerName is the name a ledger knows dimension d's key by, or the
// total by for TotalDim.
func LedgerName(d int, key string) string {
	if d == TotalDim {
		return totalSet
	}
	return setName(d, key)
}

// setName names dimension d's key in a ledger: the same on every instance
// (the fleet's zones share their shape), and no raw key leaves the
// process.
func setName(d int, key string) string {
	sum := sha256.Sum256([]byte(key))
	return strconv.Itoa(d) + ":" + hex.EncodeToString(sum[:12])
}

// allowanceOf returns the allowance of a key hash in shard s (nil: none).
// s's lock must be held.
func (s *shard) allowanceOf(hash uint64) *allowance { return s.allow[hash] }

// grow adds units to set's allowance, named name, spare of them to its
// spare. mu must be held.
func (z *Zone) grow(set Set, name string, units, spare, now int64) {
	if set.Dim == TotalDim {
		z.totalAllow.units.Add(units)
		z.totalAllow.spare.Add(spare)
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
		a = &allowance{name: name}
		s.allow[set.Hash] = a
	}
	a.units += units
	a.spare += spare
	a.used = now
	s.mu.Unlock()
}

// seen records the fleet's level of set as a call read it (if it did:
// level >= 0), and ends set's drain if the call granted units there under
// the caps that apply now (fresh). mu must be held.
func (z *Zone) seen(set Set, level int64, fresh bool) {
	if set.Dim == TotalDim {
		if level >= 0 {
			z.totalAllow.level.Store(level)
		}
		if fresh {
			z.totalAllow.drain.Store(false)
		}
		return
	}
	s := z.shardOf(set.Dim, set.Hash)
	s.mu.Lock()
	if a := s.allow[set.Hash]; a != nil {
		if level >= 0 {
			a.level = level
		}
		if fresh {
			a.drain = false
		}
	}
	s.mu.Unlock()
}

// Levels returns the level of each of req's dimensions (the total last).
// Without fleet, this instance's: the cap it enforces here (its share of
// a cap split by Divisor, the adaptive total's limit) and the units req's
// key holds here. With fleet, the fleet's as this instance's latest call
// for its set read it, or the units this instance holds there if more:
// what a request admitted within this instance's allowance knows of the
// fleet; nil without a ledger. The levels are written into buf when it
// has room, so a caller that keeps one reads them without allocating.
func (z *Zone) Levels(req *Request, fleet bool, buf Levels) Levels {
	if fleet && z.ledger == nil {
		return nil
	}
	lim := z.limitsFor(req)
	out := buf[:0]
	if n := len(req.Keys) + 1; cap(out) >= n {
		out = out[:n]
		clear(out)
	} else {
		out = make(Levels, n)
	}
	for d, key := range req.Keys {
		if key == "" {
			continue
		}
		s, h := z.shardFor(d, key)
		s.mu.Lock()
		level := s.count(h)
		if a := s.allow[h]; a != nil && fleet {
			level = max(level, a.level)
		}
		s.mu.Unlock()
		out[d] = Level{Cap: lim.capOf(req, d, fleet), InFlight: level}
	}
	if z.hasTotal {
		level := z.total.Load() & MaxCost
		if fleet {
			level = max(level, z.totalAllow.level.Load())
		}
		out[len(req.Keys)] = Level{Cap: lim.capOf(req, TotalDim, fleet), InFlight: level}
	}
	return out
}

// allowanceState is a set's allowance as one read sees it.
type allowanceState struct {
	name                         string
	units, spare, inFlight, used int64
	level                        int64
	exists, drain                bool
}

// idle is the units of the allowance not in flight.
func (a allowanceState) idle() int64 { return a.units - a.inFlight }

// stateOf reads set's allowance and its units in flight.
func (z *Zone) stateOf(set Set) allowanceState {
	if set.Dim == TotalDim {
		return allowanceState{name: totalSet, units: z.totalAllow.units.Load(), spare: z.totalAllow.spare.Load(),
			inFlight: z.total.Load() & MaxCost, used: z.totalAllow.used.Load(), level: z.totalAllow.level.Load(), exists: true,
			drain: z.totalAllow.drain.Load()}
	}
	s := z.shardOf(set.Dim, set.Hash)
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.allow[set.Hash]
	if a == nil {
		return allowanceState{inFlight: s.count(set.Hash)}
	}
	return allowanceState{name: a.name, units: a.units, spare: a.spare, inFlight: s.count(set.Hash), used: a.used, level: a.level, exists: true,
		drain: a.drain}
}

// elsewhere returns the units the fleet counts in set at other
// instances, as this instance's latest call read them: its level beyond
// what this instance holds there, less its spare.
func (a allowanceState) elsewhere() int64 {
	return max(0, a.level-(a.units-a.spare))
}

// shrink takes units off set's allowance and sets its spare, for a
// write back. mu must be held.
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
	}
	s.mu.Unlock()
}

// forget drops a key's allowance entry once it holds nothing and nothing
// is in flight: its name is not written again. mu must be held.
func (z *Zone) forget(set Set) {
	if set.Dim == TotalDim {
		return
	}
	s := z.shardOf(set.Dim, set.Hash)
	s.mu.Lock()
	if a := s.allow[set.Hash]; a != nil && a.units <= 0 && a.spare == 0 && s.count(set.Hash) == 0 {
		delete(s.allow, set.Hash)
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

// A Set is a set of the zone's allowances: dimension Dim's key of hash
// Hash (the zone's hash of it), or the total (Dim TotalDim, Hash 0).
type Set struct {
	Dim  int
	Hash uint64
}

// excess reports whether one of sets may hold more idle allowance than
// the zone keeps: a hint, read without mu, for Release (trim decides).
func (z *Zone) excess(sets []Set) bool {
	for _, set := range sets {
		a := z.stateOf(set)
		if a.idle() > a.spare || a.idle() > 0 && (z.asks.closed.Load() || z.ledger.Tight(a.name)) {
			return true
		}
	}
	return false
}

// keep is how much idle allowance the zone keeps in set: none if it
// drains; for waiters here that need it, all of it, or, where another
// instance is owed units there, what brings its units up to its target.
// It keeps none for a first waiter that yields elsewhere (see
// yieldsElsewhere), nor when what it would keep falls short of that
// waiter, or its idle units do while the instance that reported first is
// owed its own head (the ledger holds the rest for that one): kept, those
// units stood idle between the heads and the room. Else its spare, or
// nothing where another instance waits or the zone is closed.
func (z *Zone) keep(set Set, a allowanceState) int64 {
	switch {
	case z.asks.closed.Load(), a.drain:
		return 0
	case z.filed(set.blocker()):
		r := z.asks.reports[set]
		if r != nil && z.yieldsElsewhere(r.head, set) {
			return 0
		}
		t, ok := z.targetOf(set)
		if !ok {
			return a.idle()
		}
		keep := max(0, t-a.inFlight)
		if r != nil && (keep < r.head.req.cost() || z.asks.targets[set].yields && a.idle() < r.head.req.cost()) {
			return 0 // too few for the waiter that needs them here: they serve elsewhere
		}
		return keep
	case z.ledger.Tight(a.name):
		return 0
	}
	return a.spare
}

// trim writes back, in the next call, the idle allowance of sets beyond
// what the zone keeps there; with overTarget, only where other instances
// wait and the zone holds more than its target, or the set drains
// (before a release's dispatch: the zone's own waiters take the rest
// first). mu must be held.
func (z *Zone) trim(sets []Set, overTarget bool) {
	for _, set := range sets {
		a := z.stateOf(set)
		if overTarget && !a.drain && !z.filed(set.blocker()) {
			continue
		}
		if keep := z.keep(set, a); a.idle() > keep {
			z.giveBackLater(set, a.idle()-keep, min(a.spare, keep))
		}
	}
}
