package limiter

import (
	"context"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Class is a waiting request's priority class.
type Class uint8

// Priority classes, lowest first.
const (
	Low Class = iota
	Normal
	High
)

// ParseClass reads "high" or "low" (any case); anything else is Normal.
func ParseClass(s string) Class {
	switch {
	case strings.EqualFold(s, "high"):
		return High
	case strings.EqualFold(s, "low"):
		return Low
	}
	return Normal
}

// String returns the class name.
func (c Class) String() string {
	return [...]string{"low", "normal", "high"}[c]
}

// weight scales a class's score: high counts double, low half.
var weight = [...]float64{Low: 0.5, Normal: 1, High: 2}

// agingPeriod is the wait after which a waiter's score has doubled, so that a
// low request waiting long enough overtakes newer high ones.
const agingPeriod = 30 * time.Second

// Outcome is how an admission ended.
type Outcome uint8

// Outcomes of Acquire.
const (
	Admitted    Outcome = iota
	Full                // refused at once: a dimension had no room
	Timeout             // waited the whole wait without a slot
	QueueFull           // refused at once: max_waiting requests already wait
	Aborted             // the request's context ended while it waited
	KeysFull            // refused at once: a new key, and its dimension holds MaxKeys
	Unavailable         // refused at once: the ledger could not answer, and the store fails closed

	// short and fleetFull are refusals the caller never sees: the request
	// fits the caps, but needs more of this instance's allowance (see
	// allowance.go), which the fleet was just asked for (fleetFull: and
	// refused).
	short     Outcome = 100
	fleetFull Outcome = 101
)

// Result reports an admission. Dim is the refusing dimension (TotalDim for
// the total) when Outcome is not Admitted; Waited is the time spent queued.
type Result struct {
	Outcome Outcome
	// Slot is what an admitted request holds, to release once it ended;
	// nil unless Outcome is Admitted.
	Slot   *Slot
	Dim    int
	Waited time.Duration
	// Levels, if not nil, is the fleet's level of the request's dimensions
	// as a Ledger answered the call that decided it (see Levels); nil
	// when no ledger answered for it (a zone without one, an admission
	// within this instance's allowance: see Zone.Levels, a refusal the
	// zone made alone).
	Levels Levels
	// Alone says that the ledger could not answer: the zone decided alone,
	// within this instance's share of each cap (see fallback).
	Alone bool
}

// Level is a dimension's level in the fleet: its cap for the request's
// key and the units in flight against it.
type Level struct {
	Cap, InFlight int64
}

// Levels holds a Level per dimension of a request, index d for dimension
// d and the last for the total; a Level with Cap 0 is not known.
type Levels []Level

// Of returns the level of dimension d (TotalDim: the total), if known.
func (l Levels) Of(d int) (Level, bool) {
	if d == TotalDim {
		d = len(l) - 1
	}
	if d < 0 || d >= len(l) || l[d].Cap <= 0 {
		return Level{}, false
	}
	return l[d], true
}

// WaitOptions say whether and how a request may wait for a slot.
type WaitOptions struct {
	Wait       time.Duration // 0: refuse at once
	MaxWaiting int           // bound on queued requests in the zone; 0: none
	Class      Class

	// Fair shares the slots among the keys of dimension KeyDim, in
	// proportion to their Weight (see fair.go).
	Fair bool
	// KeyDim is the dimension whose keys Fair shares between and
	// MaxWaitingPerKey counts.
	KeyDim int
	// Weight is the waiter's share under Fair, counted within MinWeight
	// to MaxWeight; 0 (or anything not a positive number) means its class
	// weight (high 2, normal 1, low 0.5).
	Weight float64
	// MaxWaitingPerKey bounds the requests waiting with the same key in
	// dimension KeyDim; one more is refused with QueueFull. 0: none.
	MaxWaitingPerKey int
	// Queued, if set, is called once the request is queued, before it
	// waits, so that the caller can watch its client while it waits. It
	// runs on the caller's goroutine without locks held, and must not
	// block.
	Queued func()
	// Refuse, if set, is asked once when the request would be queued
	// (it does not fit now and the queue has room for it), with the number
	// of requests already queued in the zone. True refuses it at once with
	// Outcome Timeout and Waited 0: the caller predicts that its wait
	// would run out before a slot comes. It runs with the queue lock held
	// and must not block.
	Refuse func(queued int64) bool
}

// queue holds the waiting requests of a zone, grouped in flows (waiters
// with exactly the same constraints, see flow.go), each flow listed under
// the constraints that refused it since it started waiting.
//
// Invariants, with mu held:
//   - No queued waiter may be admitted: each is refused by a full
//     constraint (a key at its cap, a limit at its key bound, or the
//     total) or by room held for a waiter before it (see reservation).
//     Every flow is filed where room it needs comes back (see file), and
//     a release, a change of holder or a change of caps (Adopt, Retire)
//     hands that room to the flows filed there, best first (see
//     dispatch). So flows filed elsewhere need not be looked at: the cost
//     of a release is the flows it could unblock, not the waiters.
//   - Within a flow the oldest waiter is the best (same class, same weight,
//     so the same score order as arrival), and if it does not fit, no other
//     does: only a flow's holder (its first waiter not short of
//     allowance, see flow.holder) is ever tried, and a flow is filed by
//     its holder's refusals.
//   - pending counts the queued waiters plus the requests between entering
//     the slow path and leaving it. While it is above zero, slots are given
//     back (and taken by newcomers) only with mu held, so a freed slot goes
//     to the waiters before any newcomer can see it; a Release that reads
//     pending == 0 after giving back knows nobody can be missed: such a
//     request raises pending before its own attempt, which then sees the
//     freed slot.
type queue struct {
	seed    maphash.Seed // of the zone's key hashes
	clock   Clock
	mu      sync.Mutex
	pending atomic.Int64
	queued  atomic.Int64
	seq     uint64
	flows
}

// standing is where a waiting request stands in the queue order: its
// class, and when it arrived.
type standing struct {
	class   Class
	arrived time.Time
	seq     uint64 // arrival order among requests with the same arrived
}

// before reports whether p goes before q at time now: the higher score
// (weight × (1 + waited / 30s), weights high 2, normal 1, low 0.5), then
// the higher class, then the earlier arrival.
func (p standing) before(q standing, now time.Time) bool {
	sp, sq := p.score(now), q.score(now)
	if sp != sq {
		return sp > sq
	}
	if p.class != q.class {
		return p.class > q.class
	}
	return p.seq < q.seq
}

func (p standing) score(now time.Time) float64 {
	return score(weight[p.class], p.arrived, now)
}

type waiter struct {
	standing
	req     *Request
	flow    *flow
	ready   chan struct{} // closed when a slot is handed over, or the ledger refused it
	granted bool
	left    bool // it is out of the queue: granted, refused, or gone
	// outcome and dim are its answer once ready: Admitted, or Unavailable
	// by dimension dim (a ledger that cannot answer and fails closed).
	outcome Outcome
	dim     int
	levels  Levels // with a ledger: from its latest answer
	alone   bool   // with a ledger: granted alone, the ledger not answering
	perKey  uint64 // its entry in the per-key waiting counts; 0: not counted
	// short says that its turn came, and it fits the caps, but it waits
	// for more of this instance's allowance (with a ledger): it counts as
	// admitted at its turn, so it holds its units (see reservation) and
	// its flow's next waiter is tried in its place. shortPlace is its
	// key's place on the fair clock then, before its charge, and shortAt
	// the queue's releases then (see reservation.after).
	short      bool
	shortPlace float64
	shortAt    uint64
	prev, next *waiter
}

// await waits until w is granted (Admitted) or refused by the ledger
// (Unavailable), ctx ends (Aborted) or wait has passed (Timeout), on the
// queue's clock. A slot may come as the wait ends: after Aborted or
// Timeout, the caller checks w.granted under mu.
func (q *queue) await(ctx context.Context, w *waiter, wait time.Duration) Outcome {
	timeout, stop := q.clock.After(wait)
	defer stop()
	select {
	case <-w.ready:
		return w.outcome
	case <-ctx.Done():
		return Aborted
	case <-timeout:
		return Timeout
	}
}

// Acquire admits req, waiting up to opt.Wait for room; admitted, its
// Result's Slot holds req's units until it is released. A request that
// waits uses no goroutine of its own beyond the caller's: a release hands
// it the room directly and wakes it.
func (z *Zone) Acquire(ctx context.Context, req *Request, opt WaitOptions) Result {
	res := z.acquire(ctx, req, opt)
	if res.Outcome == Admitted {
		res.Slot = &req.slot
	}
	return res
}

func (z *Zone) acquire(ctx context.Context, req *Request, opt WaitOptions) Result {
	if opt.Wait <= 0 {
		return z.acquireNow(req)
	}
	if z.pending.Load() == 0 {
		if o, _ := z.tryAcquire(req, nil); o == Admitted {
			return Result{Outcome: Admitted}
		}
	}

	z.mu.Lock()
	z.pending.Add(1)
	o, d := z.tryNewcomer(req)
	// Short of allowance, the fleet decides first: admitted, or it waits
	// here. Behind a waiter asking, or where another instance waits for
	// one of its sets, it waits here from the start (see othersWaitFor).
	if o == short && !z.wanting() && !z.othersWaitFor(req) {
		z.pending.Add(-1)
		res := z.askFor(req, true)
		if res.Outcome != Full {
			return res
		}
		z.mu.Lock()
		z.pending.Add(1)
		if o, d = z.tryNewcomer(req); o == short {
			o, d = fleetFull, res.Dim
		}
	}
	if o == Admitted {
		z.pending.Add(-1)
		z.mu.Unlock()
		return Result{Outcome: Admitted}
	}
	perKey, over := z.perKeyRoom(req, opt, 0)
	if over {
		d = opt.KeyDim
	}
	if over || (opt.MaxWaiting > 0 && z.queued.Load() >= int64(opt.MaxWaiting)) {
		z.pending.Add(-1)
		z.mu.Unlock()
		return Result{Outcome: QueueFull, Dim: d}
	}
	if opt.Refuse != nil && opt.Refuse(z.queued.Load()) {
		z.pending.Add(-1)
		z.mu.Unlock()
		return Result{Outcome: Timeout, Dim: d}
	}
	w := z.enqueue(req, opt, perKey)
	if f := w.flow; f.holder() == w && o == short { // its turn, as in the dispatch
		now := z.clock.Now()
		r := z.reserve(now)
		z.shortAtTurn(f, w, d, r.against(z, f, now), now)
	} else if f.holder() == w { // a flow is filed by its holder's refusals
		z.fileRefusal(f, w, o, d)
	}
	z.dispatch() // it may be the head now, and fit in the room held for the old one
	if w.granted {
		z.mu.Unlock()
		return Result{Outcome: Admitted}
	}
	z.mu.Unlock()
	if opt.Queued != nil {
		opt.Queued()
	}

	outcome := z.await(ctx, w, opt.Wait)
	switch outcome {
	case Admitted:
		return Result{Outcome: Admitted, Waited: z.clock.Now().Sub(w.arrived), Levels: w.levels, Alone: w.alone}
	case Unavailable:
		return Result{Outcome: Unavailable, Dim: w.dim, Waited: z.clock.Now().Sub(w.arrived), Levels: w.levels}
	}
	z.mu.Lock()
	waited := z.clock.Now().Sub(w.arrived)
	switch {
	case w.granted: // a slot came as the wait ended
		z.mu.Unlock()
		if outcome == Aborted {
			z.release(req)
			return Result{Outcome: Aborted, Waited: waited}
		}
		return Result{Outcome: Admitted, Waited: waited, Levels: w.levels, Alone: w.alone}
	case w.left: // the ledger refused it as the wait ended
		z.mu.Unlock()
		return Result{Outcome: w.outcome, Dim: w.dim, Waited: waited, Levels: w.levels}
	}
	z.dequeue(w)
	z.pending.Add(-1)
	z.dispatch() // if it was the head, the room it held is free
	// What was kept idle for it goes back, at once where another instance waits.
	if z.ledger != nil {
		z.trim(z.setsOf(req), false)
	}
	z.waiterLeft()
	z.mu.Unlock()
	return Result{Outcome: outcome, Dim: d, Waited: waited}
}
