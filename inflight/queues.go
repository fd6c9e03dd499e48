package inflight

import (
	"sync"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// Queue is a shared store's queue of one zone's requests waiting in this
// process; the zone counts them (limiter.Zone.WaitOutside), the queue lists
// their keys.
type Queue interface {
	WaitingKeys(d int) []limiter.KeyWaiting
}

// queues holds, by zone, the shared stores' queues that have requests
// waiting. A zone can have several: a reload that changes a store's
// options leaves the old queue serving its waiters beside the new one.
// Only queues with waiters are held, so nothing here outlives its use.
var queues = struct {
	sync.Mutex
	m map[*limiter.Zone]map[Queue]struct{}
}{m: map[*limiter.Zone]map[Queue]struct{}{}}

// QueueWaiting records whether a shared store's queue for the zone local
// has requests waiting. A store calls it when the queue gets its first
// waiter and when it loses its last, so that metrics and the admin API
// count them.
func QueueWaiting(local *limiter.Zone, q Queue, waiting bool) {
	queues.Lock()
	defer queues.Unlock()
	set := queues.m[local]
	switch {
	case waiting && set == nil:
		queues.m[local] = map[Queue]struct{}{q: {}}
	case waiting:
		set[q] = struct{}{}
	case set != nil:
		delete(set, q)
		if len(set) == 0 {
			delete(queues.m, local)
		}
	}
}

// QueuesOf returns the shared stores' queues of a zone that have requests
// waiting.
func QueuesOf(local *limiter.Zone) []Queue {
	queues.Lock()
	defer queues.Unlock()
	out := make([]Queue, 0, len(queues.m[local]))
	for q := range queues.m[local] {
		out = append(out, q)
	}
	return out
}
