package limiter

import "time"

// Fair sharing is start-time fair queuing over the keys of one dimension,
// each grant from the queue counting as the units it takes: shares are
// shares of units (unit-seconds, as the requests hold them). A key's tag
// is the virtual time at which the work it was granted so far ends: each
// grant adds units/weight. vtime is the start tag of the latest grant. A
// waiting key's start tag is max(its tag, vtime): a key that was idle or
// light starts at the present, never in the past, so it can neither hoard
// credit nor be starved, and the freed slot goes to the waiter whose key has
// the smallest start tag. Under sustained contention every waiting key is
// granted slots in proportion to its weight whatever its queue length, and
// a key that arrives late is served at the next freed slot its share calls
// for (at once, if it holds less than its share).
//
// Why not the instantaneous rule "the key holding the fewest slots relative
// to its weight": with whole slots it settles where no key's next slot is
// worth moving (10 slots at weights 2 : 1 : 0.5 stay at 5 : 3 : 2 for good,
// not 5.7 : 2.9 : 1.4); counting grants carries the fractions over time.
//
// Weights are bounded (MinWeight to MaxWeight) and units by MaxCost: a tag
// grows by at most MaxCost/MinWeight a grant, and virtual time is rebased
// to 0 (every tag moved back with it) before it reaches rebaseAt, so a
// grant of one unit at MaxWeight is never lost to rounding near vtime and
// no weight can make a tag infinite or NaN.
//
// Invariants, with mu held: tags holds keys whose tag may exceed vtime (a
// tag at or below it reads the same as none), each by at most
// MaxCost/MinWeight;
// vtime never decreases but by a rebase, which moves every tag back as
// much and drops the tags at or below it; a rebase comes once tags has
// doubled since the last one (amortised O(1) a grant, for a queue and for
// a shared store's dispatcher alike), or vtime reached rebaseAt.

// Bounds of a fair share's weight: a weight outside them counts as the
// nearest bound.
const (
	MinWeight = 0.001
	MaxWeight = 1000
)

// rebaseAt is the virtual time at which it is moved back to 0. Below it a
// float64 resolves steps far finer than 1/MaxWeight.
const rebaseAt = 1 << 20

// ClampWeight returns w within MinWeight to MaxWeight, and 0 (the class
// weight) for a weight that is not a positive number.
func ClampWeight(w float64) float64 {
	if !(w > 0) {
		return 0
	}
	return min(max(w, MinWeight), MaxWeight)
}

// virtualClock is fair sharing's virtual time and its keys' tags.
type virtualClock struct {
	vtime float64
	tags  map[uint64]float64
	base  float64 // virtual time moved back by rebases, in all
	// rebaseAbove is the number of tags above which the next grant rebases.
	rebaseAbove int
	// of, if set, is the clock this one simulates grants on (see
	// SharedQueue.order): its tags are read where this one has none.
	of *virtualClock
}

// minRebaseAbove is the fewest tags that make a grant rebase.
const minRebaseAbove = 64

// place returns key's tag on a scale that rebases do not move back, for
// ordering waiters: it never decreases. A key whose start tag is smaller
// than another's has a smaller place (start tags are max(vtime, tag)).
func (c *virtualClock) place(key uint64) float64 {
	return c.base + c.tags[key]
}

// start returns the virtual time at which key starts its next unit.
func (c *virtualClock) start(key uint64) float64 {
	tag, ok := c.tags[key]
	if !ok && c.of != nil {
		tag = c.of.tags[key]
	}
	return max(c.vtime, tag)
}

// advance records a grant of units to key at weight w (within the
// bounds): the arithmetic of fair sharing.
func (c *virtualClock) advance(key uint64, units int64, w float64) {
	if c.tags == nil {
		c.tags = map[uint64]float64{}
	}
	start := c.start(key)
	c.vtime = start
	c.tags[key] = start + float64(units)/w
}

// charge records a grant of units to key at weight w, rebasing when due.
func (c *virtualClock) charge(key uint64, units int64, w float64) {
	c.advance(key, units, w)
	if len(c.tags) > max(c.rebaseAbove, minRebaseAbove) || c.vtime >= rebaseAt {
		c.rebase()
		c.rebaseAbove = 2 * len(c.tags)
	}
}

// simulate returns a clock on which grants can be simulated without
// moving c.
func (c *virtualClock) simulate() *virtualClock {
	return &virtualClock{vtime: c.vtime, of: c}
}

// rebase moves virtual time back to 0 and every tag with it, dropping the
// tags at or below it.
func (c *virtualClock) rebase() {
	for k, tag := range c.tags {
		if tag <= c.vtime {
			delete(c.tags, k)
		} else {
			c.tags[k] = tag - c.vtime
		}
	}
	c.base += c.vtime
	c.vtime = 0
}

// startTag returns the virtual time at which f's key starts its next unit.
func (q *queue) startTag(f *flow) float64 { return q.vclock.start(f.fairKey) }

// charge records a grant of units to f's key.
func (q *queue) charge(f *flow, units int64) {
	q.vclock.charge(f.fairKey, units, f.weight)
}

// before reports whether f's head goes before g's at time now.
func (q *queue) before(f, g *flow, now time.Time) bool {
	return q.next(f).before(q.next(g), now)
}

// candidate is a flow's next waiter to serve, with its key's start tag
// under fair: what the queue order compares.
type candidate struct {
	f     *flow
	w     *waiter
	start float64
}

// next is f's head as a candidate.
func (q *queue) next(f *flow) candidate {
	c := candidate{f: f, w: f.head}
	if f.fair {
		c.start = q.startTag(f)
	}
	return c
}

// before reports whether a goes before b at time now. Fair flows sharing a
// dimension go by their keys' start tags; ties, and flows not comparable
// so, go by the queue order, with a fair flow's score using its own weight.
func (a candidate) before(b candidate, now time.Time) bool {
	if !a.f.fair || !b.f.fair || a.f.keyDim != b.f.keyDim {
		return a.w.Before(b.w.Place, now)
	}
	if a.start != b.start {
		return a.start < b.start
	}
	if sa, sb := score(a.f.weight, a.w.Arrived, now), score(b.f.weight, b.w.Arrived, now); sa != sb {
		return sa > sb
	}
	return a.w.Seq < b.w.Seq
}

// score is weight × (1 + waited / agingPeriod): the queue order's score.
func score(weight float64, arrived, now time.Time) float64 {
	return weight * (1 + float64(now.Sub(arrived))/float64(agingPeriod))
}
