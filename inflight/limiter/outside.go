package limiter

// WaitOutside reserves a place for a request about to wait in a shared
// store's queue instead of the zone's own, unless max (if positive) wait
// there already. A zone can have several such queues for a while (a reload
// that changed the store's options keeps the old one serving its
// waiters), and max_waiting bounds them together.
func (z *Zone) WaitOutside(max int) bool {
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

// DoneWaitingOutside gives back a place WaitOutside reserved.
func (z *Zone) DoneWaitingOutside() { z.outside.Add(-1) }

// WaitingOutside returns how many of the zone's requests wait in shared
// stores' queues.
func (z *Zone) WaitingOutside() int64 { return z.outside.Load() }
