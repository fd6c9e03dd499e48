package limiter

import (
	"cmp"
	"container/heap"
	"hash/maphash"
	"slices"
	"time"
)

// Shares is fair sharing for waiters queued outside a Zone (a shared
// store's waiters in one instance): the same start-time fair queuing as a
// zone's own queue (see fair.go), for a dispatcher that tries its waiters
// in batches. Its zero value is ready; it is not safe for concurrent use.
type Shares struct {
	seed   maphash.Seed
	vclock virtualClock
}

// FairItem is one waiter to order: its key in the fair dimension, its
// weight (0: its class weight), its units (0: 1) and its place in the
// queue.
type FairItem struct {
	Key    string
	Weight float64
	Units  int64
	Place  Place
}

// Order returns the indexes of items in the order fair sharing would serve
// them one after another: each key's waiters in the queue order, the keys
// interleaved by start tag as if each item before were granted.
func (s *Shares) Order(items []FairItem, now time.Time) []int {
	s.init()
	byKey := map[uint64]*shareQueue{}
	var queues shareHeap
	for i, it := range items {
		h := maphash.String(s.seed, it.Key)
		q := byKey[h]
		if q == nil {
			q = &shareQueue{weight: weightOf(it), tag: s.vclock.start(h), items: items, now: now}
			byKey[h] = q
			queues = append(queues, q)
		}
		q.idx = append(q.idx, i)
	}
	for _, q := range queues {
		slices.SortFunc(q.idx, func(a, b int) int {
			switch {
			case items[a].Place.Before(items[b].Place, now):
				return -1
			case items[b].Place.Before(items[a].Place, now):
				return 1
			}
			return 0
		})
	}
	heap.Init(&queues)
	out := make([]int, 0, len(items))
	for len(queues) > 0 {
		q := queues[0]
		out = append(out, q.idx[0])
		q.tag += float64(max(items[q.idx[0]].Units, 1)) / q.weight
		q.idx = q.idx[1:]
		if len(q.idx) == 0 {
			heap.Pop(&queues)
		} else {
			heap.Fix(&queues, 0)
		}
	}
	return out
}

// Charge records that it was granted its units.
func (s *Shares) Charge(it FairItem) {
	s.init()
	s.vclock.charge(maphash.String(s.seed, it.Key), max(it.Units, 1), weightOf(it))
}

func (s *Shares) init() {
	if s.vclock.tags == nil {
		s.seed, s.vclock.tags = maphash.MakeSeed(), map[uint64]float64{}
	}
}

func weightOf(it FairItem) float64 { return shareOf(it.Weight, it.Place.Class) }

// shareQueue is one key's items in an Order, with its start tag.
type shareQueue struct {
	weight, tag float64
	idx         []int
	items       []FairItem
	now         time.Time
}

// first returns the place of the key's next item and its score.
func (q *shareQueue) first() (Place, float64) {
	p := q.items[q.idx[0]].Place
	return p, score(q.weight, p.Arrived, q.now)
}

// shareHeap orders keys as a zone's fair queue does: by start tag, then by
// their next item's score, then by its arrival.
type shareHeap []*shareQueue

func (h shareHeap) Len() int { return len(h) }
func (h shareHeap) Less(i, j int) bool {
	if h[i].tag != h[j].tag {
		return h[i].tag < h[j].tag
	}
	pi, si := h[i].first()
	pj, sj := h[j].first()
	if si != sj {
		return si > sj
	}
	return cmp.Less(pi.Seq, pj.Seq)
}
func (h shareHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *shareHeap) Push(x any)   { *h = append(*h, x.(*shareQueue)) }
func (h *shareHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
