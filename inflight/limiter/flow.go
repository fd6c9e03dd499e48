package limiter

import (
	"hash/maphash"
	"math"
	"slices"
	"time"
	"unsafe"
)

// A flow is the waiters that have exactly the same constraints: the same
// Limits, keys, per-request maxes and cost, and the same class, weight and
// fairness. So if its oldest waiter (its head) does not fit, none of them
// does, and the head is the best of them in every queue order: a flow is
// tried through one waiter alone, however many wait in it: its head, or
// with a ledger the first not short of allowance (see holder).
type flow struct {
	id         uint64 // hash of the constraints; flows with equal ids chain by collide
	collide    *flow
	class      Class
	weight     float64 // the share under fair: WaitOptions.Weight or the class weight
	fair       bool
	keyDim     int
	fairKey    uint64  // fair: its key in dimension keyDim, mixed as a blocker
	head, tail *waiter // arrival order
	n          int
	// hashes are its keys' hashes per dimension, valid where keyed.
	hashes []uint64
	has    []bool

	// listed are its entries in the filings of the constraints where room
	// it needs comes back (see file), order its entry in the line, and
	// eligible its entry among the flows whose keys had room when last
	// tried, if it is (see reservation).
	listed   []*listing
	order    *listing
	eligible *listing
	// tried is the dispatch epoch in which it was last tried and refused.
	tried uint64
	// asks says that its holder (see holder) needs the fleet (with a
	// ledger): the fleet refused it; turned is when the fleet last refused
	// one of its waiters (zero: none since one last went short), and
	// turnedUnits the units it asked for in the set that refused it: it
	// is asked for again at the fleet's next change, once it needs fewer
	// there, or after fleetPoll (see asking.go).
	asks        bool
	turned      time.Time
	turnedUnits int64
	// rose is when a rise of this instance's target in fleetSet last
	// ended its turn (see targetRose).
	rose time.Time
	// roseShown is when a rise last asked for it again, past that once a
	// poll, because the ledger's latest table showed it granted.
	roseShown time.Time
	// refused lists the dimensions (TotalDim: the total) whose counts
	// refused it since it started waiting, for a ledger's holds (see
	// Want.Holds), and fleetSet the set the fleet last refused its head
	// by, which the zone reports on (see report.go).
	refused  []int
	fleetSet *Set
	// fleetKey names its fair key in the ledger's tables (made when first
	// reported).
	fleetKey string
}

// holder returns f's first waiter that is not short (see waiter.short):
// the one tried, and the one that holds room as the zone's head or shared
// holder (see reservation); nil if all are short.
func (f *flow) holder() *waiter {
	w := f.head
	for w != nil && w.short {
		w = w.next
	}
	return w
}

// lead returns the waiter f stands by in the queue order: its holder, or
// its head while all its waiters are short.
func (f *flow) lead() *waiter {
	if w := f.holder(); w != nil {
		return w
	}
	return f.head
}

// keyed reports whether f has a key in dimension d.
func (f *flow) keyed(d int) bool { return f.has[d] }

// refusedBy records that dimension d's count refused f.
func (f *flow) refusedBy(d int) {
	if !slices.Contains(f.refused, d) {
		f.refused = append(f.refused, d)
	}
}

// keyFlows are the fair flows waiting with one key: what moves back when
// the key's tag falls (see moveBack), and the weight the key adds to the
// clock's active weight while it waits (its first flow's).
type keyFlows struct {
	flows  []*flow
	weight float64
}

// waiters counts the key's waiters.
func (kf *keyFlows) waiters() int {
	n := 0
	for _, f := range kf.flows {
		n += f.n
	}
	return n
}

// blocker names a constraint that can keep a flow waiting: a key at its
// cap in a dimension, a dimension at its key bound (keys_full), or the
// total. Blockers other than the total are mixed into one 64-bit
// value; two that mix alike only make a flow be tried in vain.
type blocker struct {
	total bool
	key   uint64
}

func keyBlocker(d int, hash uint64) blocker {
	return blocker{key: hash ^ (uint64(d+1) * 0x9e3779b97f4a7c15)}
}

// keysBlocker is dimension d at its key bound (max_keys): any key leaving
// the dimension makes room.
func keysBlocker(d int) blocker {
	return blocker{key: uint64(d+1)*0xc2b2ae3d27d4eb4f ^ 1<<63}
}

// flows indexes a zone's waiters: by flow, each flow by the constraints
// where room it needs comes back (see file), and all in the queue order
// (the line). Guarded by the queue's mu.
type flows struct {
	byID    map[uint64]*flow
	blocked map[uint64]*filing // non-total blocker -> the flows filed under it
	onTotal *filing            // the flows filed under the total
	line    filing             // every flow
	// eligible are the flows last refused by a shared constraint: their
	// keys had room (see reservation).
	eligible filing
	// perKey counts waiters per key of their KeyDim, for MaxWaitingPerKey.
	perKey map[uint64]int
	// freed are the constraints whose room came back, for dispatch.
	freed []blocker
	// parked are listings taken out of their lanes by the dispatch under
	// way, and epoch counts the dispatch's changes of head (see dispatch).
	parked []*listing
	epoch  uint64
	// short are the waiters short of allowance (see waiter.short), with
	// their units: each holds them in its keys and the total as if
	// admitted, against the tries after it (see reservation).
	short map[*waiter]int64
	// releases counts the releases that gave units back while requests
	// waited (see reservation.after).
	releases uint64
	// Fair sharing's virtual time (see fair.go).
	vclock virtualClock
}

// blockerOf returns what refused f: outcome o on dimension d.
func (q *queue) blockerOf(f *flow, o Outcome, d int) blocker {
	switch {
	case d == TotalDim:
		return blocker{total: true}
	case o == KeysFull:
		return keysBlocker(d)
	}
	return keyBlocker(d, f.hashes[d])
}

// classWeight is a waiter's share when no weight is given.
func classWeight(c Class) float64 { return weight[c] }

// Share is a waiter's share under fair: its weight w within the bounds,
// or its class c's weight.
func Share(w float64, c Class) float64 {
	if w = clampWeight(w); w > 0 {
		return w
	}
	return classWeight(c)
}

// enqueue queues req as a waiter counted under perKey (0: not counted),
// in its flow, making the flow if it is new, in the line. The caller
// files the flow under what refused req.
func (q *queue) enqueue(req *Request, opt WaitOptions, perKey uint64) *waiter {
	q.seq++
	w := &waiter{standing: standing{class: opt.Class, arrived: q.clock.Now(), seq: q.seq}, req: req, ready: make(chan struct{}), perKey: perKey}
	q.queued.Add(1)
	wt := Share(opt.Weight, opt.Class)
	id := q.flowID(w.req, opt.Class, wt, opt.Fair, opt.KeyDim)
	var f *flow
	for f = q.byID[id]; f != nil && !f.matches(w.req, opt.Class, wt, opt.Fair, opt.KeyDim); f = f.collide {
	}
	if f == nil {
		f = &flow{id: id, class: opt.Class, weight: wt, fair: opt.Fair, keyDim: opt.KeyDim, hashes: make([]uint64, len(req.Keys)), has: make([]bool, len(req.Keys))}
		for d, key := range req.Keys {
			if key != "" {
				f.hashes[d], f.has[d] = maphash.String(q.seed, key), true
			}
		}
		if q.byID == nil {
			q.byID, q.blocked, q.perKey = map[uint64]*flow{}, map[uint64]*filing{}, map[uint64]int{}
		}
		if f.fair {
			f.fairKey = q.keyOf(w.req, f.keyDim)
			q.addFair(f)
		}
		f.collide = q.byID[id]
		q.byID[id] = f
	}
	w.flow = f
	w.prev, w.next = f.tail, nil
	if f.tail == nil {
		f.head = w
	} else {
		f.tail.next = w
	}
	f.tail = w
	if f.n++; f.n == 1 {
		f.order = q.enter(&q.line, f, blocker{})
	}
	if w.perKey != 0 {
		q.perKey[w.perKey]++
	}
	return w
}

// dequeue takes w out of its flow, and drops the flow once empty.
func (q *queue) dequeue(w *waiter) {
	w.left = true
	f := w.flow
	wasHead := f.head == w || f.holder() == w // the lanes order it by them
	if w.prev == nil {
		f.head = w.next
	} else {
		w.prev.next = w.next
	}
	if w.next == nil {
		f.tail = w.prev
	} else {
		w.next.prev = w.prev
	}
	w.prev, w.next = nil, nil
	f.n--
	q.queued.Add(-1)
	if w.short { // the room it held as admitted is free
		delete(q.short, w)
		q.freed = f.sharedBlockers(f.keyBlockers(q.freed))
	}
	if w.perKey != 0 {
		if q.perKey[w.perKey]--; q.perKey[w.perKey] == 0 {
			delete(q.perKey, w.perKey)
		}
	}
	if f.n > 0 {
		if !w.granted {
			q.uncharge(w)
		}
		if wasHead {
			q.headLeft(f)
		}
		return
	}
	q.unlist(f)
	if f.fair {
		q.dropFair(f)
	}
	if !w.granted { // once f is gone: its key's places move back without it, headless
		q.uncharge(w)
	}
	switch first := q.byID[f.id]; {
	case first != f:
		for first.collide != f {
			first = first.collide
		}
		first.collide = f.collide
	case f.collide != nil:
		q.byID[f.id] = f.collide
	default:
		delete(q.byID, f.id)
	}
}

// addFair lists the new fair flow f under its key, which starts waiting
// if it has no other.
func (q *queue) addFair(f *flow) {
	kf := q.vclock.waiting[f.fairKey]
	if kf == nil {
		kf = &keyFlows{weight: f.weight}
		q.vclock.arrive(f.fairKey, kf)
	}
	kf.flows = append(kf.flows, f)
}

// dropFair takes the emptied fair flow f from its key's.
func (q *queue) dropFair(f *flow) {
	kf := q.vclock.waiting[f.fairKey]
	i := slices.Index(kf.flows, f)
	kf.flows = slices.Delete(kf.flows, i, i+1)
	if len(kf.flows) == 0 {
		q.vclock.leave(f.fairKey)
	}
}

// moveBack brings the listed places of key's flows back to its tag,
// which fell.
func (q *queue) moveBack(key uint64) {
	kf := q.vclock.waiting[key]
	if kf == nil {
		return
	}
	p := q.vclock.place(key)
	for _, f := range kf.flows {
		for _, e := range f.listed {
			moveForward(e, p)
		}
		moveForward(f.order, p)
		if f.eligible != nil {
			moveForward(f.eligible, p)
		}
	}
}

// moveForward brings e's place back to p if it is later, in a fair lane.
func moveForward(e *listing, p float64) {
	if e.lane.fair && e.place > p {
		e.place = p
		fix(e)
	}
}

// flowID hashes the constraints that make a flow.
func (q *queue) flowID(req *Request, c Class, wt float64, fair bool, keyDim int) uint64 {
	var h maphash.Hash
	h.SetSeed(q.seed)
	var buf [8]byte
	put := func(v uint64) {
		for i := range buf {
			buf[i] = byte(v >> (8 * i))
		}
		h.Write(buf[:])
	}
	put(uint64(uintptr(unsafe.Pointer(req.Limits))))
	put(uint64(c) | uint64(keyDim)<<8 | uint64(boolBit(fair))<<40)
	put(math.Float64bits(wt))
	put(uint64(req.cost()))
	for d, k := range req.Keys {
		put(uint64(len(k)))
		h.WriteString(k)
		if d < len(req.Max) {
			put(uint64(req.Max[d]))
		}
	}
	return h.Sum64()
}

// matches reports whether req with these options belongs to f.
func (f *flow) matches(req *Request, c Class, wt float64, fair bool, keyDim int) bool {
	r := f.head.req
	if r.Limits != req.Limits || r.cost() != req.cost() || f.class != c || f.weight != wt || f.fair != fair || f.keyDim != keyDim || len(r.Keys) != len(req.Keys) {
		return false
	}
	for d := range r.Keys {
		if r.Keys[d] != req.Keys[d] || maxAt(r, d) != maxAt(req, d) {
			return false
		}
	}
	return true
}

func maxAt(req *Request, d int) int64 {
	if d < len(req.Max) {
		return req.Max[d]
	}
	return 0
}

func boolBit(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// perKeyRoom returns the per-key waiting count req would join, and whether
// it is at opt.MaxWaitingPerKey with others more waiting elsewhere. 0: req
// is not counted (no key in the dimension). Waiters are counted with or
// without a bound, so that one set by a reload counts those already
// waiting.
func (q *queue) perKeyRoom(req *Request, opt WaitOptions, others int) (uint64, bool) {
	k := q.keyOf(req, opt.KeyDim)
	return k, k != 0 && opt.MaxWaitingPerKey > 0 && q.perKey[k]+others >= opt.MaxWaitingPerKey
}

// keyOf identifies req's key in dimension d across the zone (never 0); 0
// if req has no key there.
func (q *queue) keyOf(req *Request, d int) uint64 {
	if d >= len(req.Keys) || req.Keys[d] == "" {
		return 0
	}
	return keyBlocker(d, maphash.String(q.seed, req.Keys[d])).key | 1
}

// keyTally counts requests by key, in the order the keys first appear.
type keyTally struct {
	seed maphash.Seed
	idx  map[uint64]int
	out  []KeyWaiting
}

func (q *queue) keyTally() *keyTally {
	return &keyTally{seed: q.seed, idx: map[uint64]int{}}
}

// add counts n requests like req under its key of dimension d, if it has
// one.
func (t *keyTally) add(req *Request, d int, n int64) {
	if d >= len(req.Keys) || req.Keys[d] == "" {
		return
	}
	k := req.Keys[d]
	h := maphash.String(t.seed, k)
	i, ok := t.idx[h]
	if !ok {
		i = len(t.out)
		t.idx[h] = i
		t.out = append(t.out, KeyWaiting{Key: k, Hash: h})
	}
	t.out[i].Waiting += n
}
