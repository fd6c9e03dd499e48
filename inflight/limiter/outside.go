package limiter

import "sync"

// waitOutside reserves a place for a request about to wait in a shared
// queue instead of the zone's own, unless max (if positive) wait there
// already. A zone can have several shared queues for a while (a reload that
// changed a store's options keeps the old one serving its waiters), and
// max_waiting bounds them together.
func (z *Zone) waitOutside(max int) bool {
	for {
		n := z.outside.Load()
		if max > 0 && n >= int64(max) {
			return false
		}
		if z.outside.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// doneWaitingOutside gives back a place waitOutside reserved.
func (z *Zone) doneWaitingOutside() { z.outside.Add(-1) }

// WaitingOutside returns how many of the zone's requests wait in shared
// queues.
func (z *Zone) WaitingOutside() int64 { return z.outside.Load() }

// sharedQueues lists a zone's shared queues that have waiters.
type sharedQueues struct {
	mu sync.Mutex
	m  map[*SharedQueue]struct{}
}

// listShared records whether q has waiters.
func (z *Zone) listShared(q *SharedQueue, waiting bool) {
	z.shared.mu.Lock()
	defer z.shared.mu.Unlock()
	if !waiting {
		delete(z.shared.m, q)
		return
	}
	if z.shared.m == nil {
		z.shared.m = map[*SharedQueue]struct{}{}
	}
	z.shared.m[q] = struct{}{}
}

// SharedQueues returns the zone's shared queues that have waiters.
func (z *Zone) SharedQueues() []*SharedQueue {
	z.shared.mu.Lock()
	defer z.shared.mu.Unlock()
	out := make([]*SharedQueue, 0, len(z.shared.m))
	for q := range z.shared.m {
		out = append(out, q)
	}
	return out
}

// waitingElsewhere counts the waiters of req's key (of opt.KeyDim) in the
// zone's other shared queues, for max_waiting_per_key. q's mu must not be
// held.
func (q *SharedQueue) waitingElsewhere(req *Request, opt WaitOptions) int {
	if opt.MaxWaitingPerKey <= 0 {
		return 0
	}
	k := q.keyOf(req, opt.KeyDim)
	if k == 0 {
		return 0
	}
	n := 0
	for _, other := range q.zone.SharedQueues() {
		if other != q {
			other.mu.Lock()
			n += other.perKey[k]
			other.mu.Unlock()
		}
	}
	return n
}
