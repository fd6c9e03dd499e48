package core

import (
	"math/rand/v2"
	"sync"
	"time"
)

// A refused unit's client may be told when to come back, sharper than
// Retry-After's whole seconds (the edge's retry-after-ms): RetryHint gives
// each refused unit a time of its own, spaced by the zone's recent rate of
// freed slots, after the units already waiting. Refused clients that come
// back when told then find, one after another, the slots that freed
// meanwhile, rather than all at once, when all but one are refused again.

// minRetryHint is the shortest wait a hint gives: a client told less comes
// back before the scheduler has run what frees its slot.
const minRetryHint = 10 * time.Millisecond

// retrySchedule is when the zone's latest hint told its client to come
// back: the next hint is a slot's time after it.
type retrySchedule struct {
	mu   sync.Mutex
	last time.Time
}

// RetryHint returns how long a unit refused now should wait before it
// comes back: the later of (the units waiting + 1) ÷ the zone's recent
// rate of freed slots and one slot's time after the previous hint,
// jittered by ±10 %, within minRetryHint to ceiling; false while the rate
// is not known (fewer than minGrants releases counted since the zone
// began). The gate counts the zone's releases only if its edge asked
// (Edge.RetryHints).
func (g *Gate) RetryHint(ceiling time.Duration) (time.Duration, bool) {
	now := g.zone.Clock().Now()
	r, ok := g.zone.grants.rate(now)
	if !ok || r <= 0 {
		return 0, false
	}
	slot := time.Duration(float64(time.Second) / r)
	s := &g.zone.retries
	s.mu.Lock()
	at := now.Add(time.Duration(g.zone.waiting()+1) * slot)
	if next := s.last.Add(slot); next.After(at) {
		at = next
	}
	if at.Sub(now) > ceiling { // told no later than Retry-After: the schedule stays
		at = now.Add(ceiling)
	} else {
		s.last = at
	}
	s.mu.Unlock()
	wait := time.Duration(float64(at.Sub(now)) * (0.9 + 0.2*rand.Float64()))
	return min(max(wait, minRetryHint), ceiling), true
}
