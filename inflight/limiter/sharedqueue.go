package limiter

import (
	"container/heap"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// SharedQueue holds one zone's requests waiting in this process for a
// Ledger: the same flows, priority order, aging, fair sharing and waiting
// as the zone's own queue, with the tries made in calls to the ledger,
// which answers over the network.
//
// One call is under way at a time (group commit): a call tries the
// waiters, best first, then the newcomers that arrived while the previous
// call was under way, in their order of arrival, so a newcomer never
// overtakes a waiter that fits. A lone request goes at once, so a quiet
// zone adds no latency, while a busy one makes one call per round trip,
// whatever the rate of requests (a request that arrives during a call
// waits for it, at most one round trip more). While it has waiters, one
// goroutine asks for a call on every Wake (a release anywhere in the
// fleet) and every poll.
//
// The ledger never calls back into the engine: a call sends it claims
// (Claim), built from each request's limits as they apply now, and the
// queue applies the verdicts. The zone is the queue's local mirror: it
// counts what the ledger admitted (metrics, and the caps it enforces alone
// while the ledger cannot answer, see AcquireAlone), and bounds the keys
// this instance holds under max_keys, which protects this process's
// memory (the caps themselves are the ledger's).
//
// Invariants, besides the queue's: its waiters are counted in the zone's
// waitOutside (max_waiting bounds every queue of the zone together) and,
// while it has any, it is listed in the zone's shared queues (their keys
// are shown, and max_waiting_per_key counts them all). Held room is the
// queue's: a flow is listed under every constraint the ledger refused it
// by, as in the zone's own queue, and each call sends the waiters in the
// queue order with the constraints each holds (Claim.Hold), which the
// ledger applies within the call (it alone sees, in one round trip, which
// constraint is full). Every call tries every waiter: the ledger's counts
// change with releases anywhere in the fleet, so no filing can say what
// to try. A request's fields are written by the call only before its
// caller sees the verdict, or for a waiter under mu. Lock order: calls.mu
// is never held with mu; mu before the zone's locks.
type SharedQueue struct {
	zone     *Zone
	ledger   Ledger
	poll     time.Duration
	keyBound atomic.Pointer[keyBound] // see keysOnly
	queue
	serving bool // a goroutine serves the waiters; guarded by mu
	wakeup  chan struct{}
	calls   calls
}

// calls is the state of a queue's calls to its ledger.
type calls struct {
	mu   sync.Mutex
	busy bool            // a call is under way
	next []*newcomerCall // newcomers that arrived while busy: the next call's
	// again asks for one more call after this one: the waiters may fit
	// after this call read the ledger.
	again bool
}

// newcomerCall is a newcomer that joins a call, and its verdict.
type newcomerCall struct {
	req      *Request
	opt      WaitOptions
	willWait bool
	done     chan struct{} // closed when v and err are set, or lead is
	v        Verdict
	levels   Levels // the fleet's level as v gives it
	err      error
	lead     []*newcomerCall // set when it makes the next call, for these (itself first)
}

// try is one request of a call: its claim, and what the call did for it.
type try struct {
	req   *Request
	claim Claim
	// keys is req's reservation of its keys in the zone under max_keys,
	// a request of its own: nil if none.
	keys *Request
	// fairKey is the hashed key a fair claim charges (see chargeFair).
	fairKey uint64
	verdict Verdict
}

// NewSharedQueue returns the queue of zone's requests waiting for l, tried
// again every poll at least.
func NewSharedQueue(zone *Zone, l Ledger, poll time.Duration) *SharedQueue {
	q := &SharedQueue{zone: zone, ledger: l, poll: poll, wakeup: make(chan struct{}, 1)}
	q.clock, q.seed = zone.clock, zone.seed
	return q
}

// Acquire admits req through the ledger, behind this queue's waiters, or
// queues it, as opt allows. An error is the ledger's failure to answer for
// req itself: nothing was taken, and the caller may fall back (see
// AcquireAlone).
func (q *SharedQueue) Acquire(ctx context.Context, req *Request, opt WaitOptions) (Result, error) {
	v, levels, err := q.newcomer(req, opt)
	switch {
	case err != nil:
		return Result{}, err
	case v.Outcome != Full || opt.Wait <= 0:
		return Result{Outcome: v.Outcome, Dim: v.Dim, Levels: levels}, nil
	}
	return q.wait(ctx, req, opt, v.Dim, levels), nil
}

// AcquireAlone admits req in the zone alone, as opt allows, while the
// ledger cannot answer (a store that fails open). The ledger records what
// was admitted, to enter it once it answers again.
//
// A request whose cost exceeds this instance's share of a cap (a cap
// split by Divisor below the fleet's) is refused, Unavailable, not
// clamped to the share and admitted alone: every instance admitting one
// so would hold up to Divisor times a share's worth beyond its share.
// Refused, the fleet's units stay within the sum of the shares while it
// falls back; the cost is that such a request is refused for the outage.
func (q *SharedQueue) AcquireAlone(ctx context.Context, req *Request, opt WaitOptions) Result {
	if d, over := overShare(req, q.zone.hasTotal); over {
		return Result{Outcome: Unavailable, Dim: d, Alone: true}
	}
	res := q.zone.Acquire(ctx, req, opt)
	if res.Outcome == Admitted {
		req.lease = q.ledger.Record(q.claimOf(req, false, nil))
	}
	res.Alone = true
	return res
}

// overShare returns the first dimension (the total last) in which req's
// cost exceeds this instance's share of a cap split below the fleet's.
func overShare(req *Request, hasTotal bool) (int, bool) {
	lim, cost := req.Limits, req.cost()
	over := func(d int) bool {
		share := lim.capOf(req, d, false)
		return cost > share && share < lim.capOf(req, d, true)
	}
	for d, key := range req.Keys {
		if key != "" && over(d) {
			return d, true
		}
	}
	if hasTotal && over(TotalDim) {
		return TotalDim, true
	}
	return 0, false
}

// Release gives back the units req holds, in the zone at once and in the
// ledger (its Give). If requests wait here, the call that tries them
// starts now and carries the release: a hand-off costs the ledger one
// round trip, not a release and then an admission. A second Release
// panics, before the ledger sees it.
func (q *SharedQueue) Release(req *Request) {
	lease := req.lease
	q.zone.Release(req)
	req.lease = ""
	if lease == "" {
		return
	}
	handOff := q.queued.Load() > 0
	q.ledger.Give(lease, handOff)
	if handOff {
		go q.tryWaiters() // a call, or one more after the call under way: each ends in Idle
	}
}

// Wake asks the serving goroutine to try the waiters now.
func (q *SharedQueue) Wake() {
	select {
	case q.wakeup <- struct{}{}:
	default:
	}
}

// newcomer tries req, queued as opt says if refused, in the next call: at
// once if none is under way. It returns the verdict and the fleet's level
// it gives.
func (q *SharedQueue) newcomer(req *Request, opt WaitOptions) (Verdict, Levels, error) {
	a := &newcomerCall{req: req, opt: opt, willWait: opt.Wait > 0}
	batch := []*newcomerCall{a}
	q.calls.mu.Lock()
	if q.calls.busy {
		a.done = make(chan struct{})
		q.calls.next = append(q.calls.next, a)
		q.calls.mu.Unlock()
		<-a.done
		if a.lead == nil {
			return a.v, a.levels, a.err
		}
		batch = a.lead
	} else {
		q.calls.busy = true
		q.calls.mu.Unlock()
	}
	q.run(batch)
	return a.v, a.levels, a.err
}

// tryWaiters makes a call for the waiters, or asks the call under way for
// one more.
func (q *SharedQueue) tryWaiters() {
	q.calls.mu.Lock()
	if q.calls.busy {
		q.calls.again = true
		q.calls.mu.Unlock()
		return
	}
	q.calls.busy = true
	q.calls.mu.Unlock()
	q.run(nil)
}

// run makes the call for batch (nil: the waiters alone), then hands the
// next call to the newcomers that arrived meanwhile, or makes it off the
// caller's path if one more was asked, or leaves no call under way.
func (q *SharedQueue) run(batch []*newcomerCall) {
	q.calls.mu.Lock()
	q.calls.again = false
	q.calls.mu.Unlock()
	q.call(batch)
	for _, a := range batch[min(1, len(batch)):] {
		close(a.done)
	}
	q.calls.mu.Lock()
	next, again := q.calls.next, q.calls.again
	q.calls.next, q.calls.again = nil, false
	if len(next) == 0 && !again {
		q.calls.busy = false
	}
	q.calls.mu.Unlock()
	switch {
	case len(next) > 0:
		next[0].lead = next
		close(next[0].done)
	case again:
		go q.run(nil)
	default:
		q.ledger.Idle()
	}
}

// wait queues a copy of req (a batch may admit it after req's caller has
// gone, and then gives it back), refused by dimension dim with the fleet's
// level levels. Its result has the level of the latest call that tried it:
// the one that admitted it, or its last refusal.
func (q *SharedQueue) wait(ctx context.Context, req *Request, opt WaitOptions, dim int, levels Levels) Result {
	others := q.waitingElsewhere(req, opt)
	q.mu.Lock()
	perKey, over := q.perKeyRoom(req, opt, others)
	if over {
		q.mu.Unlock()
		return Result{Outcome: QueueFull, Dim: opt.KeyDim, Levels: levels}
	}
	if !q.zone.waitOutside(opt.MaxWaiting) {
		q.mu.Unlock()
		return Result{Outcome: QueueFull, Dim: dim, Levels: levels}
	}
	own := &Request{Keys: slices.Clone(req.Keys), Max: slices.Clone(req.Max), Limits: req.Limits, Cost: req.Cost}
	w := q.enqueue(own, opt, perKey)
	w.flow.refusedBy(dim)
	w.levels = levels
	if q.queued.Load() == 1 {
		q.zone.listShared(q, true)
	}
	if !q.serving {
		q.serving = true
		go q.serve()
	}
	q.mu.Unlock()
	q.Wake()
	if opt.Queued != nil {
		opt.Queued()
	}

	outcome := q.await(ctx, w, opt.Wait)
	q.mu.Lock()
	granted, levels := w.granted, w.levels
	if !granted {
		q.leave(w)
	}
	q.mu.Unlock()
	waited := q.clock.Now().Sub(w.Arrived)
	switch {
	case granted && outcome == Aborted: // a slot came as its client left
		q.Release(own)
	case granted:
		req.adopt(own)
		return Result{Outcome: Admitted, Waited: waited, Levels: levels}
	}
	return Result{Outcome: outcome, Dim: dim, Waited: waited, Levels: levels}
}

// leave takes w out of the queue. mu must be held.
func (q *SharedQueue) leave(w *waiter) {
	q.dequeue(w)
	w.left = true
	q.zone.doneWaitingOutside()
	if q.queued.Load() == 0 {
		q.zone.listShared(q, false)
		q.Wake() // the serving goroutine ends now, not at its next poll
	}
}

// serve tries the waiters when woken, and every poll, until none is left.
func (q *SharedQueue) serve() {
	for {
		poll, stop := q.clock.After(q.poll)
		select {
		case <-q.wakeup:
		case <-poll:
		}
		stop()
		q.tryWaiters() // a failure leaves them waiting
		q.mu.Lock()
		if q.queued.Load() == 0 {
			q.serving = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
	}
}

// call offers the ledger's room to the waiters, best first, then to the
// newcomers of batch, in one Take, and sets each newcomer's verdict. A
// waiter admitted after it left gives back what it took.
func (q *SharedQueue) call(batch []*newcomerCall) {
	q.mu.Lock()
	waiters := q.order(q.clock.Now())
	tries := make([]try, 0, len(waiters)+len(batch))
	for _, w := range waiters {
		t := try{req: w.req, claim: q.claimOf(w.req, true, w.flow.refused)}
		if f := w.flow; f.fair {
			q.fairClaim(&t, f.keyDim, f.fairKey, f.weight)
		}
		tries = append(tries, t)
	}
	for _, a := range batch {
		t := try{req: a.req, claim: q.claimOf(a.req, a.willWait, nil)}
		if a.opt.Fair {
			q.fairClaim(&t, a.opt.KeyDim, q.keyOf(a.req, a.opt.KeyDim), Share(a.opt.Weight, a.opt.Class))
		}
		tries = append(tries, t)
	}
	q.mu.Unlock()
	if len(tries) == 0 {
		return
	}
	err := q.take(tries)
	for i, a := range batch {
		t := &tries[len(waiters)+i]
		if a.err = err; err == nil {
			a.v, a.levels = t.verdict, levelsOf(&t.claim, t.verdict)
			q.admitted(t)
		}
	}
	if err != nil {
		return
	}
	var gone []*Request
	q.mu.Lock()
	for i, w := range waiters {
		t := &tries[i]
		if l := levelsOf(&t.claim, t.verdict); l != nil {
			w.levels = l
		}
		if t.verdict.Outcome != Admitted {
			if t.verdict.Outcome == Full && !w.left { // it holds that room from now on
				w.flow.refusedBy(t.verdict.Dim)
			}
			continue
		}
		q.admitted(t)
		q.chargeFair(t, true)
		if w.left { // it left while the ledger answered
			gone = append(gone, w.req)
			continue
		}
		w.granted = true
		q.leave(w)
		close(w.ready)
	}
	for i := range batch {
		q.chargeFair(&tries[len(waiters)+i], false)
	}
	q.mu.Unlock()
	for _, req := range gone {
		q.Release(req)
	}
}

// fairClaim puts t's claim on the ledger's fair clock, for its key in
// dimension dim (hashed: key; 0 if it has none) at weight w, charged for
// the key's estimated hold time. mu must be held.
func (q *SharedQueue) fairClaim(t *try, dim int, key uint64, w float64) {
	if key == 0 {
		return
	}
	t.fairKey = key
	t.claim.Fair = &FairClaim{Dim: dim, Weight: w, Work: float64(t.claim.Units) * q.vclock.estimate(key), Waiting: q.vclock.active, More: q.waitingOf(key) > 1}
}

// waitingOf returns the requests of key waiting in the queue. mu must be
// held.
func (q *SharedQueue) waitingOf(key uint64) int {
	n := 0
	if kf := q.vclock.waiting[key]; kf != nil {
		for _, f := range kf.flows {
			n += f.n
		}
	}
	return n
}

// chargeFair records the charge of an admitted fair try on the ledger's
// clock, for its Release to correct, and if it is a waiter's grant (local),
// charges it here too, as the zone's own queue does; a newcomer admitted at
// once is charged by the ledger alone, as it is not by a zone. mu must be
// held.
func (q *SharedQueue) chargeFair(t *try, local bool) {
	c := t.claim.Fair
	if c == nil || t.verdict.Outcome != Admitted {
		return
	}
	est := c.Work / float64(t.claim.Units)
	if local {
		q.vclock.charge(t.fairKey, t.req.taken, c.Weight, est)
	}
	q.charged(t.req, &fairCharge{local: local, fleet: q.ledger, dim: c.Dim, key: t.fairKey, weight: c.Weight, est: est})
}

// levelsOf returns the fleet's level of c's dimensions as v gives it:
// per dimension c has a key in (and the total), its cap and the units
// held, where the ledger read them; nil if it read none.
func levelsOf(c *Claim, v Verdict) Levels {
	if v.Held == nil {
		return nil
	}
	out := make(Levels, len(c.Keys)+1)
	for d, h := range v.Held {
		if h < 0 || d > len(c.Keys) {
			continue
		}
		switch {
		case d == len(c.Keys):
			out[d] = Level{Cap: c.Total, Held: h}
		case c.Keys[d] != "":
			out[d] = Level{Cap: c.Caps[d], Held: h}
		}
	}
	return out
}

// claimOf returns what req asks of the ledger under the limits that apply
// to it now: its units within the fleet's caps (not split by Divisor).
func (q *SharedQueue) claimOf(req *Request, waits bool, hold []int) Claim {
	lim := q.zone.limitsFor(req)
	c := Claim{Keys: req.Keys, Caps: make([]int64, len(req.Keys)), Units: lim.units(req, q.zone.hasTotal, true), Waits: waits, Hold: hold}
	for d, key := range req.Keys {
		if key != "" {
			c.Caps[d] = lim.capOf(req, d, true)
		}
	}
	if q.zone.hasTotal {
		c.Total = lim.capOf(req, TotalDim, true)
	}
	return c
}

// take reserves the keys of each try under max_keys, refusing with
// KeysFull those that have no room, and sends the others' claims in one
// Take. On an error, nothing is taken or reserved.
func (q *SharedQueue) take(tries []try) error {
	claims := make([]Claim, 0, len(tries))
	sent := make([]int, 0, len(tries))
	for i := range tries {
		t := &tries[i]
		if lim := q.zone.limitsFor(t.req); lim.MaxKeys > 0 {
			keys := &Request{Keys: t.req.Keys, Limits: q.keysOnly(lim), Cost: t.claim.Units}
			if ok, d := q.zone.TryAcquire(keys); !ok {
				t.verdict = Verdict{Outcome: KeysFull, Dim: d}
				continue
			}
			t.keys = keys
		}
		claims = append(claims, t.claim)
		sent = append(sent, i)
	}
	verdicts, err := q.ledger.Take(claims)
	for j, i := range sent {
		t := &tries[i]
		if err == nil {
			t.verdict = verdicts[j]
		}
		if t.keys != nil && (err != nil || t.verdict.Outcome != Admitted) {
			q.zone.Release(t.keys)
			t.keys = nil
		}
	}
	return err
}

// admitted makes an admitted try's request hold what the ledger took: its
// lease, and its units in the zone (those its key reservation counted, or
// counted now).
func (q *SharedQueue) admitted(t *try) {
	if t.verdict.Outcome != Admitted {
		return
	}
	if t.keys != nil {
		t.req.taken, t.req.held, t.req.hashes = t.keys.taken, t.keys.held, t.keys.hashes
	} else {
		q.zone.hold(t.req, t.claim.Units)
	}
	t.req.lease = t.verdict.Lease
}

// keysOnly returns lim without its caps, keeping max_keys, for reserving
// keys; the last one made is kept, as limits change only on reload.
func (q *SharedQueue) keysOnly(lim *Limits) *Limits {
	if b := q.keyBound.Load(); b != nil && b.of == lim {
		return b.keysOnly
	}
	max := make([]int64, len(lim.Max))
	for i := range max {
		max[i] = MaxCost
	}
	b := &keyBound{of: lim, keysOnly: &Limits{Max: max, MaxKeys: lim.MaxKeys}}
	q.keyBound.Store(b)
	return b.keysOnly
}

// keyBound pairs a handler's limits with limits that keep only their
// max_keys.
type keyBound struct {
	of, keysOnly *Limits
}

// order returns every waiter in the order they would be served one after
// another at time now: the queue order of the flows' heads, each grant
// charged to its key's fair tag as if it were granted (its cost, unclamped:
// the ledger clamps), on a simulation of the queue's virtual clock. mu
// must be held.
func (q *queue) order(now time.Time) []*waiter {
	sim := q.vclock.simulate()
	tag := func(f *flow) float64 {
		if !f.fair {
			return 0
		}
		return sim.tag(f.fairKey)
	}
	var h candidates
	h.now = now
	for _, f := range q.byID {
		for ; f != nil; f = f.collide {
			h.items = append(h.items, candidate{f: f, w: f.head, tag: tag(f)})
		}
	}
	heap.Init(&h)
	out := make([]*waiter, 0, q.queued.Load())
	for h.Len() > 0 {
		c := h.items[0]
		if s := tag(c.f); s > c.tag { // its key was charged meanwhile
			h.items[0].tag = s
			heap.Fix(&h, 0)
			continue
		}
		out = append(out, c.w)
		if c.f.fair {
			sim.advance(c.f.fairKey, float64(c.w.req.cost())*sim.estimate(c.f.fairKey), c.f.weight)
		}
		if c.w.next == nil {
			heap.Pop(&h)
			continue
		}
		h.items[0] = candidate{f: c.f, w: c.w.next, tag: tag(c.f)}
		heap.Fix(&h, 0)
	}
	return out
}

// candidates is a heap of candidates in the queue order at now.
type candidates struct {
	items []candidate
	now   time.Time
}

func (h *candidates) Len() int           { return len(h.items) }
func (h *candidates) Less(i, j int) bool { return h.items[i].before(h.items[j], h.now) }
func (h *candidates) Swap(i, j int)      { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *candidates) Push(x any)         { h.items = append(h.items, x.(candidate)) }
func (h *candidates) Pop() any {
	c := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return c
}
