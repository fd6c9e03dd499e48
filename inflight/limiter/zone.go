// Package limiter counts requests in flight per key and decides, all or
// nothing, whether one more may start. It knows nothing of HTTP or Caddy.
//
// A Zone holds the counters of a fixed list of dimensions (limits), each a
// table from key to count, plus an optional zone-wide total. A key is kept
// as a 64-bit hash with a secret per-zone seed: it costs the same memory
// however long it is, and the request's string is not retained. A Request names one
// key per dimension and a cost; it is admitted only if every dimension and
// the total have room for its units, and then it holds them in each until
// Release. Caps and counts are in units: a request of cost c takes c units,
// one by default.
//
// Invariants:
//   - Cost conservation: a request takes the same units (its cost, clamped
//     to the smallest cap it is checked against, see units) in every
//     dimension and the total, all at once, and Release gives back exactly
//     those units: the units are recorded in the Request at admission, so a
//     reload that changes the caps meanwhile changes nothing given back. A
//     cost above a cap is clamped to that cap, so a request is never
//     refused for its size alone: it is admitted alone once the cap is free.
//   - Each dimension's keys are spread over numShards shards, each with its
//     own lock and table on cache lines of their own. A count is changed
//     only with its shard's lock held; a table entry exists only while its
//     count is above zero.
//   - Admission is atomic: the shard of every key a request has is locked,
//     in dimension order (so two requests never deadlock), before any count
//     is read, and nothing is written unless everything fits. A refused
//     request never changes a count, so it can never cause a neighbour to
//     be refused.
//   - The total is an atomic counter of units and requests (see unitBits),
//     raised only after the keyed dimensions have been checked under their
//     locks, by compare-and-swap against its max; it never exceeds the max
//     it was checked against, and every max is within MaxCost (units.go),
//     so units never carry into the request count.
//   - Once any Limits with MaxKeys has been used, each dimension also counts
//     its keys (keys.n): the count changes only under the lock of the shard
//     whose table gained or lost the key, and counting starts with every
//     shard locked, so it always equals the keys in the tables.
//   - An admission that brings a new key to a dimension under MaxKeys
//     holds newKeys from its check of the key counts until it has counted
//     its keys; the total is taken in between, and the key counts are
//     raised only once the admission can no longer be refused. Only
//     newKeys' holder raises a count under MaxKeys, so the keys of a
//     dimension never exceed MaxKeys (admissions under Limits without
//     MaxKeys add keys freely), and a refused admission never wrote one:
//     no neighbour is refused for a key that was not in flight, and no
//     waiter is filed behind a key bound that was not full.
//   - Lock order: the queue lock (Zone.mu), the shard locks in dimension
//     order, newKeys.
//   - While any request is queued, admissions and releases go through the
//     queue lock, so a freed slot reaches the waiters it can unblock before
//     any newcomer sees it (see queue.go).
//   - Held room: while requests wait, room is held for two waiters at
//     most, each at most its own units: the first in the queue order, in
//     each of its own keys, and the first whose own keys have room, in
//     the total and its key bounds. Everything else fits or does not by
//     the counts: a freed unit goes to the first waiter in the queue
//     order that fits. The rule, why, its proof against starvation and
//     its bound on idle room are in reservation.go.
package limiter

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"unsafe"
)

// TotalDim is the dimension index that stands for the zone-wide total in
// results.
const TotalDim = -1

const (
	numShards = 256 // per dimension; a power of two
	cacheLine = 64
	// A shard's overflow map gives its memory back (see table.shrink).
	shrinkAt    = 32
	shrinkRatio = 8
	// inlineDims is how many dimensions a request can have before admitting
	// it allocates.
	inlineDims = 8
)

// MaxCost is the largest cost a request can have, and the largest cap: the
// total counts units in the low bits of one word (see unitBits).
const MaxCost = 1<<unitBits - 1

// The total's word: units in the low unitBits bits, requests above them
// (up to 2^23 in flight at once in one zone).
const (
	unitBits = 40
	oneReq   = 1 << unitBits
)

// Limits are the caps one handler applies to the requests it admits. The
// zone reads them on every admission, so a reload that installs new Limits
// takes effect at once.
type Limits struct {
	// Max is the cap of each dimension; 0 means the request brings its own
	// (Request.Max), as a placeholder resolved per request does.
	Max []int64
	// Total caps the zone-wide total; 0 means no cap.
	Total int64
	// Adaptive, if set, caps the zone-wide total instead of Total: its
	// current limit, read on every admission, not split by Divisor.
	Adaptive *Adaptive
	// MaxKeys bounds the keys each dimension holds; 0 means no bound. A
	// request with a new key is refused while MaxKeys keys are in flight
	// in that dimension.
	MaxKeys int64
	// Divisor splits every cap (Max, a request's own max, Total) between
	// instances sharing the load: each enforces ceil(cap/Divisor). 0 or 1
	// means the caps as they are.
	Divisor int64

	retired atomic.Bool
}

// Request is what a caller asks a zone to admit. Keys, Max and Cost must
// stay unchanged from Acquire until its Slot is released.
type Request struct {
	// Keys holds one key per dimension; "" means the dimension does not
	// apply to this request (it is neither checked nor counted).
	Keys []string
	// Max holds per-request caps for dimensions whose Limits.Max is 0.
	Max []int64
	// Cost is the units the request takes in every dimension and the
	// total, up to MaxCost; 0 (or less) means 1.
	Cost int64
	// Limits are the caps of the handler that admits the request.
	Limits *Limits

	// slot is where admission records what the request holds: kept in the
	// request, so that admitting allocates nothing.
	slot Slot
}

// A Slot is what an admitted request holds, from admission to Release:
// its units in every dimension, its keys' hashes (Release need not hash
// again) and what fair sharing charged it.
type Slot struct {
	// Used, if positive, is how many units the request was found to use
	// once it ended (the tokens a model reported), set before Release:
	// fair sharing then charges its key Used units for the time it held,
	// not the units it took. 0 charges what it took.
	Used int64

	zone   *Zone
	req    *Request
	hashes [inlineDims]uint64
	held   bool
	// taken is the units the request holds, set at admission.
	taken int64
	// fair is what its grant under fair charged, corrected at Release;
	// nil if none (only a grant from a queue is charged).
	fair *fairCharge
}

// Units returns the units the slot holds: its request's cost, clamped.
func (s *Slot) Units() int64 { return s.taken }

// UsedUnits returns the units the slot's key is charged for, once it
// ended: Used if it is set (clamped as costs are), else its units.
func (s *Slot) UsedUnits() int64 {
	if s.Used > 0 {
		return ClampCost(s.Used)
	}
	return s.taken
}

// Release gives back the units s holds and hands them to waiters that now
// fit. It is safe after the zone is no longer used by any handler. A slot
// that holds nothing (released already) makes it panic, as
// semaphore.Weighted does: giving its units back again would let more in
// than the caps allow.
func (s *Slot) Release() {
	if !s.held {
		panic("limiter: Release of a slot that holds no units (released twice)")
	}
	s.zone.release(s.req)
}

// cost is req's cost within 1 to MaxCost.
func (req *Request) cost() int64 { return ClampCost(req.Cost) }

// hash returns the hash of req's key in dimension d, from admission if it
// kept it.
func (z *Zone) hash(req *Request, d int) uint64 {
	if req.slot.held && d < inlineDims {
		return req.slot.hashes[d]
	}
	return maphash.String(z.seed, req.Keys[d])
}

// keep records the hash of dimension d's key for Release.
func (req *Request) keep(d int, h uint64) {
	if d < inlineDims {
		req.slot.hashes[d] = h
	}
}

// Zone counts requests in flight for a fixed list of dimensions.
type Zone struct {
	hasTotal bool
	shards   []shard // dims × numShards, dimension-major
	counting atomic.Bool
	keys     []keyCount // per dimension, once counting
	keysMu   sync.Mutex // starts counting
	newKeys  sync.Mutex // serialises admissions of new keys under MaxKeys
	_        [cacheLine]byte
	total    atomic.Int64 // see unitBits
	_        [cacheLine - 8]byte

	// latest are the Limits of the newest handler provisioned for this zone;
	// waiters whose own Limits were retired by a reload use them instead.
	latest atomic.Pointer[Limits]

	// head and sharer are the waiters whose room is held (see
	// reservation), and fresh their reservation's scratch. Guarded by mu.
	head, sharer *flow
	fresh        []bool

	// ledger, if set, keeps the zone's counts for a fleet: the zone
	// admits within the allowances it grants (see allowance.go), and asks
	// it for more (see asking.go); totalAllow is the total's, asks the
	// calls' state (guarded by mu).
	ledger     Ledger
	totalAllow totalAllowance
	asks       asking

	queue
}

// shard is one lock and the counts of the keys that hash to it, on cache
// lines of its own so that cores working on different shards never share
// one.
type shard struct {
	mu sync.Mutex
	table
	// allow is this instance's allowance of each key, with a ledger (see
	// allowance.go).
	allow map[uint64]*allowance
	_     [2*cacheLine - 16 - unsafe.Sizeof(table{})]byte
}

// keyCount is a dimension's keys in flight, on a cache line of its own.
type keyCount struct {
	n atomic.Int64
	_ [cacheLine - 8]byte
}

// NewZone returns a zone of dims keyed dimensions, with a zone-wide total
// counter if hasTotal. A nil clock means the real one.
func NewZone(dims int, hasTotal bool, clock Clock) *Zone {
	if clock == nil {
		clock = realClock{}
	}
	z := &Zone{hasTotal: hasTotal, shards: make([]shard, dims*numShards), keys: make([]keyCount, dims)}
	z.clock, z.seed = clock, maphash.MakeSeed()
	return z
}

// Clock returns the zone's time source, for what reads time beside it
// (a grant rate, retry hints).
func (z *Zone) Clock() Clock { return z.clock }

// Adopt makes l the limits that waiters with retired limits use, and admits
// any waiter that l now lets in (a raised max admits at once).
func (z *Zone) Adopt(l *Limits) {
	z.latest.Store(l)
	z.capsChanged()
	z.retry(true)
}

// Kick retries the waiters the total holds back: after a cap read on
// every admission (an adaptive total) went up.
func (z *Zone) Kick() { z.retry(false) }

// Retire marks l as replaced (its handler was unloaded): waiters that hold l
// move to the zone's latest limits, which may admit them.
func (z *Zone) Retire(l *Limits) {
	l.retired.Store(true)
	z.latest.CompareAndSwap(l, nil)
	z.capsChanged()
	z.retry(true)
}

// capsChanged has, with a ledger, the allowances the zone holds drain:
// the fleet granted them under the old caps, so their sum may pass a cap
// that came down, and this instance would pass it over the fleet if it
// admitted from them. Their idle units go back now, those in flight as
// they end, till the ledger grants units there under the new caps.
func (z *Zone) capsChanged() {
	if z.ledger == nil {
		return
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	z.asks.capsGen++
	var sets []Set
	if z.holdsTotal() {
		z.totalAllow.drain.Store(true)
		sets = append(sets, Set{Dim: TotalDim})
	}
	for d := range len(z.shards) / numShards {
		z.eachKeyAllowance(d, func(_ *shard, h uint64, a *allowance) {
			if a.units > 0 {
				a.drain = true
				sets = append(sets, Set{Dim: d, Hash: h})
			}
		})
	}
	for _, set := range sets {
		z.giveBackLater(set, z.stateOf(set).idle(), 0)
	}
}

// retry serves the waiters the total holds back again, and with keys
// (after the caps changed) those every key holds back.
func (z *Zone) retry(keys bool) {
	if z.pending.Load() == 0 {
		return
	}
	z.mu.Lock()
	if z.ledger != nil { // the fleet turned its waiters down under the old caps
		z.asks.changed = true
		z.startAsking()
	}
	z.freed = append(z.freed, blocker{total: true})
	if keys {
		for key := range z.blocked {
			z.freed = append(z.freed, blocker{key: key})
		}
	}
	z.dispatch()
	z.mu.Unlock()
}

// TryAcquire admits req if every dimension has room, without waiting, and
// returns its slot. On refusal it returns nil and the refusing dimension
// (TotalDim for the total).
func (z *Zone) TryAcquire(req *Request) (*Slot, int) {
	if o, d := z.tryNow(req); o != Admitted {
		return nil, d
	}
	return &req.slot, 0
}

// tryNow admits req if it fits now, after any waiter that fits.
func (z *Zone) tryNow(req *Request) (Outcome, int) {
	if z.pending.Load() > 0 {
		z.mu.Lock() // slots are given back under mu: waiters go first
		defer z.mu.Unlock()
		return z.tryNewcomer(req)
	}
	return z.tryAcquire(req, nil)
}

// tryNewcomer tries req, which does not wait, beyond the head's
// reservation at now, after the waiters the head's change lets in. mu
// must be held.
func (z *Zone) tryNewcomer(req *Request) (Outcome, int) {
	r := z.dispatch()
	return z.tryAcquire(req, r.against(z, nil, z.clock.Now()))
}

// release gives back the units req holds and hands them to waiters that
// now fit.
func (z *Zone) release(req *Request) {
	if req.slot.fair != nil {
		req.slot.fair.q.settle(req)
	}
	var sets []Set // with a ledger: where idle allowance may go back
	if z.ledger != nil {
		sets = z.setsOf(req)
	}
	if z.pending.Load() > 0 {
		z.mu.Lock()
		z.releases++
		z.giveBack(req, true)
		if sets != nil { // above its target, the zone's waiters do not get them
			z.trim(sets, true)
		}
		z.dispatch()
		if sets != nil {
			z.trim(sets, false)
		}
		z.mu.Unlock()
		return
	}
	z.giveBack(req, false)
	if z.pending.Load() > 0 || sets != nil && z.excess(sets) { // a request started waiting meanwhile
		z.mu.Lock()
		z.releases++
		z.candidatesFor(req)
		z.dispatch()
		if sets != nil {
			z.trim(sets, false)
		}
		z.mu.Unlock()
	}
}

// giveBack takes req's units off the counts and, if collect is set (mu
// held), records the blockers they free for dispatch.
func (z *Zone) giveBack(req *Request, collect bool) {
	units := req.slot.taken
	var now int64
	if z.ledger != nil {
		now = z.clock.Now().UnixNano()
	}
	for d, key := range req.Keys {
		if key == "" {
			continue
		}
		h := z.hash(req, d)
		s := z.shardOf(d, h)
		s.mu.Lock()
		if a := s.allowanceOf(h); a != nil && now != 0 {
			a.track(now, s.count(h))
		}
		gone := s.decrement(h, units)
		if gone && z.counting.Load() {
			z.keys[d].n.Add(-1)
		}
		s.mu.Unlock()
		if collect && len(z.blocked) > 0 {
			z.freed = append(z.freed, keyBlocker(d, h))
			if gone {
				z.freed = append(z.freed, keysBlocker(d))
			}
		}
	}
	req.slot.held = false
	if z.hasTotal {
		z.total.Add(-(units + oneReq))
		if collect {
			z.freed = append(z.freed, blocker{total: true})
		}
	}
}

// candidatesFor records the blockers req's released units may free, when
// they were given back without mu. Its keys' shards may have lost a key as
// well.
func (z *Zone) candidatesFor(req *Request) {
	for d, key := range req.Keys {
		if key == "" || len(z.blocked) == 0 {
			continue
		}
		h := maphash.String(z.seed, key)
		z.freed = append(z.freed, keyBlocker(d, h), keysBlocker(d))
	}
	if z.hasTotal {
		z.freed = append(z.freed, blocker{total: true})
	}
}

// tryAcquire checks every dimension of req under its shard lock and, if all
// fit, takes req's units in each. It returns Admitted, or Full, KeysFull or
// short with the refusing dimension: the caps first (each key's, in
// dimension order, then the key bounds, then the total), so a request
// refused by a shared constraint has room in all its keys, then, with a
// ledger, the allowances (short: the request fits the caps, and needs
// more of this instance's allowance). With r (mu held), the holds of the
// waiters before it refuse as if full (see reservation); a short waiter
// checks only the allowances.
func (z *Zone) tryAcquire(req *Request, r *reservation) (Outcome, int) {
	lim := z.limitsFor(req)
	units := int64(1) // every cap is at least 1
	if req.Cost > 1 {
		units = z.units(lim, req)
	}
	if lim.MaxKeys > 0 && !z.counting.Load() {
		z.startCounting()
	}
	var buf [inlineDims]keyCheck
	locked := buf[:0]
	if len(req.Keys) > inlineDims {
		locked = make([]keyCheck, 0, len(req.Keys))
	}
	for d, key := range req.Keys { // dimension order: the lock order
		var sl keyCheck
		if key != "" {
			sl.shard, sl.hash = z.shardFor(d, key)
			sl.shard.mu.Lock()
			sl.count = sl.shard.count(sl.hash)
			sl.need = sl.count + units + r.holdsKey(d, sl.hash)
		}
		locked = append(locked, sl)
	}

	// A short waiter was admitted by the caps at its turn: it checks the
	// allowances alone (see reservation.pending).
	pending := r.pending()
	// Once a new key meets MaxKeys, newKeys is held until its count is
	// raised, or the admission refused (see the invariants).
	outcome, refusedBy, counted := Admitted, 0, false
	for d, sl := range locked {
		if sl.shard != nil && !pending && sl.need > z.capFor(lim, req, d) {
			outcome, refusedBy = Full, d
			break
		}
	}
	for d, sl := range locked {
		if outcome != Admitted || pending || sl.shard == nil || sl.count > 0 || lim.MaxKeys == 0 || r.shortHolds(d, sl.hash) {
			continue
		}
		if !counted {
			z.newKeys.Lock()
			counted = true
		}
		if z.keys[d].n.Load()+r.holdsNewKey(d, sl.hash) >= lim.MaxKeys {
			outcome, refusedBy = KeysFull, d
		}
	}
	totalCap := z.totalCap(lim)
	if pending {
		totalCap = 0
	}
	if outcome == Admitted && z.ledger != nil && z.hasTotal { // a cap refuses before an allowance
		if max := totalCap; max > 0 && z.total.Load()&MaxCost+units+r.holdsTotal() > max {
			outcome, refusedBy = Full, TotalDim
		}
	}
	if outcome == Admitted && z.ledger != nil {
		for d, sl := range locked {
			if sl.shard == nil {
				continue
			}
			if a := sl.shard.allowanceOf(sl.hash); a == nil || sl.need > a.units {
				outcome, refusedBy = short, d
				break
			}
		}
	}
	if outcome == Admitted && z.hasTotal {
		if o := z.takeTotal(totalCap, units+r.holdsTotal(), units); o != Admitted {
			outcome, refusedBy = o, TotalDim
		}
	}
	admit := outcome == Admitted
	countKeys := admit && z.counting.Load()
	var now int64
	if admit && z.ledger != nil {
		now = z.clock.Now().UnixNano()
		if z.hasTotal {
			z.totalAllow.used.Store(now)
		}
	}
	for d, sl := range locked {
		if sl.shard == nil {
			continue
		}
		if admit {
			if now != 0 {
				sl.shard.allowanceOf(sl.hash).track(now, sl.shard.count(sl.hash))
			}
			if sl.shard.increment(sl.hash, units) && countKeys {
				z.keys[d].n.Add(1)
			}
			req.keep(d, sl.hash)
			if now != 0 {
				sl.shard.allowanceOf(sl.hash).used = now
			}
		}
		sl.shard.mu.Unlock()
	}
	if counted {
		z.newKeys.Unlock()
	}
	if admit {
		sl := &req.slot // its hashes and any fair charge are set already
		sl.zone, sl.req, sl.held, sl.taken, sl.Used = z, req, true, units, 0
	}
	return outcome, refusedBy
}

// units returns the units req takes under lim: within the fleet's caps
// with a ledger, else this instance's share of them (see Limits.units).
func (z *Zone) units(lim *Limits, req *Request) int64 {
	return lim.units(req, z.hasTotal, z.ledger != nil)
}

// startCounting makes the zone count each dimension's keys, from the keys
// its tables hold. It locks every shard, so no key comes or goes unseen.
func (z *Zone) startCounting() {
	z.keysMu.Lock()
	defer z.keysMu.Unlock()
	if z.counting.Load() {
		return
	}
	for i := range z.shards {
		z.shards[i].mu.Lock()
	}
	for d := range z.keys {
		var n int64
		for i := range numShards {
			n += int64(z.shards[d*numShards+i].keys())
		}
		z.keys[d].n.Store(n)
	}
	z.counting.Store(true)
	for i := range z.shards {
		z.shards[i].mu.Unlock()
	}
}

// takeTotal raises the total by a request of units if need units (its
// own and those held for a waiter before it) fit under max (0: no max),
// and with a ledger, the total's allowance: Full or short if not.
func (z *Zone) takeTotal(max, need, units int64) Outcome {
	for {
		w := z.total.Load()
		switch {
		case max > 0 && w&MaxCost+need > max:
			return Full
		case z.ledger != nil && w&MaxCost+need > z.totalAllow.units.Load():
			return short
		}
		if z.total.CompareAndSwap(w, w+units+oneReq) {
			return Admitted
		}
	}
}

// totalCap is the zone-wide cap this instance enforces (0: none): the
// fleet's with a ledger, else this instance's share.
func (z *Zone) totalCap(lim *Limits) int64 { return lim.capOf(nil, TotalDim, z.ledger != nil) }

// limitsFor returns the limits that apply to req: its own, or the zone's
// latest once its own were retired by a reload.
func (z *Zone) limitsFor(req *Request) *Limits {
	if req.Limits.retired.Load() {
		if l := z.latest.Load(); l != nil {
			return l
		}
	}
	return req.Limits
}

// capFor is the cap this instance enforces in dimension d for req: the
// fleet's with a ledger, else this instance's share.
func (z *Zone) capFor(lim *Limits, req *Request, d int) int64 {
	return lim.capOf(req, d, z.ledger != nil)
}

// keyCheck is a key's shard, hash and units in flight, and what the
// admission needs there (those, its own, those held), for one admission.
type keyCheck struct {
	shard *shard
	hash  uint64
	count int64
	need  int64
}

// shardFor returns the shard of key in dimension d and the key's hash, which
// identifies the key in the shard: a 64-bit hash with a secret per-zone seed,
// so two keys share a count only by a 2^-64 chance that no client can steer,
// and a key costs the same memory however long it is.
func (z *Zone) shardFor(d int, key string) (*shard, uint64) {
	h := maphash.String(z.seed, key)
	return z.shardOf(d, h), h
}

func (z *Zone) shardOf(d int, h uint64) *shard {
	return &z.shards[d*numShards+int(h>>32)&(numShards-1)]
}
