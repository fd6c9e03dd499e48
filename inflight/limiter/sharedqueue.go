package limiter

import (
	"container/heap"
	"context"
	"slices"
	"sync"
	"time"
)

// SharedQueue holds one zone's requests waiting in this process for a
// Ledger: the same flows, priority order, aging, fair sharing and waiting
// as the zone's own queue, with the tries made in batches, since a ledger
// answers over the network. While it has waiters, one goroutine tries them
// all, best first, on every Wake (a release anywhere in the fleet) and
// every poll, and newcomers are tried in the same batch behind them, so
// they never overtake a waiter that fits.
//
// Invariants, besides the queue's: its waiters are counted in the zone's
// WaitOutside (max_waiting bounds every queue of the zone together) and,
// while it has any, it is listed in the zone's shared queues (their keys
// are shown, and max_waiting_per_key counts them all). Flows are all filed
// under the total: every batch tries every waiter, so no filing needs to
// say what to try. One batch runs at a time (dispatching, taken before mu).
type SharedQueue struct {
	zone   *Zone
	ledger Ledger
	poll   time.Duration
	queue
	serving     bool // a goroutine serves the waiters; guarded by mu
	wakeup      chan struct{}
	dispatching sync.Mutex
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
// req itself: nothing was taken, and the caller may fall back.
func (q *SharedQueue) Acquire(ctx context.Context, req *Request, opt WaitOptions) (Result, error) {
	v, err := q.newcomer(req, opt.Wait > 0)
	switch {
	case err != nil:
		return Result{}, err
	case v.Outcome != Full || opt.Wait <= 0:
		return Result{Outcome: v.Outcome, Dim: v.Dim}, nil
	}
	return q.wait(ctx, req, opt, v.Dim), nil
}

// Wake asks the serving goroutine to try the waiters now.
func (q *SharedQueue) Wake() {
	select {
	case q.wakeup <- struct{}{}:
	default:
	}
}

// newcomer tries req alone, or behind the waiters when there are any.
func (q *SharedQueue) newcomer(req *Request, willWait bool) (Verdict, error) {
	if q.queued.Load() > 0 {
		return q.dispatch(req, willWait)
	}
	v, err := q.ledger.Take([]*Request{req}, []bool{willWait})
	if err != nil {
		return Verdict{}, err
	}
	return v[0], nil
}

// wait queues a copy of req (a batch may admit it after req's caller has
// gone, and then gives it back), refused by dimension dim.
func (q *SharedQueue) wait(ctx context.Context, req *Request, opt WaitOptions, dim int) Result {
	others := q.zone.waitingElsewhere(q, req, opt)
	q.mu.Lock()
	perKey, over := q.perKeyRoom(req, opt, others)
	if over {
		q.mu.Unlock()
		return Result{Outcome: QueueFull, Dim: opt.KeyDim}
	}
	if !q.zone.WaitOutside(opt.MaxWaiting) {
		q.mu.Unlock()
		return Result{Outcome: QueueFull, Dim: dim}
	}
	own := &Request{Keys: slices.Clone(req.Keys), Max: slices.Clone(req.Max), Limits: req.Limits, Cost: req.Cost}
	w := q.enqueue(own, opt, perKey, blocker{total: true})
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
	granted := w.granted
	if !granted {
		q.leave(w)
	}
	q.mu.Unlock()
	waited := q.clock.Now().Sub(w.Arrived)
	switch {
	case granted && outcome == Aborted: // a slot came as its client left
		q.ledger.Give(own)
	case granted:
		req.adopt(own)
		return Result{Outcome: Admitted, Waited: waited}
	}
	return Result{Outcome: outcome, Dim: dim, Waited: waited}
}

// leave takes w out of the queue. mu must be held.
func (q *SharedQueue) leave(w *waiter) {
	q.dequeue(w)
	w.left = true
	q.zone.DoneWaitingOutside()
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
		q.dispatch(nil, false) // a failure leaves them waiting
		q.mu.Lock()
		if q.queued.Load() == 0 {
			q.serving = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
	}
}

// dispatch offers the ledger's room to the waiters, best first, then to
// newcomer if any, in one batch, and returns newcomer's verdict. A waiter
// admitted after it left gives back what it took.
func (q *SharedQueue) dispatch(newcomer *Request, willWait bool) (Verdict, error) {
	q.dispatching.Lock()
	defer q.dispatching.Unlock()
	q.mu.Lock()
	batch := q.order(q.clock.Now())
	q.mu.Unlock()
	reqs := make([]*Request, 0, len(batch)+1)
	waits := make([]bool, 0, len(batch)+1)
	for _, w := range batch {
		reqs, waits = append(reqs, w.req), append(waits, true)
	}
	if newcomer != nil {
		reqs, waits = append(reqs, newcomer), append(waits, willWait)
	}
	if len(reqs) == 0 {
		return Verdict{}, nil
	}
	verdicts, err := q.ledger.Take(reqs, waits)
	if err != nil {
		return Verdict{}, err
	}
	q.mu.Lock()
	for i, w := range batch {
		if verdicts[i].Outcome != Admitted {
			continue
		}
		if w.flow.fair {
			q.charge(w.flow, w.req.taken)
		}
		if w.left { // it left while the ledger answered
			q.ledger.Give(w.req)
			continue
		}
		w.granted = true
		q.leave(w)
		close(w.ready)
	}
	q.mu.Unlock()
	if newcomer == nil {
		return Verdict{}, nil
	}
	return verdicts[len(batch)], nil
}

// order returns every waiter in the order they would be served one after
// another at time now: the queue order of the flows' heads, each grant
// charged to its key's fair tag as if it were granted (its cost, unclamped:
// the ledger clamps). mu must be held.
func (q *queue) order(now time.Time) []*waiter {
	sim := simulation{vtime: q.vclock.vtime, clock: &q.vclock, tags: map[uint64]float64{}}
	var h candidates
	h.now = now
	for _, f := range q.byID {
		for ; f != nil; f = f.collide {
			h.items = append(h.items, candidate{f: f, w: f.head, start: sim.start(f)})
		}
	}
	heap.Init(&h)
	out := make([]*waiter, 0, q.queued.Load())
	for h.Len() > 0 {
		c := h.items[0]
		if s := sim.start(c.f); s > c.start { // its key was charged meanwhile
			h.items[0].start = s
			heap.Fix(&h, 0)
			continue
		}
		out = append(out, c.w)
		if c.f.fair {
			sim.charge(c)
		}
		if c.w.next == nil {
			heap.Pop(&h)
			continue
		}
		h.items[0] = candidate{f: c.f, w: c.w.next, start: sim.start(c.f)}
		heap.Fix(&h, 0)
	}
	return out
}

// simulation is fair sharing's virtual time as a batch would move it.
type simulation struct {
	vtime float64
	clock *virtualClock
	tags  map[uint64]float64 // charged in the batch
}

func (s *simulation) start(f *flow) float64 {
	if !f.fair {
		return 0
	}
	tag, ok := s.tags[f.fairKey]
	if !ok {
		tag = s.clock.tags[f.fairKey]
	}
	return max(s.vtime, tag)
}

func (s *simulation) charge(c candidate) {
	s.vtime = c.start
	s.tags[c.f.fairKey] = c.start + float64(c.w.req.cost())/c.f.weight
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
