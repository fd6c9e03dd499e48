package limiter

import "time"

// Fair sharing is start-time fair queuing over the keys of one dimension,
// each slot granted from the queue counting as one unit of work. A key's
// tag is the virtual time at which the work it was granted so far ends:
// each grant adds 1/weight. vtime is the start tag of the latest grant. A
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
// Invariants, with mu held: vtime never decreases; tags holds keys whose
// tag may exceed vtime (a tag at or below it reads the same as none), and is
// pruned when it outgrows the flows.

// startTag returns the virtual time at which f's key starts its next unit.
func (z *Zone) startTag(f *flow) float64 {
	return max(z.vtime, z.tags[f.fairKey])
}

// charge records a grant to f's key.
func (z *Zone) charge(f *flow) {
	start := z.startTag(f)
	z.vtime = start
	z.tags[f.fairKey] = start + 1/f.weight
	if len(z.tags) > 2*len(z.byID)+64 {
		for k, tag := range z.tags {
			if tag <= z.vtime {
				delete(z.tags, k)
			}
		}
	}
}

// before reports whether f's head goes before g's at time now. Fair flows
// sharing a dimension go by their keys' start tags; ties, and flows not
// comparable so, go by the queue order, with a fair flow's score using its
// own weight.
func (z *Zone) before(f, g *flow, now time.Time) bool {
	if !f.fair || !g.fair || f.keyDim != g.keyDim {
		return f.head.Before(g.head.Place, now)
	}
	if sf, sg := z.startTag(f), z.startTag(g); sf != sg {
		return sf < sg
	}
	if sf, sg := f.score(now), g.score(now); sf != sg {
		return sf > sg
	}
	return f.head.Seq < g.head.Seq
}

func (f *flow) score(now time.Time) float64 { return score(f.weight, f.head.Arrived, now) }

// score is weight × (1 + waited / agingPeriod): the queue order's score.
func score(weight float64, arrived, now time.Time) float64 {
	return weight * (1 + float64(now.Sub(arrived))/float64(agingPeriod))
}
