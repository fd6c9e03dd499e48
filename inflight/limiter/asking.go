package limiter

import (
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/fleet"
)

// A zone with a ledger makes its calls one at a time, from one goroutine
// of its own (the asker), while it has anything to send: requests short of
// allowance (waiters, in the queue order, then requests that do not wait,
// in their order of arrival, which wait only for the call's answer),
// allowance to write back, reports of its waiters (see report.go), and
// every allowance it holds to write again (renewal, every Lease/3, and
// after a call that got no answer). A request that arrives while a call is
// under way goes in the next one, so a busy zone makes one call per round
// trip whatever its rate. Waiters the fleet refused are asked for again
// when the ledger announces a change, and at least every fleetPoll.
//
// What a call granted for its waiters goes to them in the queue order (see
// dispatch): a waiter better than the one it was granted for takes it
// first. A newcomer the fleet granted is admitted at once, with the
// allowance granted for it.

// asking is the state of a zone's calls. Guarded by the zone's mu.
type asking struct {
	running bool          // the asker runs
	wake    chan struct{} // something new to send
	// changed says the fleet changed since the last call: every waiter
	// that needs allowance is asked for again, not only those new to it.
	changed   bool
	newcomers []*newcomer
	// dirty are the allowances to write back, each by when: at once
	// where another instance may wait for the units, else within the
	// last call's round trip (linger at most), or sooner with a call
	// made anyway (a request that comes meanwhile asks in the same call).
	dirty map[Set]time.Time
	took  time.Duration // the last call's round trip
	// rewrite lists every allowance to write again, and renewed is when
	// the last such round started.
	rewrite []Set
	renewed time.Time
	// answered is when the ledger last answered a call: past half a
	// lease without one, the allowances it kept may lapse there (see
	// lapse).
	answered time.Time
	// unsure are the sets of the wants of a call that got no answer: what
	// its script may have granted there is written back to what the zone
	// holds (nothing, where it holds no allowance).
	unsure map[string]Set
	epoch  uint64 // the ledger's epoch when the zone last wrote all it holds
	// reports are the sets the zone reports on (see report.go).
	reports map[Set]*reported
	swept   int64  // when sweep last ran, on the zone's clock (unix nanoseconds)
	capsGen uint64 // counts the changes of caps (see capsChanged)
	// targets are its targets where other instances wait too (target.go),
	// and demand its keys' demand in the sets it reports on, smoothed.
	targets map[Set]*target
	demand  map[demandKey]*smoothed
	// keyOwed is what each fair key was owed over the fleet, by set.
	keyOwed map[Set]map[string]*keyOwed
	// self names this instance in its reports' entries, for as long as
	// the zone lives (see moveShares).
	self   string
	closed atomic.Bool // the zone is no longer used: keep no idle allowance
}

// newcomer is a request that arrived short of allowance: the next call
// decides it, before it waits if it may (waits).
type newcomer struct {
	req   *Request
	waits bool
	done  chan Result
}

// maxWrites bounds the writes of one call, so that no call holds the
// ledger for long: a renewal of more goes over several calls.
const maxWrites = 512

// SetLedger makes l the zone's ledger: from then on it admits within the
// allowances l grants. Call it once, before the zone admits anything.
func (z *Zone) SetLedger(l Ledger) {
	z.ledger = l
	z.asks.wake = make(chan struct{}, 1)
	z.asks.dirty = map[Set]time.Time{}
	z.asks.unsure = map[string]Set{}
	z.asks.reports = map[Set]*reported{}
	z.asks.targets = map[Set]*target{}
	z.asks.demand = map[demandKey]*smoothed{}
	z.asks.keyOwed = map[Set]map[string]*keyOwed{}
	z.asks.self = strconv.FormatUint(rand.Uint64(), 36)
	z.asks.renewed = z.clock.Now()
	z.asks.answered = z.asks.renewed
	z.asks.epoch = l.Epoch()
}

// askFor has the asker decide req, a newcomer short of allowance, in its
// next call; waits says it waits if refused. mu must be held; askFor
// releases it.
func (z *Zone) askFor(req *Request, waits bool) Result {
	n := &newcomer{req: req, waits: waits, done: make(chan Result, 1)}
	z.asks.newcomers = append(z.asks.newcomers, n)
	z.startAsking()
	z.mu.Unlock()
	return <-n.done
}

// startAsking wakes the asker, started if it does not run. mu must be
// held.
func (z *Zone) startAsking() {
	if !z.asks.running {
		z.asks.running = true
		go z.asker()
	}
	select {
	case z.asks.wake <- struct{}{}:
	default:
	}
}

// giveBackLater takes units off set's idle allowance, to be written back
// (see asking.dirty), and keeps spare idle there from now on. mu must be
// held.
func (z *Zone) giveBackLater(set Set, units, spare int64) {
	if units <= 0 {
		return
	}
	now := z.clock.Now()
	due := now
	if !z.filed(set.blocker()) && !z.ledger.Tight(z.stateOf(set).name) && !z.asks.closed.Load() {
		due = now.Add(min(z.asks.took, linger))
	}
	z.shrink(set, units, spare)
	if was, ok := z.asks.dirty[set]; !ok || due.Before(was) {
		z.asks.dirty[set] = due
	}
	z.startAsking()
}

// asker makes the zone's calls while it has anything to send or to keep.
func (z *Zone) asker() {
	for {
		z.mu.Lock()
		select {
		case <-z.ledger.Changed(): // announced while a call was under way
			z.asks.changed = true
			z.asks.swept = 0 // the next wait sweeps, whenever the last one was
		default:
		}
		c, st := z.nextCall()
		if c == nil {
			if z.asks.closed.Load() {
				z.sweep(z.clock.Now().UnixNano()) // forgets what was written back
			}
			if !z.askerHasWork() {
				z.asks.running = false
				z.mu.Unlock()
				return
			}
			poll := z.pollEvery(z.clock.Now())
			z.mu.Unlock()
			z.waitForWork(poll)
			continue
		}
		z.mu.Unlock()
		start := z.clock.Now()
		err := z.ledger.Ask(c)
		z.mu.Lock()
		z.asks.took = z.clock.Now().Sub(start)
		z.answer(c, st, err)
		z.mu.Unlock()
		if err != nil { // not again at once: at the next request, announcement or poll
			z.waitForWork(fleetPoll)
		}
	}
}

// pollEvery is how long the asker waits at now for news before it looks
// again: fleetPoll while it reports (to renew the reports and ask again),
// else linger (to give back what no request uses); sooner if a write
// back is due. mu must be held.
func (z *Zone) pollEvery(now time.Time) time.Duration {
	poll := linger
	if len(z.asks.reports) > 0 || z.wanting() {
		poll = fleetPoll
	}
	for _, due := range z.asks.dirty {
		poll = max(0, min(poll, due.Sub(now)))
	}
	return poll
}

// waitForWork waits for something new: a request to ask for, a change
// the ledger announces, the poll, the renewal and the sweep of idle
// allowance.
func (z *Zone) waitForWork(poll time.Duration) {
	timer, stop := z.clock.After(poll)
	defer stop()
	changed := false
	select {
	case <-z.asks.wake:
		return
	case <-z.ledger.Changed():
		changed = true
	case <-timer:
	}
	z.mu.Lock()
	z.asks.changed = true
	// A sweep walks every allowance the zone holds, an entry for each key
	// used in the last keepUnused. Write-backs come due every round trip,
	// so a poll sweeps at most every linger; an announcement, at once
	// (another instance may wait for idle units).
	if now := z.clock.Now().UnixNano(); changed || now-z.asks.swept >= int64(linger) {
		z.sweep(now)
	}
	z.mu.Unlock()
}

// askerHasWork reports whether the asker has to stay: waiters want
// allowance or are reported, or the zone holds allowance (to renew and
// sweep). mu must be held.
func (z *Zone) askerHasWork() bool {
	return z.wanting() || len(z.asks.reports) > 0 || len(z.asks.dirty) > 0 || len(z.asks.unsure) > 0 || z.holdsAllowance()
}

// Reopen undoes Close: the zone is used again.
func (z *Zone) Reopen() { z.asks.closed.Store(false) }

// Close gives back the zone's idle allowance, and keeps none from then
// on: the zone is no longer used. The requests still in flight give
// theirs back as they end.
func (z *Zone) Close() {
	if z.ledger == nil {
		return
	}
	z.mu.Lock()
	z.asks.closed.Store(true)
	z.sweep(z.clock.Now().UnixNano())
	if z.asks.running {
		z.startAsking() // to forget what it holds, and end
	}
	z.mu.Unlock()
}

// wanting reports whether waiters want allowance. mu must be held.
func (z *Zone) wanting() bool {
	if len(z.short) > 0 {
		return true
	}
	for _, f := range z.byID {
		for ; f != nil; f = f.collide {
			if f.asks {
				return true
			}
		}
	}
	return false
}

// fleetKeyFull reports whether the fleet refused f's head by one of its
// keys since it was last short, and this instance's allowance there still
// cannot cover it: a tenant at its cap over the fleet, which cannot take
// the total's room before one of its own requests ends (here: then the
// units it gave back are its own to take).
func (z *Zone) fleetKeyFull(f *flow) bool {
	if f.turned.IsZero() || f.fleetSet == nil || f.fleetSet.Dim == TotalDim {
		return false
	}
	return z.stateOf(*f.fleetSet).idle() < z.unitsOf(f)
}

// asked is what the zone knows of a call's want: the waiter or newcomer
// it asks for, its sets, and this instance's share of their caps (for a
// fallback).
type asked struct {
	w      *waiter
	n      *newcomer
	sets   []Set
	shares []int64
}

// sent is what the zone knows of a call under way: whom each want is
// for, and the sets its tables may name.
type sent struct {
	asked  []asked
	named  map[string]namedSet
	writes []Set  // the set of each write
	gen    uint64 // the zone's capsGen when the call was made
}

// nextCall returns the call to make now; nil if there is nothing to
// send. mu must be held.
func (z *Zone) nextCall() (*fleet.Call, *sent) {
	now := z.clock.Now()
	c := &fleet.Call{}
	st := &sent{named: map[string]namedSet{}, gen: z.asks.capsGen}
	st.writes = z.writes(c, now)
	order := z.order(now)
	c.Wants = make([]fleet.Want, 0, len(z.asks.newcomers))
	if len(z.asks.rewrite) > 0 { // what it holds is written first, alone
		st.writes = z.dirtyWrites(c, now, true, st.writes)
		return c, st
	}
	// Every waiter that needs the fleet counts on the idle units in the
	// queue order, asked for or not: a waiter does not ask for what a
	// better one takes. The short waiters take the short waiters' places
	// in it in their one order, the order admitShort admits them in: in
	// the queue order's, one that admitShort puts first could find the
	// idle units counted for those after it, ask the fleet for units it
	// cannot get, and hold its room against them, and the zone then sat
	// on idle allowance while they waited, for minutes. The room the
	// holders hold is taken from what the waiters after them count on,
	// but for the short waiters': those count as admitted at their turns
	// (see reservation.pending). A waiter the fleet refused by a key its
	// allowance cannot cover (fleetKeyFull) counts on the idle units
	// without taking them, as it cannot take them here (see keysFit):
	// taken, they stood idle while another instance's head, first in that
	// key, waited for them in the call's other sets, the fleet idle.
	//
	// A short waiter counts as admitted at its turn, so the waiters after
	// it take nothing of a set it is short of until it is admitted. Once
	// it is turned down (not asked for), they are not asked for in those
	// sets either: asked for alone, one was granted a unit it could not
	// take, gave it back, and was asked for again, for ever, in one
	// instant.
	idle := idleUnits{left: map[Set]int64{}, held: map[Set]int64{}}
	behind := map[Set]bool{} // sets of short waiters not asked for
	ask := func(w *waiter) {
		counts := &idle
		if z.fleetKeyFull(w.flow) {
			counts = &idleUnits{left: maps.Clone(idle.left), held: idle.held}
		}
		want, a := z.wantOf(w.req, true, w.flow, counts, w.short)
		if len(want.Sets) == 0 {
			return
		}
		if slices.ContainsFunc(a.sets, func(s Set) bool { return behind[s] }) ||
			len(c.Writes) == 0 && z.turnedDown(w.flow, &want, a.sets, now) {
			if w.short {
				for _, s := range a.sets {
					behind[s] = true
				}
			}
			return
		}
		a.w = w
		c.Wants = append(c.Wants, want)
		st.asked = append(st.asked, a)
	}
	shorts := z.shortsInOrder(now)
	for _, w := range order {
		switch f := w.flow; {
		case w.short:
			ask(shorts[0])
			shorts = shorts[1:]
		case w != f.holder():
		case !f.asks: // refused by a cap: it takes only the room it holds
			z.takeHeld(f, &idle)
		default:
			ask(w)
		}
	}
	z.asks.changed = false
	for _, n := range z.asks.newcomers {
		want, a := z.wantOf(n.req, n.waits, nil, &idle, false)
		a.n = n
		c.Wants = append(c.Wants, want)
		st.asked = append(st.asked, a)
	}
	z.asks.newcomers = z.asks.newcomers[:0]
	c.Reports = z.reportsFor(order, now, len(c.Wants)+len(c.Writes) > 0)
	if len(c.Writes) == 0 && len(c.Reports) == 0 && len(c.Wants) == 0 {
		return nil, nil
	}
	st.writes = z.dirtyWrites(c, now, true, st.writes) // they ride along
	for set, r := range z.asks.reports {
		st.named[r.name] = namedSet{set: set, cap: r.cap}
	}
	for i, want := range c.Wants {
		for k, name := range want.Sets {
			st.named[name] = namedSet{set: st.asked[i].sets[k], cap: want.Caps[k]}
		}
	}
	return c, st
}

// dirtyWrites adds to c, and to sets, the write backs due at now, or all
// of them. mu must be held.
func (z *Zone) dirtyWrites(c *fleet.Call, now time.Time, all bool, sets []Set) []Set {
	for set, due := range z.asks.dirty {
		if all || !now.Before(due) {
			c.Writes = append(c.Writes, z.writeOf(set))
			sets = append(sets, set)
			delete(z.asks.dirty, set)
		}
	}
	return sets
}

// writes adds to c the allowances to write: those that shrank, and,
// once a renewal or a failed call made the zone write them all again, up
// to maxWrites of all it holds. It returns the set of each write. mu must
// be held.
func (z *Zone) writes(c *fleet.Call, now time.Time) []Set {
	var sets []Set
	if e := z.ledger.Epoch(); e != z.asks.epoch {
		z.asks.epoch = e
		z.rewriteAll(now)
	} else if len(z.asks.rewrite) == 0 && now.Sub(z.asks.renewed) >= z.ledger.Lease()/3 {
		z.rewriteAll(now)
	}
	for name, set := range z.asks.unsure {
		w := fleet.Write{Set: name}
		if z.stateOf(set).exists {
			w = z.writeOf(set)
		}
		c.Writes = append(c.Writes, w)
		sets = append(sets, set)
		delete(z.asks.unsure, name)
	}
	sets = z.dirtyWrites(c, now, false, sets)
	for len(z.asks.rewrite) > 0 && len(c.Writes) < maxWrites {
		set := z.asks.rewrite[len(z.asks.rewrite)-1]
		z.asks.rewrite = z.asks.rewrite[:len(z.asks.rewrite)-1]
		if a := z.stateOf(set); a.exists {
			c.Writes = append(c.Writes, z.writeOf(set))
			sets = append(sets, set)
		}
	}
	return sets
}

// writeOf is set's allowance as the ledger is to count it: an entry is
// forgotten only once written (see sweep).
func (z *Zone) writeOf(set Set) fleet.Write {
	a := z.stateOf(set)
	return fleet.Write{Set: a.name, Units: max(0, a.units), Spare: a.spare}
}

// rewriteAll has every allowance the zone holds written again, from the
// next call on. mu must be held.
func (z *Zone) rewriteAll(now time.Time) {
	z.asks.renewed = now
	z.asks.rewrite = z.asks.rewrite[:0]
	z.eachAllowance(func(set Set, a *allowance) {
		if a.units > 0 || a.spare > 0 {
			z.asks.rewrite = append(z.asks.rewrite, set)
		}
	})
}

// lapse drops the idle units of every allowance the zone holds, and its
// spare, once the ledger has not answered for half a lease: the ledger
// forgets an allowance a lease after it was last written, and may grant
// its units elsewhere, so the zone admits within its allowances while
// the ledger cannot answer only as long as the ledger still counts them
// (renewal writes each every third of a lease, and a failed renewal
// lapses them, half a lease on at the latest). What is in flight stays
// counted, and is written again once the ledger answers. mu must be held.
func (z *Zone) lapse() {
	if z.hasTotal {
		z.totalAllow.spare.Store(0)
		for { // an admission racing it is counted
			n := z.total.Load() & MaxCost
			z.totalAllow.units.Store(n)
			if z.total.Load()&MaxCost <= n {
				break
			}
		}
	}
	for d := range len(z.shards) / numShards {
		z.eachKeyAllowance(d, func(s *shard, h uint64, a *allowance) { a.units, a.spare = s.count(h), 0 })
	}
}

// eachAllowance calls fn for each allowance the zone holds, the total's
// included (with a nil allowance). mu must be held; fn must not lock a
// shard.
func (z *Zone) eachAllowance(fn func(Set, *allowance)) {
	if z.holdsTotal() {
		fn(Set{Dim: TotalDim}, &allowance{name: totalSet, units: z.totalAllow.units.Load(), spare: z.totalAllow.spare.Load()})
	}
	for d := range len(z.shards) / numShards {
		z.eachKeyAllowance(d, func(_ *shard, h uint64, a *allowance) { fn(Set{Dim: d, Hash: h}, a) })
	}
}

// eachKeyAllowance calls fn for each allowance of dimension d's keys the
// zone holds, with its shard's lock held; fn must not lock a shard.
func (z *Zone) eachKeyAllowance(d int, fn func(s *shard, h uint64, a *allowance)) {
	for i := range numShards {
		s := &z.shards[d*numShards+i]
		s.mu.Lock()
		for h, a := range s.allow {
			fn(s, h, a)
		}
		s.mu.Unlock()
	}
}

// idleUnits is what a call's wants count on, set by set: the idle units
// this instance holds that the wants before did not take (left), and of
// those, the room the holders before hold (held; see takeHeld).
type idleUnits struct {
	left, held map[Set]int64
}

// take takes up to units of set's idle units for a want, and returns
// those it could count on: beyond the holders' room, unless the want is
// admitted (a short waiter's). mu must be held.
func (z *Zone) take(idle *idleUnits, set Set, units int64, admitted bool) int64 {
	left, ok := idle.left[set]
	if !ok {
		left = max(0, z.stateOf(set).idle())
	}
	avail := left
	if !admitted {
		avail = max(0, left-idle.held[set])
	}
	idle.left[set] = left - min(units, avail)
	return avail
}

// wantOf returns what req needs of the fleet: in each of its sets, its
// units beyond the idle ones this instance holds there that the call's
// earlier wants did not count on (idle), within the fleet's caps; and
// what the zone keeps of it. f is its flow if it waits; admitted says it
// is short (see take). mu must be held.
func (z *Zone) wantOf(req *Request, waits bool, f *flow, idle *idleUnits, admitted bool) (fleet.Want, asked) {
	lim := z.limitsFor(req)
	units := lim.units(req, z.hasTotal, true)
	sets := z.setsOf(req)
	// One array backs the want's numbers, and one its sets: a call per
	// admission makes a want per request.
	n := len(sets)
	ints := make([]int64, 6*n)
	want := fleet.Want{Waits: waits, Sets: make([]string, 0, n), Holds: make([]bool, 0, n),
		Units: ints[0:0:n], Caps: ints[n : n : 2*n], Spares: ints[2*n : 2*n : 3*n],
		Allowance: ints[3*n : 3*n : 4*n], AllowanceSpare: ints[4*n : 4*n : 5*n]}
	a := asked{sets: make([]Set, 0, n), shares: ints[5*n : 5*n : 6*n]}
	for _, set := range sets {
		st := z.stateOf(set)
		left := z.take(idle, set, units, admitted)
		if left >= units {
			continue
		}
		spare := int64(0) // a set used lately asks for room ahead: what it holds
		if st.exists {
			spare = st.units + units
		}
		name := st.name
		if !st.exists {
			name = z.nameOf(req, set.Dim)
		}
		want.Sets = append(want.Sets, name)
		want.Units = append(want.Units, units-left)
		want.Caps = append(want.Caps, lim.capOf(req, set.Dim, true))
		want.Spares = append(want.Spares, spare)
		want.Holds = append(want.Holds, f != nil && containsDim(f.refused, set.Dim))
		want.Allowance, want.AllowanceSpare = append(want.Allowance, st.units), append(want.AllowanceSpare, st.spare)
		a.sets = append(a.sets, set)
		a.shares = append(a.shares, lim.capOf(req, set.Dim, false))
	}
	return want, a
}

// takeHeld counts in idle the room f holds as the zone's head (its
// keys) or its shared holder (the total; see reservation.go): a try
// after it counts that room as taken, so the waiters after it ask for
// room beyond it. mu must be held.
func (z *Zone) takeHeld(f *flow, idle *idleUnits) {
	units := z.unitsOf(f)
	if f == z.head {
		for d, h := range f.hashes {
			if f.keyed(d) {
				idle.held[Set{Dim: d, Hash: h}] += units
			}
		}
	}
	if f == z.sharer && z.hasTotal {
		idle.held[Set{Dim: TotalDim}] += units
	}
}

// turnedDown reports whether f's head still needs, in the sets of its
// want, the set the fleet last refused it by, and no fewer units there
// than it asked for then (a release here leaves it needing fewer), with
// no change announced since and within fleetPoll: it is not asked for
// again yet, unless the call writes back allowance of this instance's
// (room it may take). mu must be held.
func (z *Zone) turnedDown(f *flow, want *fleet.Want, sets []Set, now time.Time) bool {
	if f.turned.IsZero() || z.asks.changed || now.Sub(f.turned) >= fleetPoll || f.fleetSet == nil {
		return false
	}
	k := slices.Index(sets, *f.fleetSet)
	return k >= 0 && want.Units[k] >= f.turnedUnits
}

// othersWaitFor reports whether another instance waits for one of req's
// sets. Short of allowance there, req then waits here from the start,
// reported, and not as a newcomer: a newcomer is not demand in the
// tables, so an instance whose requests came back as newcomers, each
// after the release before it gave its unit back, was given no target,
// its newcomers took the units the others' reports could not hold, and
// each unit stood idle a round trip or two per request (three instances
// on a ledger 100 ms away, 3 clients each, held 4.2 of a cap of 6: see
// TestFleetOccupancyUnderLatency). mu must be held.
func (z *Zone) othersWaitFor(req *Request) bool {
	for d, key := range req.Keys {
		if key != "" && z.ledger.Tight(z.nameOf(req, d)) {
			return true
		}
	}
	return z.hasTotal && z.ledger.Tight(totalSet)
}

// nameOf names req's set of dimension d in the ledger.
func (z *Zone) nameOf(req *Request, d int) string {
	key := ""
	if d != TotalDim {
		key = req.Keys[d]
	}
	return LedgerName(d, key)
}

// answer applies a call's answer: each want's verdict, then the tables
// (see target.go). A want granted is admitted at once with its allowance
// if a newcomer; a waiter's grant goes by the queue order. A waiter
// refused goes on waiting, to be asked for again at the next change. If
// the call got no answer, the zone writes every allowance again in the
// next, and decides the wants alone (see fallback). mu must be held.
func (z *Zone) answer(c *fleet.Call, st *sent, err error) {
	now := z.clock.Now()
	if err == nil {
		z.asks.answered = now
	} else if now.Sub(z.asks.answered) >= z.ledger.Lease()/2 {
		z.lapse()
	}
	if err != nil {
		z.rewriteAll(now)
		for i, want := range c.Wants {
			for k, name := range want.Sets {
				z.asks.unsure[name] = st.asked[i].sets[k]
			}
		}
		for i, w := range c.Writes { // written again: as unsure, or with all it holds
			z.asks.unsure[w.Set] = st.writes[i]
		}
	}
	var grants []grant
	for i := range c.Wants {
		want, a := &c.Wants[i], st.asked[i]
		res := z.verdict(want, a, err, now.UnixNano(), st.gen == z.asks.capsGen)
		switch {
		case a.n != nil:
			z.decide(a.n, res)
		case a.w.left: // it left meanwhile
		case res.Outcome == Admitted: // what it was granted goes by the queue order
			a.w.levels, a.w.alone = res.Levels, res.Alone
			// No longer turned down: refused here, it waits here (see fleetKeyFull).
			a.w.flow.turned = time.Time{}
			sets := z.setsOf(a.w.req)
			for _, set := range sets { // tried again, even if idle units covered it
				z.freed = append(z.freed, set.blocker())
			}
			grants = append(grants, grant{a.w, sets})
		case res.Outcome == Unavailable:
			z.refuseWaiter(a.w, Unavailable, res.Dim)
		default: // full in the fleet, or in its share alone: it holds that room in the next calls
			f := a.w.flow
			z.uncharge(a.w) // its turn passed without a grant
			a.w.levels = res.Levels
			f.refusedBy(res.Dim)
			f.asks = true
			for k := range a.sets {
				if a.sets[k].Dim == res.Dim {
					f.fleetSet, f.turned, f.turnedUnits = &a.sets[k], now, want.Units[k]
				}
			}
			if z.fleetKeyFull(f) { // the total's room goes to those who can take it (see keysFit)
				z.unshort(f)
			}
		}
	}
	if err == nil {
		z.readTables(c.Tables, st.named, now)
	}
	z.dispatch()
	z.trimAnswered(c, st, grants)
}

// grant is a waiter a call's grant went to, and the sets of its request,
// read while it waited: once let in, the request is its handler's.
type grant struct {
	w    *waiter
	sets []Set
}

// trimAnswered writes back, after a call's answer, the idle allowance
// beyond what the zone keeps now: in the sets the tables named (a target
// that fell, or another instance now owed units, lets go of units that no
// release would), and in those of the waiters its grants let in (what was
// kept while they were filed there is idle now, and no release gives it
// back); but for the sets of a granted waiter that still waits for its
// turn in the queue order. mu must be held.
func (z *Zone) trimAnswered(c *fleet.Call, st *sent, grants []grant) {
	var sets []Set
	var waiting map[Set]bool
	for _, g := range grants {
		if !g.w.left { // the idle units it counts on too
			if waiting == nil {
				waiting = map[Set]bool{}
			}
			for _, set := range g.sets {
				waiting[set] = true
			}
			continue
		}
		sets = append(sets, g.sets...)
	}
	for _, t := range c.Tables {
		if n, ok := st.named[t.Set]; ok {
			sets = append(sets, n.set)
		}
	}
	for _, set := range sets {
		if !waiting[set] {
			z.trim([]Set{set}, false)
		}
	}
}

// verdict applies want's answer to the allowances, and returns what its
// request gets: Admitted (its allowance covers it now), Full by the
// dimension of the set that refused it, or Unavailable. A grant under
// the caps that apply now (fresh) ends its sets' drain.
func (z *Zone) verdict(want *fleet.Want, a asked, err error, now int64, fresh bool) Result {
	if err != nil {
		return z.fallback(want, a, now)
	}
	if want.Refused > 0 {
		for k, set := range a.sets {
			z.seen(set, want.Levels[k], false)
		}
		return Result{Outcome: Full, Dim: a.sets[want.Refused-1].Dim, Levels: z.levelsOf(a, want)}
	}
	for k, set := range a.sets {
		z.grow(set, want.Sets[k], want.Units[k]+want.Granted[k], want.Granted[k], now)
		z.seen(set, want.Levels[k], fresh)
		z.freed = append(z.freed, set.blocker())
	}
	return Result{Outcome: Admitted, Levels: z.levelsOf(a, want)}
}

// fallback decides a want the ledger did not answer: admitted within this
// instance's share of each cap if the ledger fails open (the allowance it
// takes is written once the ledger answers again), else Unavailable.
func (z *Zone) fallback(want *fleet.Want, a asked, now int64) Result {
	if !z.ledger.FailOpen() {
		return Result{Outcome: Unavailable, Dim: firstDim(a.sets)}
	}
	for k, set := range a.sets {
		if z.stateOf(set).units+want.Units[k] > a.shares[k] {
			return Result{Outcome: Full, Dim: set.Dim, Alone: true}
		}
	}
	for k, set := range a.sets {
		z.grow(set, want.Sets[k], want.Units[k], 0, now)
		z.freed = append(z.freed, set.blocker())
	}
	return Result{Outcome: Admitted, Alone: true}
}

// levelsOf turns a want's levels into its request's, by dimension (the
// total last); nil if the want had no sets.
func (z *Zone) levelsOf(a asked, want *fleet.Want) Levels {
	if len(a.sets) == 0 || len(want.Levels) == 0 {
		return nil
	}
	dims := len(z.shards) / numShards
	out := make(Levels, dims+1)
	for k, set := range a.sets {
		if want.Levels[k] < 0 {
			continue
		}
		d := set.Dim
		if d == TotalDim {
			d = dims
		}
		out[d] = Level{Cap: want.Caps[k], InFlight: want.Levels[k]}
	}
	return out
}

// decide answers a newcomer: admitted with the allowance granted for it,
// or refused.
func (z *Zone) decide(n *newcomer, res Result) {
	if res.Outcome == Admitted {
		if o, d := z.tryAcquire(n.req, nil); o != Admitted {
			res = Result{Outcome: Full, Dim: d, Levels: res.Levels}
		}
	}
	n.done <- res
}

// blocker is the constraint s stands for in the queue.
func (s Set) blocker() blocker {
	if s.Dim == TotalDim {
		return blocker{total: true}
	}
	return keyBlocker(s.Dim, s.Hash)
}

// firstDim is the dimension of the first of sets, or the total.
func firstDim(sets []Set) int {
	if len(sets) == 0 {
		return TotalDim
	}
	return sets[0].Dim
}

// sweep gives back the idle allowance beyond what the zone keeps, and
// all of it where no request took units for keepUnused and none is in
// flight or waits; it forgets the keys' entries that hold nothing. mu
// must be held.
func (z *Zone) sweep(now int64) {
	z.asks.swept = now
	old := now - int64(keepUnused)
	closed := z.asks.closed.Load()
	var sets []Set
	if z.holdsTotal() {
		sets = append(sets, Set{Dim: TotalDim})
	}
	for d := range len(z.shards) / numShards {
		z.eachKeyAllowance(d, func(s *shard, h uint64, a *allowance) {
			set := Set{Dim: d, Hash: h}
			if a.units > 0 || a.spare != 0 {
				sets = append(sets, set)
				return
			}
			// Most entries hold nothing (a key used once keeps its entry
			// for keepUnused): forgotten here, with no second lookup.
			if _, dirty := z.asks.dirty[set]; (a.used < old || closed) && !dirty && s.count(h) == 0 {
				delete(s.allow, h)
			}
		})
	}
	for _, set := range sets {
		a := z.stateOf(set)
		keep := z.keep(set, a)
		if a.used < old && a.inFlight == 0 && !z.filed(set.blocker()) {
			keep = 0
		}
		if a.idle() > keep {
			z.giveBackLater(set, a.idle()-keep, min(a.spare, keep))
		}
		if _, dirty := z.asks.dirty[set]; (a.used < old || closed) && !dirty {
			z.forget(set)
		}
	}
}

// holdsAllowance reports whether the zone holds any allowance, without
// walking the keys': the asker asks it each time it runs out of calls.
// mu must be held.
func (z *Zone) holdsAllowance() bool {
	if z.holdsTotal() {
		return true
	}
	for i := range z.shards {
		s := &z.shards[i]
		s.mu.Lock()
		n := len(s.allow)
		s.mu.Unlock()
		if n > 0 {
			return true
		}
	}
	return false
}

// holdsTotal reports whether the zone holds allowance in the total.
func (z *Zone) holdsTotal() bool {
	return z.hasTotal && (z.totalAllow.units.Load() > 0 || z.totalAllow.spare.Load() > 0)
}

// refuseWaiter takes w out of the queue with outcome o by dimension d, and
// wakes it. mu must be held.
func (z *Zone) refuseWaiter(w *waiter, o Outcome, d int) {
	z.dequeue(w)
	z.pending.Add(-1)
	w.outcome, w.dim = o, d
	close(w.ready)
}

// unshort takes f's short waiters back into the queue, uncharged: the
// fleet refused one of them by a key whose cap this instance's allowance
// cannot cover. The room they held as admitted is free for the waiters
// it refused: the total's, a new key's of each key bound (max_keys), and
// f's own keys'. f is parked, as if tried: it waits for the fleet's next
// change, and tried now it would only ask again, in the same instant, for
// ever. mu must be held.
func (z *Zone) unshort(f *flow) {
	for w := f.head; w != nil && w.short; w = w.next {
		delete(z.short, w)
		w.short = false
		z.uncharge(w)
	}
	z.freed = f.sharedBlockers(f.keyBlockers(z.freed))
	z.headLeft(f)
	z.park(f)
}

// fileFleetFull files f, whose head the fleet refused by one of its keys
// (fleetKeyFull), as refused by that key's cap: it is asked for again at
// the fleet's next change, even if a waiter after it was refused here
// since (by the room it held, or by max_keys), which stopped its flow
// asking. mu must be held.
func (z *Zone) fileFleetFull(f *flow) {
	z.file(f, Full, f.fleetSet.Dim)
	f.asks = true
}

// fleetNeed is the units w lacks in set beyond the idle allowance here:
// what it asks the fleet for there.
func (z *Zone) fleetNeed(w *waiter, set Set) int64 {
	return z.unitsOfWaiter(w) - max(0, z.stateOf(set).idle())
}

// fileRefusal files f under what refused w, its holder (see file) and,
// with a ledger, notes whether it needs the fleet: short of allowance, w
// is asked for in the asker's next call, and counts as admitted (see
// waiter.short); refused by a cap, it waits for this instance's releases
// alone. mu must be held.
func (z *Zone) fileRefusal(f *flow, w *waiter, o Outcome, d int) {
	if o == short && z.fleetKeyFull(f) {
		z.fileFleetFull(f)
		z.uncharge(w)
		if z.fleetNeed(f.head, *f.fleetSet) < f.turnedUnits {
			z.startAsking() // a release here left it needing fewer of the fleet: see turnedDown
		}
		return
	}
	z.file(f, o, d)
	if z.ledger == nil {
		return
	}
	switch o {
	case fleetFull: // asked for just now: again at the fleet's next change
		z.uncharge(w)
		f.asks, f.turned = true, z.clock.Now()
		f.refusedBy(d)
		set := Set{Dim: TotalDim}
		if d != TotalDim {
			set = Set{Dim: d, Hash: f.hashes[d]}
		}
		f.fleetSet, f.turnedUnits = &set, z.fleetNeed(w, set)
		z.startAsking()
	case short: // short of what this instance holds: asked for in the next call
		if z.short == nil {
			z.short = map[*waiter]int64{}
		}
		if w.req.slot.fair == nil { // else set as it was charged
			w.shortPlace = z.turn(f).tag
		}
		w.short, w.shortAt = true, z.releases
		z.short[w] = z.unitsOfWaiter(w)
		f.turned = time.Time{}
		z.headLeft(f)
		z.startAsking()
	default: // its turn passed without a grant
		z.uncharge(w)
		f.asks = false
	}
}

// acquireNow admits req if it fits now, after any waiter that fits,
// without waiting; with a ledger, one short of allowance is decided by the
// asker's next call.
func (z *Zone) acquireNow(req *Request) Result {
	if z.ledger == nil {
		o, d := z.tryNow(req)
		return Result{Outcome: o, Dim: d}
	}
	if z.pending.Load() == 0 {
		if o, d := z.tryAcquire(req, nil); o != short {
			return Result{Outcome: o, Dim: d}
		}
	}
	z.mu.Lock()
	if o, d := z.tryNewcomer(req); o != short {
		z.mu.Unlock()
		return Result{Outcome: o, Dim: d}
	}
	return z.askFor(req, false)
}

func containsDim(dims []int, d int) bool {
	for _, x := range dims {
		if x == d {
			return true
		}
	}
	return false
}
