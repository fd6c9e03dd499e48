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
//     A fair key's weight is its own over the rate it is charged at
//     (units used per unit taken: the tokens a model reported over those
//     reserved), so that shares of units are shares of what is charged.
//  3. Shares are of concurrency, and the instances give each key what
//     its targets say only roughly (a short request's slot stands idle
//     between it and the next; a key that waits at an instance now and
//     then is not there when a unit frees): each instance counts what a
//     key was owed over the fleet, its share less the units it held (its
//     reports say the unit-seconds it held at each instance so far, so
//     what it held between two tables counts whenever they are read), and
//     moves the key's share by it, within a unit, the moves summing to
//     none.
//  4. An instance's target is the sum, over its keys, of the key's share
//     times the instance's part of the key's demand; a fair key's part
//     also scales its weight on the instance's own clock, so that the
//     keys it holds here share its target as the fleet's shares say.
//  5. The instance that reported first, if its target is below its head's
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
// acts on (effective) by owed/owedFade, within a unit or its first
// waiter's units if more: so it holds 3 units part of the time and 2 the
// rest, and 2.7 on average; and a waiter of 3 units where the target is
// 2.7 comes in once the zone was owed enough, as often as its share
// allows, not only when no other instance waits before it.
type target struct {
	units float64
	read  time.Time
	owed  float64
	at    time.Time // when owed was last brought up to date
	// others says that another instance was below its target in the
	// table, or waited short of its first waiter's units: only then do
	// this instance's waiters go without units beyond its own target, so
	// units move only to where they are owed or lacking. Two instances
	// each at its target, one with a unit in flight and a first waiter
	// of 3 (target 3.2), the other with a unit idle for its first waiter
	// of 2 (target 0.8), each kept what it held, with room for either.
	others bool
	// yields says that another instance, the first to report, is owed
	// its head's units beyond its share (see keep).
	yields bool
	// table is the set as the ledger showed it last (see targetRose).
	table fleet.Table
}

// owedFade is how long the unit-seconds a zone is owed (or owes) count.
const owedFade = 2 * time.Second

// effective is the target the zone acts on, where its first waiter needs
// head units: units moved by what it is owed, within max(1, head) either
// way.
func (t *target) effective(head int64) float64 {
	reach := float64(max(1, head))
	return t.units + max(-reach, min(reach, t.owed/owedFade.Seconds()))
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
	if t == nil || !t.others || z.clock.Now().Sub(t.read) > fleet.ReportLife {
		return 0, false
	}
	var head int64
	if r := z.asks.reports[set]; r != nil {
		head = r.head.req.cost()
	}
	return int64(math.Floor(t.effective(head) + 1e-9)), true
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
		if z.asks.keyOwed[n.set] == nil {
			z.asks.keyOwed[n.set] = map[string]*keyOwed{}
		}
		tt := targetIn(t, n.cap, z.asks.keyOwed[n.set], now)
		if !tt.shared {
			delete(z.asks.targets, n.set)
			continue
		}
		table := t
		t := z.asks.targets[n.set]
		if t == nil {
			t = &target{}
			z.asks.targets[n.set] = t
		}
		t.account(now, z.stateOf(n.set).inFlight)
		t.units, t.read, t.others, t.yields, t.table = tt.mine, now, tt.owed, tt.yields, table
		for _, f := range z.byID {
			for ; f != nil; f = f.collide {
				if p, ok := tt.parts[f.fleetKey]; ok && f.fleetKey != "" && z.vclock.reshare(f.fairKey, p) {
					z.moveBack(f.fairKey)
				}
			}
		}
	}
	for set, t := range z.asks.targets {
		if now.Sub(t.read) > fleet.ReportLife {
			delete(z.asks.targets, set)
		}
	}
	for set := range z.asks.keyOwed {
		if z.asks.targets[set] == nil {
			delete(z.asks.keyOwed, set)
		}
	}
}

// namedSet is a set a call named, and its cap.
type namedSet struct {
	set Set
	cap int64
}

// keyDemand is one key's demand in a report: the reporting member's index
// and the name it gives itself in its reports, the key's id, its weight,
// its units (waiting or in flight, smoothed) and the unit-seconds it held
// there so far.
type keyDemand struct {
	member int
	from   string
	id     string
	weight float64
	units  float64
	held   float64
	keyCap float64 // 0: none
}

// keyOwed is what a fair key was owed over the fleet: the unit-seconds it
// held below its share (above: negative), fading over keyOwedFade, as
// this instance read the tables, when it last did, and the unit-seconds
// each instance's report said it held then.
type keyOwed struct {
	owed float64
	at   time.Time
	seen map[string]float64
}

// What a key is owed fades over keyOwedFade, and moves its share by
// owedGain times its mean over that time (the units it held below its
// share, on average), within a unit either way. The move is proportional:
// where the instances give a key more than its share by some bias (a
// key's long requests granted where it comes now and then), it is left
// with 1/(1+owedGain) of it. The loop's speed is owedGain/keyOwedFade
// (0.75 a second): at 3 over 4 s a tenant of 1 s requests among tenants
// of 100 ms kept a quarter of its bias, 0.520-0.526 of the slot-seconds
// through three Caddys where its weight's share was 0.5; at 9 over 12 s,
// as fast, it keeps a tenth. A slower integral term took most of that out
// but, within a request's units, wound up now and then: a tenant of costs
// of 5 ended 0.461 for 0.5, and one of cycling costs 0.05 off.
const (
	keyOwedFade = 12 * time.Second
	owedGain    = 9
)

// tableTarget is what a table tells an instance of its target.
type tableTarget struct {
	mine   float64            // its target
	parts  map[string]float64 // its part of each of its fair keys' demand
	owed   bool               // another instance holds less than the target it reported
	shared bool               // another instance reports there
	yields bool               // another instance reported first, and is owed its head beyond its share
}

// targetIn returns what a table's set of cap c tells this instance of
// its target.
func targetIn(t fleet.Table, c int64, owedKeys map[string]*keyOwed, now time.Time) tableTarget {
	var tt tableTarget
	room := float64(c)
	self, first := -1, -1
	reach := 1.0 // a request's units: the largest head reported
	var entries []keyDemand
	for i, m := range t.Members {
		if m.Self {
			self = i
		}
		if !m.Reports {
			room -= float64(m.Units)
			continue
		}
		reach = max(reach, float64(m.Head))
		if !m.Self {
			tt.shared = true
			tt.owed = tt.owed || m.Units < int64(math.Floor(m.Target+1e-9)) || m.Need > 0
		}
		if first < 0 || m.Seq < t.Members[first].Seq {
			first = i
		}
		entries = append(entries, parseEntries(i, m.Entries)...)
	}
	if !tt.shared || self < 0 {
		return tableTarget{shared: tt.shared && self >= 0}
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
		k.units += e.units
		if e.keyCap > 0 && (k.keyCap == 0 || e.keyCap < k.keyCap) {
			k.keyCap = e.keyCap
		}
	}
	for _, k := range keys { // a key uses no more of the set than its own cap lets it
		k.demand = k.units
		if k.keyCap > 0 {
			k.demand = min(k.demand, k.keyCap)
		}
	}
	slices.Sort(ids) // every instance sums in the same order
	maxMinShares(room, ids, keys)
	moveShares(ids, keys, entries, owedKeys, reach, now)
	targets := make([]float64, len(t.Members))
	tt.parts = map[string]float64{}
	for _, e := range entries {
		k := keys[e.id]
		if k.units <= 0 {
			continue
		}
		targets[e.member] += k.owedShare * e.units / k.units
		if e.member == self && !strings.HasPrefix(e.id, "-") && k.share > 0 {
			tt.parts[e.id] = e.units / k.units * k.owedShare / k.share
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
		tt.yields = self != first
	}
	tt.mine = targets[self]
	return tt
}

// fleetKey is a key being shared: its weight, its units waiting or in
// flight over the fleet, its own cap (0: none), its demand (its units,
// within its cap), its share, and its share moved by what it is owed.
type fleetKey struct {
	weight, units, keyCap, demand, share, owedShare float64
}

// moveShares brings what each fair key is owed up to date, as it held
// units since the last table, and moves its share by it (see
// keyOwedFade): the shares are of concurrency, and a key whose requests
// the instances serve less well than their targets say (short ones, whose
// slots stand idle between them; those at an instance where it waits now
// and then) is owed the difference, over the fleet; one served better
// (long ones, granted where it comes now and then) owes it. What it held
// is what each report's unit-seconds grew by since the last table: so it
// counts whenever the tables are read (a snapshot of its units, read at
// the calls, which follow releases, would count it low). A report new
// since then counts from now on; one whose count fell made its entry
// afresh, and counts what it says. The moves sum to none, so the targets
// still share the room.
func moveShares(ids []string, keys map[string]*fleetKey, entries []keyDemand, owedKeys map[string]*keyOwed, reach float64, now time.Time) {
	var moves float64
	var moved int
	for _, id := range ids {
		k := keys[id]
		k.owedShare = k.share
		if strings.HasPrefix(id, "-") || k.weight == 0 {
			continue
		}
		o := owedKeys[id]
		if o == nil {
			o = &keyOwed{at: now}
			owedKeys[id] = o
		}
		if dt := now.Sub(o.at).Seconds(); dt > 0 || o.seen == nil {
			var held float64
			seen := map[string]float64{}
			for _, e := range entries {
				if e.id != id || e.from == "" {
					continue
				}
				seen[e.from] = e.held
				if last, ok := o.seen[e.from]; ok {
					held += e.held - last
					if e.held < last {
						held += last
					}
				}
			}
			if o.seen != nil {
				fade := math.Exp(-dt / keyOwedFade.Seconds())
				o.owed = o.owed*fade + (k.share*dt-held)/dt*keyOwedFade.Seconds()*(1-fade)
			}
			o.seen, o.at = seen, now
		}
		k.owedShare += max(-reach, min(reach, owedGain*o.owed/keyOwedFade.Seconds()))
		moves += k.owedShare - k.share
		moved++
	}
	for id := range owedKeys {
		if k := keys[id]; k == nil || k.weight == 0 {
			delete(owedKeys, id)
		}
	}
	for _, id := range ids {
		if k := keys[id]; moved > 0 && !strings.HasPrefix(id, "-") && k.weight > 0 {
			k.owedShare = max(0, k.owedShare-moves/float64(moved))
		}
	}
}

// maxMinShares shares room among keys by weighted max-min: no key gets more
// than its demand, and the others share what is left in proportion to
// their weights. A key of weight 0 waits nowhere: it keeps the units it
// holds.
func maxMinShares(room float64, ids []string, keys map[string]*fleetKey) {
	active := make([]string, 0, len(ids))
	for _, id := range ids {
		switch k := keys[id]; {
		case k.weight == 0:
			k.share = k.demand
			room -= k.demand
		case k.demand > 0:
			active = append(active, id)
		}
	}
	room = max(0, room)
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
	var from string
	for part := range strings.SplitSeq(s, ";") {
		if name, ok := strings.CutPrefix(part, "@"); ok {
			from = name
			continue
		}
		f := strings.Fields(part)
		if len(f) != 4 && len(f) != 5 {
			continue
		}
		var keyCap float64
		if len(f) == 5 {
			c, err := strconv.ParseFloat(f[4], 64)
			if err != nil || !(c > 0) || math.IsInf(c, 0) {
				continue
			}
			keyCap = c
		}
		w, err1 := strconv.ParseFloat(f[1], 64)
		u, err2 := strconv.ParseFloat(f[2], 64)
		h, err3 := strconv.ParseFloat(f[3], 64)
		if err1 != nil || err2 != nil || err3 != nil || !(w >= 0) || !(u >= 0) || !(h >= 0) || math.IsInf(w, 0) || math.IsInf(u, 0) || math.IsInf(h, 0) {
			continue
		}
		id := f[0]
		if id == "-" {
			id = "-" + strconv.Itoa(member)
		}
		out = append(out, keyDemand{member: member, from: from, id: id, weight: w, units: u, held: h, keyCap: keyCap})
	}
	return out
}
