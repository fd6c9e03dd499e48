// Package limiter counts requests in flight per key and decides, all or
// nothing, whether one more may start. It knows nothing of HTTP or Caddy.
//
// A Zone holds the counters of a fixed list of dimensions (limits), each a
// map from key to count, plus an optional zone-wide total. A Request names one
// key per dimension; it is admitted only if every dimension and the total have
// room, and then it holds one slot in each until Release.
//
// Invariants:
//   - A count is changed only with its shard's lock held. A map entry exists
//     only while its count is above zero.
//   - Admission is atomic: every shard a request touches is locked (in
//     ascending shard order, so two requests never deadlock) before any
//     count is read, and nothing is written unless everything fits. A
//     refused request never changes a count, so it can never cause a
//     neighbour to be refused.
//   - The total is an atomic counter, raised only after the keyed dimensions
//     have been checked under their locks, by compare-and-swap against its
//     max; it never exceeds the max it was checked against.
//   - The queue lock (Zone.mu) is always taken before any shard lock.
//   - While any request is queued, newcomers go through the queue lock and
//     let admissible waiters go first (see queue.go).
package limiter

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// TotalDim is the dimension index that stands for the zone-wide total in
// results.
const TotalDim = -1

const (
	numShards = 64 // power of two; spreads keys over locks so cores rarely meet
	// shrinkAt is the peak size after which an emptied map is replaced: Go maps
	// never give back their buckets, and a burst of a million keys would
	// otherwise stay in memory forever.
	shrinkAt = 1024
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

	retired atomic.Bool
}

// Request is one admission. Keys and Max must stay unchanged from Acquire
// until Release.
type Request struct {
	// Keys holds one key per dimension; "" means the dimension does not
	// apply to this request (it is neither checked nor counted).
	Keys []string
	// Max holds per-request caps for dimensions whose Limits.Max is 0.
	Max []int64
	// Limits are the caps of the handler that admits the request.
	Limits *Limits
}

// Zone counts requests in flight for a fixed list of dimensions.
type Zone struct {
	dims     int
	hasTotal bool
	seed     maphash.Seed
	shards   [numShards]shard
	total    atomic.Int64

	// latest are the Limits of the newest handler provisioned for this zone;
	// waiters whose own Limits were retired by a reload use them instead.
	latest atomic.Pointer[Limits]

	queue
}

type shard struct {
	mu     sync.Mutex
	counts []map[string]int64 // per dimension
	peak   []int              // per dimension: largest len since the map was made
	held   []atomic.Int64     // per dimension: sum of counts, read by metrics
	_      [64]byte           // keep neighbouring shards' locks off one cache line
}

// NewZone returns a zone of dims keyed dimensions, with a zone-wide total
// counter if hasTotal. A nil clock means the real one.
func NewZone(dims int, hasTotal bool, clock Clock) *Zone {
	if clock == nil {
		clock = realClock{}
	}
	z := &Zone{dims: dims, hasTotal: hasTotal, seed: maphash.MakeSeed()}
	z.clock = clock
	for i := range z.shards {
		s := &z.shards[i]
		s.counts = make([]map[string]int64, dims)
		s.peak = make([]int, dims)
		s.held = make([]atomic.Int64, dims)
		for d := range s.counts {
			s.counts[d] = make(map[string]int64)
		}
	}
	return z
}

// Dims returns the number of keyed dimensions.
func (z *Zone) Dims() int { return z.dims }

// HasTotal reports whether the zone counts a zone-wide total.
func (z *Zone) HasTotal() bool { return z.hasTotal }

// Adopt makes l the limits that waiters with retired limits use, and admits
// any waiter that l now lets in (a raised max admits at once).
func (z *Zone) Adopt(l *Limits) {
	z.latest.Store(l)
	z.kick()
}

// Retire marks l as replaced (its handler was unloaded): waiters that hold l
// move to the zone's latest limits, which may admit them.
func (z *Zone) Retire(l *Limits) {
	l.retired.Store(true)
	z.latest.CompareAndSwap(l, nil)
	z.kick()
}

// TryAcquire admits req if every dimension has room, without waiting. On
// refusal it returns false and the refusing dimension (TotalDim for the
// total).
func (z *Zone) TryAcquire(req *Request) (bool, int) {
	if z.pending.Load() > 0 {
		// Waiters exist: let any that fit go first.
		z.mu.Lock()
		defer z.mu.Unlock()
		z.dispatchLocked()
	}
	return z.tryAcquire(req, true)
}

// Release gives back the slots req holds and hands them to waiters that
// now fit. It is safe after the zone is no longer used by any handler.
func (z *Zone) Release(req *Request) {
	for d, key := range req.Keys {
		if key == "" {
			continue
		}
		s := z.shardFor(d, key)
		s.mu.Lock()
		s.decrement(d, key)
		s.mu.Unlock()
	}
	if z.hasTotal {
		z.total.Add(-1)
	}
	z.kick()
}

// Held returns the slots held in dimension d (TotalDim: the total).
func (z *Zone) Held(d int) int64 {
	if d == TotalDim {
		return z.total.Load()
	}
	var n int64
	for i := range z.shards {
		n += z.shards[i].held[d].Load()
	}
	return n
}

// Keys returns how many keys of dimension d have requests in flight.
func (z *Zone) Keys(d int) int {
	n := 0
	for i := range z.shards {
		s := &z.shards[i]
		s.mu.Lock()
		n += len(s.counts[d])
		s.mu.Unlock()
	}
	return n
}

// tryAcquire checks every dimension of req under its shard lock and, if all
// fit and commit is set, takes one slot in each.
func (z *Zone) tryAcquire(req *Request, commit bool) (bool, int) {
	lim := z.limitsFor(req)
	var idx [8]int
	locked := z.lockShards(req, idx[:0])
	defer unlockShards(&z.shards, locked)

	for d, key := range req.Keys {
		if key == "" {
			continue
		}
		if z.shardFor(d, key).counts[d][key] >= capFor(lim, req, d) {
			return false, d
		}
	}
	if z.hasTotal && !z.takeTotal(lim.Total, commit) {
		return false, TotalDim
	}
	if !commit {
		return true, 0
	}
	for d, key := range req.Keys {
		if key != "" {
			z.shardFor(d, key).increment(d, key)
		}
	}
	return true, 0
}

// takeTotal raises the total by one if it is below max (0: no max). Without
// commit it only reports whether it would.
func (z *Zone) takeTotal(max int64, commit bool) bool {
	for {
		n := z.total.Load()
		if max > 0 && n >= max {
			return false
		}
		if !commit || z.total.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

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

func capFor(lim *Limits, req *Request, d int) int64 {
	if d < len(lim.Max) && lim.Max[d] > 0 {
		return lim.Max[d]
	}
	return req.Max[d]
}

func (z *Zone) shardIndex(d int, key string) int {
	h := maphash.String(z.seed, key) + uint64(d)*0x9e3779b97f4a7c15
	return int(h>>32) & (numShards - 1)
}

func (z *Zone) shardFor(d int, key string) *shard {
	return &z.shards[z.shardIndex(d, key)]
}

// lockShards locks, in ascending order and once each, every shard that req's
// keys live in, and returns their indices.
func (z *Zone) lockShards(req *Request, idx []int) []int {
	for d, key := range req.Keys {
		if key == "" {
			continue
		}
		i := z.shardIndex(d, key)
		pos := len(idx)
		for pos > 0 && idx[pos-1] > i {
			pos--
		}
		if pos > 0 && idx[pos-1] == i {
			continue
		}
		idx = append(idx, 0)
		copy(idx[pos+1:], idx[pos:])
		idx[pos] = i
	}
	for _, i := range idx {
		z.shards[i].mu.Lock()
	}
	return idx
}

func unlockShards(shards *[numShards]shard, idx []int) {
	for _, i := range idx {
		shards[i].mu.Unlock()
	}
}

func (s *shard) increment(d int, key string) {
	m := s.counts[d]
	m[key]++
	if len(m) > s.peak[d] {
		s.peak[d] = len(m)
	}
	s.held[d].Add(1)
}

func (s *shard) decrement(d int, key string) {
	m := s.counts[d]
	n, ok := m[key]
	if !ok {
		return // never held: nothing to give back
	}
	if n > 1 {
		m[key] = n - 1
	} else {
		delete(m, key)
		if len(m) == 0 && s.peak[d] >= shrinkAt {
			s.counts[d] = make(map[string]int64)
			s.peak[d] = 0
		}
	}
	s.held[d].Add(-1)
}
