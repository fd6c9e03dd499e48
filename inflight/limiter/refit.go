package limiter

import (
	"math"

	"github.com/caddy-inflight/caddy-inflight/inflight/fleet"
)

// grantsIn reports whether the ledger, in the state table shows, would
// grant this instance a want of units in that set of cap c, once this
// call's report there carries target (placed after every other report
// if placedLast: a new report, or another head's). It is the Holds rule
// of internal/fleetref, read off a table: the set's level, plus the
// want, plus the room the reports hold against it (those placed before
// this instance's, or all if the want takes it beyond its target) within
// c. TestGrantsInMatchesTheLedger pins it to the reference.
func grantsIn(table fleet.Table, c, units int64, target float64, placedLast bool) bool {
	var level, mine int64
	seq := int64(math.MaxInt64)
	for _, m := range table.Members {
		level += m.Units
		if m.Self {
			mine = m.Units
			if m.Reports && !placedLast {
				seq = m.Seq
			}
		}
	}
	all := mine+units > int64(math.Floor(target))
	holds := int64(0)
	for _, m := range table.Members {
		if m.Self || !m.Reports || !all && m.Seq > seq {
			continue
		}
		if int64(math.Floor(m.Target))-m.Units >= m.Need {
			holds += m.Need
		}
	}
	return level+units+holds <= c
}
