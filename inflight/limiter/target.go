package limiter

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/fleet"
)

// Where instances wait for the same set, each has a target there: its
// share of the set's cap, from the reports of every instance (report.go),
// computed alike by each. A share of concurrency in proportion to weight
// is a share of unit-seconds in proportion to weight, so fairness across
// the fleet is an allocation:
//
//  1. The room to share is the cap less the units of the instances that do
//     not report (they have no waiters there).
//  2. It is shared among the keys waiting anywhere by weighted max-min
//     (water-filling): a key takes at most its demand (its units waiting or
//     in flight, over the fleet), the rest goes on to the others in
//     proportion to their weights. A fair key is one key wherever it
//     waits; each instance's other demand ("-") is a key of its own, of
//     weight its demand, so without fair the room goes in proportion to
//     the units each instance waits for.
//  3. An instance's target is the sum, over its keys, of the key's share
//     times the instance's part of the key's demand; a fair key's part
//     also scales its weight on the instance's own clock, so that the
//     keys it holds here share its target as the fleet's shares say.
//  4. The instance that reported first, if its target is below its head's
//     units, gets those units, and the others' targets shrink to make
//     room: a request bigger than one instance's share is admitted, as
//     the ledger holds the room it is owed while the units of the others
//     (reporting or not) end.
//
// An instance keeps idle units for its own waiters only up to its target
// (keep), and the ledger holds, for each instance under its target, the
// room it is owed against the instances that reported after it: so units
// move from the instances above their target to those below.

// target is the zone's target in one set, as computed from the latest
// table, and when that was read. A target is rarely whole (2.7 units),
// and units are: owed counts the unit-seconds the zone held below it
// (above: negative), fading over owedFade, and moves the target the zone
// acts on (effective) by owed/owedFade, within a unit: so it holds 3 units
// part of the time and 2 the rest, and 2.7 on average.
type target struct {
	units float64
	read  time.Time
	owed  float64
	at    time.Time // when owed was last brought up to date
	// others says that another instance was below its target in the
	// table: only then do this instance's waiters go without units
	// beyond its own target, so units move only to where they are owed.
	others bool
}

// owedFade is how long the unit-seconds a zone is owed (or owes) count.
const owedFade = 2 * time.Second

// effective is the target the zone acts on: units moved by what it is
// owed, within a unit either way.
func (t *target) effective() float64 {
	return t.units + max(-1, min(1, t.owed/owedFade.Seconds()))
}

// account brings what the zone is owed up to date at now, as it held
// inFlight units since the last time.
func (t *target) account(now time.Time, inFlight int64) {
	if dt := now.Sub(t.at).Seconds(); dt > 0 && !t.at.IsZero() {
		fade := math.Exp(-dt / owedFade.Seconds())
		t.owed = t.owed*fade + (t.units-float64(inFlight))*owedFade.Seconds()*(1-fade)
	}
	t.at = now
}

// targetOf returns the zone's effective target in set, in whole units,
// if the fleet has told it one lately and another instance is owed units
// there.
func (z *Zone) targetOf(set Set) (int64, bool) {
	t := z.asks.targets[set]
	if t == nil || !t.others || z.clock.Now().Sub(t.read) > fleet.Listing {
		return 0, false
	}
	return int64(math.Floor(t.effective() + 1e-9)), true
}

// readTables computes the zone's targets from a call's tables, where
// another instance reports too, and each fair flow's part of its key's
// demand. named gives each table's set and cap. mu must be held.
func (z *Zone) readTables(tables []fleet.Table, named map[string]namedSet, now time.Time) {
	for _, t := range tables {
		n, ok := named[t.Set]
		if !ok {
			continue
		}
		units, parts, others, shared := targetIn(t, n.cap)
		if !shared {
			delete(z.asks.targets, n.set)
			continue
		}
		t := z.asks.targets[n.set]
		if t == nil {
			t = &target{}
			z.asks.targets[n.set] = t
		}
		t.account(now, z.stateOf(n.set).inFlight)
		t.units, t.read, t.others = units, now, others
		for _, f := range z.byID {
			for ; f != nil; f = f.collide {
				if p, ok := parts[f.fleetKey]; ok && f.fleetKey != "" {
					f.share = p
				}
			}
		}
	}
	for set, t := range z.asks.targets {
		if now.Sub(t.read) > fleet.Listing {
			delete(z.asks.targets, set)
		}
	}
}

// namedSet is a set a call named, and its cap.
type namedSet struct {
	set Set
	cap int64
}

// keyDemand is one key's demand in a report: the reporting member's index,
// the key's id, its weight and its units.
type keyDemand struct {
	member int
	id     string
	weight float64
	units  float64
}

// targetIn returns this instance's target in a table's set of cap c, its
// part of each of its fair keys' demand, and whether another instance
// holds less than the target it reported (owed); shared is false if no
// other instance reports there.
func targetIn(t fleet.Table, c int64) (mine float64, parts map[string]float64, owed, shared bool) {
	room := float64(c)
	self, first := -1, -1
	var entries []keyDemand
	for i, m := range t.Members {
		if m.Self {
			self = i
		}
		if !m.Reports {
			room -= float64(m.Units)
			continue
		}
		if !m.Self {
			shared = true
			owed = owed || m.Units < int64(math.Floor(m.Target+1e-9))
		}
		if first < 0 || m.Seq < t.Members[first].Seq {
			first = i
		}
		entries = append(entries, parseEntries(i, m.Entries)...)
	}
	if !shared || self < 0 {
		return 0, nil, false, shared && self >= 0
	}
	room = max(0, room)
	keys := map[string]*fleetKey{}
	var ids []string
	for _, e := range entries {
		k := keys[e.id]
		if k == nil {
			k = &fleetKey{}
			keys[e.id] = k
			ids = append(ids, e.id)
		}
		k.weight = max(k.weight, e.weight)
		k.demand += e.units
	}
	slices.Sort(ids) // every instance sums in the same order
	maxMinShares(room, ids, keys)
	targets := make([]float64, len(t.Members))
	parts = map[string]float64{}
	for _, e := range entries {
		k := keys[e.id]
		if k.demand <= 0 {
			continue
		}
		targets[e.member] += k.share * e.units / k.demand
		if e.member == self && !strings.HasPrefix(e.id, "-") {
			parts[e.id] = e.units / k.demand
		}
	}
	if head := float64(t.Members[first].Head); targets[first] < head {
		need := head // even beyond the room: the ledger holds it as the others' units end
		if rest := room - targets[first]; rest > 0 {
			scale := max(0, room-need) / rest
			for i := range targets {
				targets[i] *= scale
			}
		}
		targets[first] = need
	}
	return targets[self], parts, owed, true
}

// fleetKey is a key being shared: its weight, its demand over the fleet,
// and its share.
type fleetKey struct {
	weight, demand, share float64
}

// maxMinShares shares room among keys by weighted max-min: no key gets more
// than its demand, and the others share what is left in proportion to
// their weights.
func maxMinShares(room float64, ids []string, keys map[string]*fleetKey) {
	active := make([]string, 0, len(ids))
	for _, id := range ids {
		if k := keys[id]; k.weight > 0 && k.demand > 0 {
			active = append(active, id)
		}
	}
	for len(active) > 0 {
		var sum float64
		for _, id := range active {
			sum += keys[id].weight
		}
		level := room / sum
		next := active[:0]
		for _, id := range active {
			if k := keys[id]; k.demand <= k.weight*level {
				k.share = k.demand
				room -= k.demand
			} else {
				next = append(next, id)
			}
		}
		if len(next) == len(active) {
			for _, id := range active {
				keys[id].share = keys[id].weight * level
			}
			return
		}
		active = next
	}
}

// parseEntries reads a report's entries (see entries); the rest, "-", is
// a key of the member's own.
func parseEntries(member int, s string) []keyDemand {
	var out []keyDemand
	for part := range strings.SplitSeq(s, ";") {
		f := strings.Fields(part)
		if len(f) != 3 {
			continue
		}
		w, err1 := strconv.ParseFloat(f[1], 64)
		u, err2 := strconv.ParseFloat(f[2], 64)
		if err1 != nil || err2 != nil || !(w > 0) || !(u >= 0) || math.IsInf(w, 0) || math.IsInf(u, 0) {
			continue
		}
		id := f[0]
		if id == "-" {
			id = "-" + strconv.Itoa(member)
		}
		out = append(out, keyDemand{member: member, id: id, weight: w, units: u})
	}
	return out
}
