package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// admitScript admits, in order, each of a batch of requests whose every
// sorted set has room, all or nothing per request. For each it returns 0
// (admitted) or the 1-based position of the set that was full.
//
// Times are Redis's own clock, so the instances' clocks need not agree.
// KEYS: the sorted sets. ARGV: the lease (ms), the number of requests, then
// per request its member, its number of sets, and per set its index in KEYS
// and its max.
var admitScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local expiry, ttl = now + lease, 2 * lease
local pos, cleaned, out = 3, {}, {}
for r = 1, n do
	local member, count = ARGV[pos], tonumber(ARGV[pos + 1])
	pos = pos + 2
	local sets, full = {}, 0
	for j = 1, count do
		local key, max = KEYS[tonumber(ARGV[pos])], tonumber(ARGV[pos + 1])
		pos = pos + 2
		sets[j] = key
		if full == 0 then
			if not cleaned[key] then
				redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
				cleaned[key] = true
			end
			if redis.call('ZCARD', key) >= max then full = j end
		end
	end
	if full == 0 then
		for _, key in ipairs(sets) do
			redis.call('ZADD', key, expiry, member)
			redis.call('PEXPIRE', key, ttl)
		end
	end
	out[r] = full
end
return out
`)

// releaseScript removes a lease from its sets and tells every instance that
// slots freed. KEYS: the sets. ARGV: the member, the channel.
var releaseScript = redis.NewScript(`
for _, key in ipairs(KEYS) do redis.call('ZREM', key, ARGV[1]) end
redis.call('PUBLISH', ARGV[2], '1')
return 0
`)

// fallbackPoll bounds how long a waiter can miss a release notice (lost
// messages, a reconnecting subscription) before it tries again.
const fallbackPoll = 250 * time.Millisecond

// totalKey names the sorted set of a zone's total cap.
const totalKey = "total"

// redisZone is the Store of one zone kept in Redis. The local zone counts
// this instance's requests (for metrics and the admin API) and, when Redis
// cannot be reached and the store fails open, enforces the caps alone.
type redisZone struct {
	book     *redisBook
	tag      string // key prefix, with the cluster hash tag
	limits   []string
	hasTotal bool
	local    *limiter.Zone
	closed   atomic.Bool

	mu      sync.Mutex
	waiters []*redisWaiter
	seq     uint64
	wakeup  chan struct{}
}

type redisWaiter struct {
	limiter.Place
	req     *limiter.Request // the waiter's own copy: the dispatcher writes its Lease
	ready   chan struct{}
	granted bool
}

func newRedisZone(b *redisBook, tag string, limits []string, hasTotal bool, local *limiter.Zone) *redisZone {
	z := &redisZone{book: b, tag: tag, limits: limits, hasTotal: hasTotal, local: local, wakeup: make(chan struct{}, 1)}
	b.stopped.Add(1)
	go z.dispatchLoop()
	return z
}

// Acquire admits req in Redis, or queues it in this instance until a
// release anywhere in the fleet lets it in.
func (z *redisZone) Acquire(ctx context.Context, req *limiter.Request, opt limiter.WaitOptions) limiter.Result {
	req.Lease = ""
	if !z.book.available() {
		return z.fallback(ctx, req, opt)
	}
	full, err := z.admit(ctx, []*limiter.Request{req})
	if err != nil {
		return z.fallback(ctx, req, opt)
	}
	if full[0] == 0 {
		return limiter.Result{Outcome: limiter.Admitted}
	}
	if opt.Wait <= 0 {
		return limiter.Result{Outcome: limiter.Full, Dim: full[0] - 1}
	}
	return z.wait(ctx, req, opt, full[0]-1)
}

// Release gives the lease back in Redis (one round trip, which also wakes
// waiters everywhere) and the local count.
func (z *redisZone) Release(req *limiter.Request) {
	z.local.Release(req)
	if req.Lease == "" {
		return // admitted locally while Redis was unreachable
	}
	z.book.untrack(req.Lease)
	keys, _ := z.keys(req)
	ctx, cancel := context.WithTimeout(context.Background(), z.book.timeout)
	defer cancel()
	start := time.Now()
	err := releaseScript.Run(ctx, z.book.client, keys, req.Lease, z.tag+":released").Err()
	z.book.observe("release", start, err) // on error the lease expires by itself
}

// fallback applies on_error: refuse, or count and enforce locally.
func (z *redisZone) fallback(ctx context.Context, req *limiter.Request, opt limiter.WaitOptions) limiter.Result {
	if z.closed.Load() {
		return limiter.Result{Outcome: limiter.StoreError, Dim: firstDim(req)}
	}
	return z.local.Acquire(ctx, req, opt)
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

// admit runs the admission script for a batch of requests in one round
// trip. For each request it returns 0 if admitted (its lease recorded for
// renewal and counted locally), or 1 + the dimension that was full.
func (z *redisZone) admit(ctx context.Context, reqs []*limiter.Request) ([]int, error) {
	var keys []string
	index := map[string]int{}
	args := []any{z.book.lease.Milliseconds(), len(reqs)}
	members := make([]string, len(reqs))
	sets := make([][]string, len(reqs))
	dimsOf := make([][]int, len(reqs))
	for i, req := range reqs {
		members[i] = z.book.member()
		sets[i], dimsOf[i] = z.keys(req)
		args = append(args, members[i], len(sets[i]))
		for j, k := range sets[i] {
			if _, ok := index[k]; !ok {
				keys = append(keys, k)
				index[k] = len(keys)
			}
			args = append(args, index[k], req.Limits.WholeCap(req, dimsOf[i][j]))
		}
	}
	ctx, cancel := context.WithTimeout(ctx, z.book.timeout)
	defer cancel()
	start := time.Now()
	res, err := admitScript.Run(ctx, z.book.client, keys, args...).Int64Slice()
	z.book.observe("acquire", start, err)
	if err != nil {
		return nil, err
	}
	out := make([]int, len(reqs))
	for i, full := range res {
		if full != 0 {
			out[i] = 1 + dimsOf[i][full-1]
			continue
		}
		reqs[i].Lease = members[i]
		z.book.track(members[i], sets[i])
		z.local.Hold(reqs[i])
	}
	return out, nil
}

// wait queues req in this instance. Waiters are tried best first (score,
// class, arrival) in one batch whenever a release is announced, and at
// least every fallbackPoll.
func (z *redisZone) wait(ctx context.Context, req *limiter.Request, opt limiter.WaitOptions, dim int) limiter.Result {
	z.mu.Lock()
	if opt.MaxWaiting > 0 && len(z.waiters) >= opt.MaxWaiting {
		z.mu.Unlock()
		return limiter.Result{Outcome: limiter.QueueFull, Dim: dim}
	}
	z.seq++
	own := &limiter.Request{Keys: slices.Clone(req.Keys), Max: slices.Clone(req.Max), Limits: req.Limits}
	w := &redisWaiter{Place: limiter.Place{Class: opt.Class, Arrived: time.Now(), Seq: z.seq}, req: own, ready: make(chan struct{})}
	z.waiters = append(z.waiters, w)
	z.mu.Unlock()
	z.wake()

	timer := time.NewTimer(opt.Wait)
	defer timer.Stop()
	outcome := limiter.Timeout
	select {
	case <-w.ready:
		req.Lease = w.req.Lease
		return limiter.Result{Outcome: limiter.Admitted, Waited: time.Since(w.Arrived)}
	case <-ctx.Done():
		outcome = limiter.Aborted
	case <-timer.C:
	}
	z.mu.Lock()
	granted := w.granted
	z.waiters = slices.DeleteFunc(z.waiters, func(x *redisWaiter) bool { return x == w })
	z.mu.Unlock()
	waited := time.Since(w.Arrived)
	switch {
	case granted && outcome == limiter.Aborted:
		z.Release(w.req)
	case granted:
		req.Lease = w.req.Lease
		return limiter.Result{Outcome: limiter.Admitted, Waited: waited}
	}
	return limiter.Result{Outcome: outcome, Dim: dim, Waited: waited}
}

// wake asks the dispatcher to try the waiters.
func (z *redisZone) wake() {
	select {
	case z.wakeup <- struct{}{}:
	default:
	}
}

// dispatchLoop tries the waiters when woken, and every fallbackPoll while
// there are any.
func (z *redisZone) dispatchLoop() {
	defer z.book.stopped.Done()
	poll := time.NewTicker(fallbackPoll)
	defer poll.Stop()
	for {
		select {
		case <-z.book.stop:
			return
		case <-z.wakeup:
		case <-poll.C:
		}
		z.dispatch()
	}
}

// dispatch offers the slots to the waiters, best first, in one batch: each
// that fits is admitted, so one whose key is full blocks nobody.
func (z *redisZone) dispatch() {
	z.mu.Lock()
	now := time.Now()
	queue := slices.Clone(z.waiters)
	z.mu.Unlock()
	if len(queue) == 0 || !z.book.available() {
		return
	}
	slices.SortFunc(queue, func(a, b *redisWaiter) int {
		switch {
		case a.Before(b.Place, now):
			return -1
		case b.Before(a.Place, now):
			return 1
		}
		return 0
	})
	reqs := make([]*limiter.Request, len(queue))
	for i, w := range queue {
		reqs[i] = w.req
	}
	full, err := z.admit(context.Background(), reqs)
	if err != nil {
		return
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	for i, w := range queue {
		if full[i] != 0 {
			continue
		}
		if !slices.Contains(z.waiters, w) { // it left while the script ran
			go z.Release(w.req) // its own copy: safe after it returned
			continue
		}
		w.granted = true
		z.waiters = slices.DeleteFunc(z.waiters, func(x *redisWaiter) bool { return x == w })
		close(w.ready)
	}
}

// Waiting returns how many requests wait in this instance.
func (z *redisZone) Waiting() int64 {
	z.mu.Lock()
	defer z.mu.Unlock()
	return int64(len(z.waiters))
}

func firstDim(req *limiter.Request) int {
	for d, k := range req.Keys {
		if k != "" {
			return d
		}
	}
	return limiter.TotalDim
}
