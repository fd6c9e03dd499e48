package limiter

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/fleet"
)

// A zone with a ledger reports the sets its waiters need from the fleet:
// those the fleet refused a waiter's head by since it started waiting (so
// that the room it was owed in one stays held while it waits for
// another), and those where another instance waits too (Tight) that a
// waiter here needs. A report tells
// the units of the first waiter needing the set (its head), the zone's
// target there (target.go), and its demand by key: for each fair key
// waiting, its weight and its units waiting or in flight here; for the
// rest, one entry whose weight is its demand. Every instance reads the
// others' reports in its calls' tables, and computes from them the same
// targets: so the fleet's fair arithmetic lives here, once, and the
// ledger only keeps the reports current and the holds they make.
//
// A report lives in the ledger for fleet.ReportLife: the zone sends it again with
// every call, and at least every fleetPoll, and withdraws it (Head 0) once
// no waiter needs the set.

// reported is a set the zone reports on: its name, its cap, and the head
// it last reported (another head takes a new place).
type reported struct {
	name string
	cap  int64
	head *waiter
	need int64 // the units head lacks beyond the idle allowance here
	// target is the target reported: a report is sent again when its
	// whole units move, so that the others see at once whom the ledger
	// holds room for.
	target float64
	sent   time.Time
	moved  bool // its target had moved when it was sent
}

// targetResend is how soon after a report that moved its target another
// move alone makes it due again (see reportsFor).
const targetResend = fleetPoll / 16

// reportsFor returns the reports of the next call, by the queue order:
// those due (the sets reported changed, or fleetPoll passed), or all if
// the call is made anyway. A move of a target alone makes them due at
// once, unless the report sent last moved it too, within targetResend: a
// target is read from the calls' tables, and where a key's requests
// carry different caps, a table read under one waiter's cap in a call and
// another's in the next moved the target across a unit each time, and
// each move made a call (a report, or the wants and write backs the new
// target made) that moved it back, a call per round trip for ever. mu
// must be held.
func (z *Zone) reportsFor(order []*waiter, now time.Time, anyway bool) []fleet.Report {
	cur := z.reportedSets(order)
	due := anyway || len(cur) != len(z.asks.reports)
	for set, r := range z.asks.reports {
		c := cur[set]
		if c == nil || c.head != r.head || c.need != r.need || now.Sub(r.sent) >= fleetPoll ||
			math.Floor(c.target) != math.Floor(r.target) && !(r.moved && now.Sub(r.sent) < targetResend) {
			due = true
		}
	}
	if !due {
		return nil
	}
	var out []fleet.Report
	for set, r := range z.asks.reports {
		if cur[set] == nil {
			out = append(out, fleet.Report{Set: r.name})
			endTurns(set, order)
		}
	}
	for set, c := range cur {
		old := z.asks.reports[set]
		if old != nil && math.Floor(c.target) > math.Floor(old.target) {
			z.targetRose(set, c, old.head != c.head, order, now)
		}
		c.sent, c.moved = now, old != nil && math.Floor(c.target) != math.Floor(old.target)
		out = append(out, fleet.Report{Set: c.name, New: old != nil && old.head != c.head, Head: c.head.req.cost(), Need: c.need,
			Target: c.target, Entries: z.entries(set, order)})
	}
	z.asks.reports = cur
	return out
}

// endTurns ends the turn of the waiting flows the fleet turned down by
// set (see turnedDown), which is reported no more: each is asked for
// again when it next needs the fleet. A turned-down flow waits for the
// ledger's notice that room came back there, and with no report none
// comes: it waited for the poll with that room free (a cap here had
// refused its flow meanwhile, which stops it reporting). mu must be held.
func endTurns(set Set, order []*waiter) {
	for _, w := range order {
		if f := w.flow; f.fleetSet != nil && *f.fleetSet == set {
			f.turned = time.Time{}
		}
	}
}

// targetRose asks again, in the asker's next call, for the flows the
// fleet turned down by set whose heads now fit in this instance's target
// there, as c reports it (placedLast: at a new place): a want within its
// instance's target counts only the holds of the instances that reported
// before it (see the Holds rule in internal/fleetref), so the refusal
// may no longer hold, and no notice says so. Targets can swing up and
// down as tables come in, even within an instant, so a flow is asked for
// again this way once per fleetPoll at most, and once more where the
// ledger's latest table shows it granted now (grantsIn): else it could
// be asked for, refused and asked for again at every call, with the
// clock standing still (a table read under one waiter's cap shows a
// grant, and the call that asks carries the target read under the
// other's); and, asked once a poll alone, a head whose target rose again
// within the poll, granted by the ledger had it asked, waited for the
// poll with the fleet's room free. mu must be held.
func (z *Zone) targetRose(set Set, c *reported, placedLast bool, order []*waiter, now time.Time) {
	t := math.Floor(c.target)
	for _, w := range order {
		f := w.flow
		if w != f.holder() || f.turned.IsZero() || f.fleetSet == nil || *f.fleetSet != set {
			continue
		}
		if t < float64(z.stateOf(set).inFlight+z.unitsOf(f)) {
			continue
		}
		switch {
		case now.Sub(f.rose) >= fleetPoll:
			f.rose = now
		case now.Sub(f.roseShown) >= fleetPoll && z.grantedNow(set, w, c.target, placedLast):
			f.roseShown = now
		default:
			continue
		}
		f.turned = f.turned.Add(-fleetPoll) // due now (see turnedDown)
	}
}

// grantedNow reports whether the ledger's latest table of set shows w's
// want there granted now, under w's own cap (a key's requests may carry
// different caps) and this instance's target reported there.
func (z *Zone) grantedNow(set Set, w *waiter, target float64, placedLast bool) bool {
	tg := z.asks.targets[set]
	if tg == nil || len(tg.table.Members) == 0 {
		return false
	}
	c := z.limitsFor(w.req).capOf(w.req, set.Dim, true)
	return grantsIn(tg.table, c, z.fleetNeed(w, set), target, placedLast)
}

// reportsMoved wakes the asker, if the zone reports, after a waiter
// left the queue: it may have been a head, and the room the ledger holds
// for it is to go to the other instances now, not at the next poll (a
// request there that does not wait was refused meanwhile, with the fleet
// below the cap). mu must be held.
func (z *Zone) reportsMoved() {
	if len(z.asks.reports) > 0 {
		z.startAsking()
	}
}

// waiterLeft is reportsMoved for a waiter that left the queue
// unadmitted, and asks the fleet again for the waiters it turned down:
// a waiting want the fleet refused held its sets against its call's
// later wants, so a waiter after it was turned down by room that is free
// now, and would not ask again before the next poll. mu must be held.
func (z *Zone) waiterLeft() {
	if z.ledger != nil {
		z.asks.changed = true
	}
	z.reportsMoved()
}

// reportedSets returns the sets to report on, each with its head: the
// first waiter in order that needs it. mu must be held.
func (z *Zone) reportedSets(order []*waiter) map[Set]*reported {
	cur := map[Set]*reported{}
	for _, w := range order {
		f := w.flow
		asks := w.short || f.asks
		if !w.short && w != f.holder() {
			continue
		}
		lim := z.limitsFor(w.req)
		for _, set := range z.setsOf(w.req) {
			if _, ok := cur[set]; ok {
				continue
			}
			name := z.nameOf(w.req, set.Dim)
			if asks && (f.fleetSet != nil && *f.fleetSet == set || containsDim(f.refused, set.Dim)) || z.ledger.Tight(name) {
				cur[set] = &reported{name: name, cap: lim.capOf(w.req, set.Dim, true)}
			}
		}
	}
	for _, w := range order { // the head of each: the first that needs it
		for _, set := range z.setsOf(w.req) {
			if r := cur[set]; r != nil && r.head == nil {
				r.head, r.need = w, max(0, w.req.cost()-max(0, z.stateOf(set).idle()))
				if z.yieldsElsewhere(w, set) {
					r.need = 0
				}
				r.target = z.reportedTarget(set, r)
			}
		}
	}
	return cur
}

// yieldsElsewhere reports whether w, a head, was refused by the fleet in
// another set than set, where this instance is beyond its target with w:
// it cannot come in before this instance's own units there end, so the
// ledger holds no room for it in set meanwhile, and this instance keeps
// no idle units of set for it (keep). Held, that room stood
// idle where another instance's head, itself refused nowhere else but
// there, yielded to it: two instances each beyond its target in one of
// two sets their heads both need held each other out, with room in both.
// mu must be held.
func (z *Zone) yieldsElsewhere(w *waiter, set Set) bool {
	f := w.flow
	if f.fleetSet == nil || *f.fleetSet == set || f.turned.IsZero() {
		return false
	}
	t, ok := z.targetOf(*f.fleetSet)
	return ok && z.stateOf(*f.fleetSet).units+w.req.cost() > t
}

// reportedTarget is the target the zone reports on set: the latest it
// computed, or, before any, what it holds plus its head's units.
func (z *Zone) reportedTarget(set Set, r *reported) float64 {
	if t := z.asks.targets[set]; t != nil {
		return t.effective(r.head.req.cost())
	}
	return float64(z.stateOf(set).inFlight + r.head.req.cost())
}

// entries is the zone's demand in set, by key, as a report carries it:
// "@self" (the zone's name in reports: see moveShares), then
// "id weight units held [cap]" per key (held: the unit-seconds it held
// here so far, of which readers count what it held between two tables;
// cap: in another set than its key's own, the key's cap, which bounds
// what it can use of this one), ";" between them. A fair key's id is its
// set's name (the same on every instance); the rest is "-". mu must be
// held.
func (z *Zone) entries(set Set, order []*waiter) string {
	type demand struct {
		weight float64
		units  int64
		held   float64
		keyCap int64
	}
	byKey := map[string]*demand{}
	now := z.clock.Now()
	var ids []string
	rest := z.stateOf(set).inFlight
	var restWaiting int64
	var fairDims []int
	for _, w := range order {
		if !z.needs(w.req, set) {
			continue
		}
		f := w.flow
		if !f.fair {
			restWaiting += w.req.cost()
			continue
		}
		if f.fleetKey == "" {
			f.fleetKey = setName(f.keyDim, w.req.Keys[f.keyDim])
		}
		if !slices.Contains(fairDims, f.keyDim) {
			fairDims = append(fairDims, f.keyDim)
		}
		d := byKey[f.fleetKey]
		if d == nil {
			inFlight, held := z.keyUnits(f.keyDim, f.hashes[f.keyDim], now)
			d = &demand{weight: f.weight / z.vclock.rate(f.fairKey), units: inFlight, held: held}
			if set.Dim != f.keyDim {
				d.keyCap = z.limitsFor(w.req).capOf(w.req, f.keyDim, true)
			}
			rest -= inFlight
			byKey[f.fleetKey] = d
			ids = append(ids, f.fleetKey)
		}
		d.units += w.req.cost()
	}
	for _, d := range fairDims { // the fair keys in flight here with no waiter here
		z.eachKeyInFlight(d, now, func(name string, units int64, held float64) {
			if byKey[name] == nil {
				byKey[name] = &demand{units: units, held: held}
				rest -= units
				ids = append(ids, name)
			}
		})
	}
	var b strings.Builder
	b.WriteString("@" + z.asks.self)
	for _, id := range ids {
		d := byKey[id]
		writeEntry(&b, id, d.weight, z.smooth(set, id, float64(d.units), now), d.held, d.keyCap)
	}
	if n := max(0, rest) + restWaiting; n > 0 {
		d := z.smooth(set, "-", float64(n), now)
		writeEntry(&b, "-", d, d, 0, 0) // its held is never read: not one key
	}
	return b.String()
}

// demandFade is how long a key's demand takes to count, as it is
// smoothed: the units waiting and in flight at one instance come and go
// with each request, and targets that followed them would move units
// between instances for nothing.
const demandFade = time.Second

// smoothed is a key's demand in a set, smoothed, and when it was last
// brought up to date.
type smoothed struct {
	units float64
	at    time.Time
}

// smooth brings the smoothed demand of key id in set up to date with
// units at now, and returns it. mu must be held.
func (z *Zone) smooth(set Set, id string, units float64, now time.Time) float64 {
	k := demandKey{set, id}
	d := z.asks.demand[k]
	if d == nil {
		if len(z.asks.demand) >= 4096 { // forget keys no report carried lately
			for k, d := range z.asks.demand {
				if now.Sub(d.at) > 10*demandFade {
					delete(z.asks.demand, k)
				}
			}
		}
		d = &smoothed{units: units, at: now}
		z.asks.demand[k] = d
		return units
	}
	if dt := now.Sub(d.at); dt > 10*demandFade {
		d.units = units
	} else {
		d.units += (units - d.units) * (1 - math.Exp(-dt.Seconds()/demandFade.Seconds()))
	}
	d.at = now
	return d.units
}

// demandKey is a key's demand in a set.
type demandKey struct {
	set Set
	id  string
}

func writeEntry(b *strings.Builder, id string, weight, units, held float64, keyCap int64) {
	if b.Len() > 0 {
		b.WriteByte(';')
	}
	b.WriteString(id)
	b.WriteByte(' ')
	b.WriteString(strconv.FormatFloat(weight, 'g', 6, 64))
	b.WriteByte(' ')
	b.WriteString(strconv.FormatFloat(units, 'g', 6, 64))
	b.WriteByte(' ')
	b.WriteString(strconv.FormatFloat(held, 'g', 6, 64))
	if keyCap > 0 {
		b.WriteByte(' ')
		b.WriteString(strconv.FormatInt(keyCap, 10))
	}
}

// needs reports whether req needs set.
func (z *Zone) needs(req *Request, set Set) bool {
	if set.Dim == TotalDim {
		return z.hasTotal
	}
	return set.Dim < len(req.Keys) && req.Keys[set.Dim] != "" && z.hash(req, set.Dim) == set.Hash
}

// eachKeyInFlight calls fn with the name, units in flight and
// unit-seconds held by now of each key of dimension d that holds an
// allowance here and held units within fleet.ReportLife.
func (z *Zone) eachKeyInFlight(d int, now time.Time, fn func(name string, units int64, held float64)) {
	z.eachKeyAllowance(d, func(s *shard, h uint64, a *allowance) {
		if n := s.count(h); n > 0 || now.UnixNano()-a.heldAt < int64(fleet.ReportLife) {
			fn(a.name, n, a.heldSecsAt(now.UnixNano(), n))
		}
	})
}

// keyUnits returns the units in flight of dimension d's key of hash h,
// and its unit-seconds held here by now.
func (z *Zone) keyUnits(d int, h uint64, now time.Time) (int64, float64) {
	s := z.shardOf(d, h)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.count(h)
	if a := s.allowanceOf(h); a != nil {
		return n, a.heldSecsAt(now.UnixNano(), n)
	}
	return n, 0
}
