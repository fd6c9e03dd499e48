package redisstore

import (
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// noCap stands for "no cap" in limits that bound keys only; a power of two
// far from overflowing when divided by replicas.
const noCap = 1 << 62

// keyBound pairs a handler's limits with limits that keep only their
// max_keys, for reserveKeys.
type keyBound struct {
	of, keysOnly *limiter.Limits
}

// reserveKeys applies max_keys, which with a shared store bounds the keys
// this instance holds (it protects this process's memory; the caps
// themselves are the store's): req is counted in the local zone if each of
// its keys is in flight here already or has room. It reports false and the
// refusing dimension when a key has no room, and whether it counted req
// (only under max_keys; otherwise admit counts it once Redis admits it).
// It counts the units req takes in Redis.
func (z *redisZone) reserveKeys(req *limiter.Request, units int64) (ok bool, dim int, counted bool) {
	lim := z.local.LimitsOf(req)
	if lim.MaxKeys == 0 {
		return true, 0, false
	}
	own, cost := req.Limits, req.Cost
	req.Limits, req.Cost = z.keysOnly(lim), units
	ok, dim = z.local.TryAcquire(req)
	req.Limits, req.Cost = own, cost
	return ok, dim, ok
}

// keysOnly returns lim without its caps, keeping max_keys; the last one
// made is kept, as limits change only on reload.
func (z *redisZone) keysOnly(lim *limiter.Limits) *limiter.Limits {
	if b := z.keyBound.Load(); b != nil && b.of == lim {
		return b.keysOnly
	}
	max := make([]int64, len(lim.Max))
	for i := range max {
		max[i] = noCap
	}
	b := &keyBound{of: lim, keysOnly: &limiter.Limits{Max: max, MaxKeys: lim.MaxKeys}}
	z.keyBound.Store(b)
	return b.keysOnly
}
