package redisstore

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// totalKey names the sorted set of a zone's total cap.
const totalKey = "total"

// redisZone is the store of one zone kept in Redis: a limiter.Ledger of
// leases, under the engine's queue for the requests waiting in this
// instance. The queue's local zone counts this instance's requests (for
// metrics and the admin API) and, when Redis cannot be reached and the
// store fails open, enforces the caps alone.
type redisZone struct {
	book     *book
	tag      string // key prefix, with the cluster hash tag
	label    string // the zone's name in metrics and logs
	limits   []string
	hasTotal bool
	local    *limiter.Zone
	queue    *limiter.SharedQueue

	// calling is set from a call's start until the queue is idle (calls
	// follow one another meanwhile), and failed when the latest call got
	// no answer, for send; guarded by callMu.
	callMu     sync.Mutex
	calling    bool
	lastFailed bool
	// fixes are the corrections of fair charges (see Correct) that the
	// next call sends, by fair key (see fairKey); guarded by callMu.
	fixes map[string]float64
	// callGate, if set (by tests), holds every call until it is closed.
	callGate atomic.Pointer[chan struct{}]
}

func newRedisZone(b *book, tag, label string, limits []string, hasTotal bool, local *limiter.Zone) *redisZone {
	z := &redisZone{book: b, tag: tag, label: label, limits: limits, hasTotal: hasTotal, local: local}
	z.queue = limiter.NewSharedQueue(local, z, fallbackPoll)
	return z
}

// Acquire admits req in Redis, behind this instance's waiters, or queues
// it until a release anywhere in the fleet lets it in.
func (z *redisZone) Acquire(ctx context.Context, req *limiter.Request, opt limiter.WaitOptions) limiter.Result {
	z.book.enter()
	defer z.book.exit()
	if !z.book.available() {
		return z.fallback(ctx, req, opt)
	}
	res, err := z.queue.Acquire(ctx, req, opt)
	if err != nil {
		return z.fallback(ctx, req, opt)
	}
	return res
}

// Release gives back the local count at once, and the lease in Redis off
// the response path.
func (z *redisZone) Release(req *limiter.Request) { z.queue.Release(req) }

// fallback applies on_error: refuse, or count and enforce locally. A
// request admitted locally gets a lease (Record) that renewal enters into
// Redis once it answers again. One that waits alone goes on waiting
// through Redis once Redis is available again: admitted alone then, it
// would hold a slot on top of what Redis counts for the fleet.
func (z *redisZone) fallback(ctx context.Context, req *limiter.Request, opt limiter.WaitOptions) limiter.Result {
	if z.book.closed {
		return limiter.Result{Outcome: limiter.Unavailable, Dim: firstDim(req)}
	}
	if opt.Wait <= 0 {
		return z.queue.AcquireAlone(ctx, req, opt)
	}
	alone, stop := context.WithCancel(ctx)
	defer stop()
	back := z.book.whenBack()
	go func() {
		select {
		case <-back:
			stop()
		case <-alone.Done():
		}
	}()
	if queued := opt.Queued; queued != nil { // once, though it may queue twice
		opt.Queued = func() {
			if queued != nil {
				queued()
				queued = nil
			}
		}
	}
	res := z.queue.AcquireAlone(alone, req, opt)
	if res.Outcome != limiter.Aborted || ctx.Err() != nil || res.Waited >= opt.Wait {
		return res
	}
	opt.Wait -= res.Waited
	again, err := z.queue.Acquire(ctx, req, opt)
	if err != nil { // Redis failed again: wait alone for the rest
		again = z.queue.AcquireAlone(ctx, req, opt)
	}
	again.Waited += res.Waited
	return again
}

// sets returns the sorted sets of a claim's dimensions (the total last)
// and the dimension of each. Keys are hashed: Redis never sees a raw key.
func (z *redisZone) sets(c limiter.Claim) ([]string, []int) {
	keys := make([]string, 0, len(c.Keys)+1)
	dims := make([]int, 0, len(c.Keys)+1)
	for d, k := range c.Keys {
		if k == "" {
			continue
		}
		keys = append(keys, z.tag+":"+z.fairKey(d, k))
		dims = append(dims, d)
	}
	if z.hasTotal {
		keys = append(keys, z.tag+":"+totalKey)
		dims = append(dims, limiter.TotalDim)
	}
	return keys, dims
}

// claim is one claim of an admission call, as the script sees it.
type claim struct {
	limiter.Claim
	member string
	sets   []string
	dims   []int
}

// claimOf returns what c asks of Redis: its sets and a new member.
func (z *redisZone) claimOf(c limiter.Claim) claim {
	sets, dims := z.sets(c)
	return claim{Claim: c, member: z.book.member(c.Units), sets: sets, dims: dims}
}

// capOf returns the cap of c's set of dimension d.
func (c claim) capOf(d int) int64 {
	if d == limiter.TotalDim {
		return c.Total
	}
	return c.Caps[d]
}

// holds reports whether c holds the room of dimension d if refused.
func (c claim) holds(d int) bool { return slices.Contains(c.Hold, d) }

// Record files a lease for a claim the local zone admitted alone, which
// renewal enters into Redis once it answers again.
func (z *redisZone) Record(c limiter.Claim) string {
	cl := z.claimOf(c)
	z.book.hold(cl.member, z.tag, cl.sets, c.Units)
	return cl.member
}

// admit runs the admission script for a batch of claims in one round
// trip, after removing the leases of the zone that ended (see book.claim).
// An admitted claim gets its lease, recorded for renewal.
//
// The call does not inherit any request's cancellation: only Redis can
// make it fail. If no reply comes, the script may still run later, until
// its deadline, so its members are removed as ghosts.
func (z *redisZone) admit(in []limiter.Claim) ([]limiter.Verdict, error) {
	verdicts := make([]limiter.Verdict, len(in))
	claims := make([]claim, len(in))
	for i, c := range in {
		claims[i] = z.claimOf(c)
	}
	ended, endedIDs := z.book.claim(z.tag, false)
	if len(claims) == 0 && len(endedIDs) == 0 {
		return verdicts, nil
	}
	op := "acquire"
	if len(claims) == 0 {
		op = "release"
	}
	keys := []string{z.tag + ":waiting", z.tag + ":fair", z.tag + ":fair:t", z.tag + ":fair:x"}
	index := map[string]int{}
	keyIndex := func(set string) int {
		if _, ok := index[set]; !ok {
			keys = append(keys, set)
			index[set] = len(keys)
		}
		return index[set]
	}
	// The deadline is no later than ctx's: measured before it starts.
	localDeadline := localMicros() + z.book.timeout.Microseconds()
	ctx, cancel := context.WithTimeout(storeContext, z.book.timeout)
	defer cancel()
	start := time.Now()
	deadline, err := z.book.deadline(ctx, z.tag, localDeadline)
	if err != nil {
		z.book.settle(z.tag, endedIDs, false)
		return z.failed(op, nil, start, err)
	}
	groups := ended.groups()
	fixes := z.takeFixes()
	size := 13 + 2*len(fixes) // the fixed arguments, and the corrections
	for _, g := range groups {
		size += 3 + len(g.members)
	}
	for _, c := range claims {
		size += 8 + 3*len(c.sets)
	}
	args := make([]any, 0, size)
	args = append(args, deadline, z.book.lease.Milliseconds(), listing.Milliseconds(), z.book.instance, z.tag+":released", 0, len(groups))
	for _, g := range groups {
		args = append(append(args, keyIndex(g.set), g.units, len(g.members)), g.members...)
	}
	waiting, fair := fairOf(in)
	args = append(args, fairListing.Milliseconds(), fairClockLife.Milliseconds(), waiting, fair, len(fixes))
	for k, delta := range fixes {
		args = append(args, k, delta)
	}
	args = append(args, len(claims))
	for _, c := range claims {
		args = append(args, c.member, flag(c.Waits), c.Units, len(c.sets))
		if f := c.Fair; f != nil {
			args = append(args, z.fairKey(f.Dim, c.Keys[f.Dim]), f.Weight, f.Work, flag(f.More))
		} else {
			args = append(args, "", 0, 0, 0)
		}
		for k, set := range c.sets {
			args = append(args, keyIndex(set), c.capOf(c.dims[k]), flag(c.holds(c.dims[k])))
		}
	}
	sentAt := localMicros()
	reply, err := admitScript.Run(ctx, z.book.client, keys, args...).Int64Slice()
	if staleConnection(err) {
		// The connection broke under the call (a reset, Redis closing it):
		// the script may have run. Sent again on another connection, it
		// admits again what it admitted (see admitScript), or decides now,
		// or is too late to. A correction of the fair clock it carried
		// may be applied twice: a grant's ordering, as when one is lost.
		args[5] = 1
		sentAt = localMicros()
		reply, err = admitScript.Run(ctx, z.book.client, keys, args...).Int64Slice()
	}
	z.book.learnClock(z.tag, reply, err, sentAt)
	z.book.settle(z.tag, endedIDs, err == nil)
	if err != nil {
		return z.failed(op, claims, start, asLate(err))
	}
	z.book.observe(op, []string{z.label}, start, nil)
	dims, nkeys := make([][]int, len(claims)), make([]int, len(claims))
	for j, c := range claims {
		dims[j], nkeys[j] = c.dims, len(c.Keys)
	}
	for j, v := range decodeVerdicts(reply[2:], dims, nkeys) {
		c := claims[j]
		if v.Outcome == limiter.Admitted {
			v.Lease = c.member
			z.book.hold(c.member, z.tag, c.sets, c.Units)
		}
		verdicts[j] = v
	}
	return verdicts, nil
}

func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}

// failed ends an admission that got no verdict: the members sent may still
// be written by a script that runs later, so they are removed as ghosts.
func (z *redisZone) failed(op string, claims []claim, start time.Time, err error) ([]limiter.Verdict, error) {
	z.book.observe(op, []string{z.label}, start, err)
	for _, c := range claims {
		z.book.dropGhost(z.tag, c.member, c.sets, c.Units)
	}
	return nil, err
}

func firstDim(req *limiter.Request) int {
	for d, k := range req.Keys {
		if k != "" {
			return d
		}
	}
	return limiter.TotalDim
}
