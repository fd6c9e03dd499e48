package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// totalKey names the sorted set of a zone's total cap.
const totalKey = "total"

// redisZone is the store of one zone kept in Redis: a limiter.Ledger of
// leases, under the engine's queue for the requests waiting in this
// instance. The local zone counts this instance's requests (for metrics
// and the admin API) and, when Redis cannot be reached and the store fails
// open, enforces the caps alone.
type redisZone struct {
	book     *book
	tag      string // key prefix, with the cluster hash tag
	label    string // the zone's name in metrics and logs
	limits   []string
	hasTotal bool
	local    *limiter.Zone
	keyBound atomic.Pointer[keyBound] // see keysOnly
	queue    *limiter.SharedQueue

	// calling is set from a call's start until the queue is idle (calls
	// follow one another meanwhile), and failed when the latest call got
	// no answer, for send; guarded by callMu.
	callMu     sync.Mutex
	calling    bool
	lastFailed bool
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
	req.Lease = ""
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
func (z *redisZone) Release(req *limiter.Request) {
	z.local.Release(req)
	z.book.release(req.Lease)
}

// fallback applies on_error: refuse, or count and enforce locally. A
// request admitted locally gets a lease that renewal enters into Redis once
// it answers again.
func (z *redisZone) fallback(ctx context.Context, req *limiter.Request, opt limiter.WaitOptions) limiter.Result {
	if z.book.closed {
		return limiter.Result{Outcome: limiter.StoreError, Dim: firstDim(req)}
	}
	res := z.local.Acquire(ctx, req, opt)
	if res.Outcome == limiter.Admitted {
		// The lease carries what the request holds in the fleet's terms:
		// its cost clamped to the whole caps, not to this instance's share.
		sets, _ := z.keys(req)
		units := z.units(z.local.LimitsOf(req), req)
		req.Lease = z.book.member(units)
		z.book.hold(req.Lease, z.tag, sets, units)
	}
	return res
}

// keys returns the sorted sets of req's dimensions (the total last) and the
// dimension of each. Keys are hashed: Redis never sees a raw key.
func (z *redisZone) keys(req *limiter.Request) ([]string, []int) {
	keys := make([]string, 0, len(req.Keys)+1)
	dims := make([]int, 0, len(req.Keys)+1)
	for d, k := range req.Keys {
		if k == "" {
			continue
		}
		sum := sha256.Sum256([]byte(k))
		keys = append(keys, z.tag+":"+z.limits[d]+":"+hex.EncodeToString(sum[:12]))
		dims = append(dims, d)
	}
	if z.hasTotal {
		keys = append(keys, z.tag+":"+totalKey)
		dims = append(dims, limiter.TotalDim)
	}
	return keys, dims
}

// units returns the units req takes in Redis under lim: its cost, clamped
// to the fleet's caps (see limiter.Limits.Units).
func (z *redisZone) units(lim *limiter.Limits, req *limiter.Request) int64 {
	return lim.Units(req, z.hasTotal, true)
}

// claim is one request of an admission call, as the script sees it.
type claim struct {
	member string
	sets   []string
	dims   []int
	caps   []int64
	units  int64
}

// claimOf returns what req asks of Redis, under the limits that apply to
// it now.
func (z *redisZone) claimOf(req *limiter.Request) claim {
	sets, dims := z.keys(req)
	lim := z.local.LimitsOf(req)
	caps := make([]int64, len(dims))
	for k, d := range dims {
		caps[k] = lim.WholeCap(req, d)
	}
	u := z.units(lim, req)
	return claim{member: z.book.member(u), sets: sets, dims: dims, caps: caps, units: u}
}

// admit runs the admission script for a batch of requests in one round
// trip, against the limits that apply to each now, after removing the
// leases of the zone that ended (see book.claim). An admitted request gets
// its lease, recorded for renewal, and is counted locally with the units
// it took in Redis. waits says which requests wait if refused. A request
// whose key max_keys refuses is not sent.
//
// The call does not inherit any request's cancellation: only Redis can
// make it fail. If no reply comes, the script may still run later, until
// its deadline, so its members are removed as ghosts.
func (z *redisZone) admit(reqs []*limiter.Request, waits []bool) ([]limiter.Verdict, error) {
	verdicts := make([]limiter.Verdict, len(reqs))
	counted := make([]bool, len(reqs))
	var sent []int // indexes of the requests in the script
	var claims []claim
	for i, req := range reqs {
		c := z.claimOf(req)
		ok, dim, held := z.reserveKeys(req, c.units)
		if !ok {
			verdicts[i] = limiter.Verdict{Outcome: limiter.KeysFull, Dim: dim}
			continue
		}
		counted[i] = held
		sent = append(sent, i)
		claims = append(claims, c)
	}
	ended, endedIDs := z.book.claim(z.tag, false)
	if len(sent) == 0 && len(endedIDs) == 0 {
		return verdicts, nil
	}
	op := "acquire"
	if len(sent) == 0 {
		op = "release"
	}
	keys := []string{z.tag + ":waiting"}
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
		return z.failed(op, reqs, sent, counted, nil, start, err)
	}
	groups := ended.groups()
	args := []any{deadline, z.book.lease.Milliseconds(), listing.Milliseconds(), z.book.instance, z.tag + ":released", len(groups)}
	for _, g := range groups {
		args = append(append(args, keyIndex(g.set), g.units, len(g.members)), g.members...)
	}
	args = append(args, len(sent))
	for j, i := range sent {
		c := claims[j]
		willWait := 0
		if waits[i] {
			willWait = 1
		}
		args = append(args, c.member, willWait, c.units, len(c.sets))
		for k, set := range c.sets {
			args = append(args, keyIndex(set), c.caps[k])
		}
	}
	sentAt := localMicros()
	reply, err := admitScript.Run(ctx, z.book.client, keys, args...).Int64Slice()
	z.book.learnClock(z.tag, reply, err, sentAt)
	z.book.settle(z.tag, endedIDs, err == nil)
	if err != nil {
		return z.failed(op, reqs, sent, counted, claims, start, asLate(err))
	}
	z.book.observe(op, []string{z.label}, start, nil)
	dims := make([][]int, len(claims))
	for j, c := range claims {
		dims[j] = c.dims
	}
	for j, v := range decodeVerdicts(reply[2:], dims) {
		i, c := sent[j], claims[j]
		verdicts[i] = v
		switch {
		case v.Outcome == limiter.Admitted:
			reqs[i].Lease = c.member
			z.book.hold(c.member, z.tag, c.sets, c.units)
			if !counted[i] {
				z.local.Hold(reqs[i], c.units)
			}
		case counted[i]:
			z.local.Release(reqs[i])
		}
	}
	return verdicts, nil
}

// failed ends an admission that got no verdict: the members sent may still
// be written by a script that runs later, so they are removed as ghosts,
// and the requests counted locally are given back.
func (z *redisZone) failed(op string, reqs []*limiter.Request, sent []int, counted []bool, claims []claim, start time.Time, err error) ([]limiter.Verdict, error) {
	z.book.observe(op, []string{z.label}, start, err)
	for _, c := range claims {
		z.book.dropGhost(z.tag, c.member, c.sets, c.units)
	}
	for _, i := range sent {
		if counted[i] {
			z.local.Release(reqs[i])
		}
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
