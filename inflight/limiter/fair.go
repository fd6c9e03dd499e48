package limiter

import "time"

// Fair sharing is start-time fair queuing over the keys of one dimension,
// in what the backend gives: a grant from the queue charges its key units
// × hold time / weight (unit-seconds; with Slot.Used, the units it was
// found to use, such as the tokens a model reported, × hold time), so
// shares are shares of the slots' (or tokens') time, whatever each
// request's length. A key's tag is the virtual time at which the work it
// was granted so far ends. The hold time is not known at the grant: the
// grant charges an estimate (the key's recent seconds charged per unit,
// or the zone's), and the request's Release corrects the charge to what
// it used (see settle). vtime is where service
// stands: the start tag of the latest grant, moved on by each grant's
// charge shared among the keys waiting (their weights' sum, as fluid
// fair sharing moves it). A waiting key's start tag is max(its tag, vtime):
// a key that was idle or light starts at the present, never in the past,
// so it can neither hoard credit nor be starved, and the freed slot goes to
// the waiter whose key has the smallest start tag. Under sustained
// contention every waiting key is granted slot-seconds in proportion to
// its weight whatever its queue length and its requests' lengths, and a
// key that arrives late is served at the next freed slot its share calls
// for (at once, if it holds less than its share).
//
// Why vtime moves on by the charges too: a stream of keys that each send
// one request would otherwise all start at the same vtime, below the tag
// of a key that waits all along, and pass it for ever. Moved on, vtime
// reaches that tag once the newcomers were given what the waiting key's
// share is worth, and the key is served.
//
// Why not the instantaneous rule "the key holding the fewest slots relative
// to its weight": with whole slots it settles where no key's next slot is
// worth moving (10 slots at weights 2 : 1 : 0.5 stay at 5 : 3 : 2 for good,
// not 5.7 : 2.9 : 1.4); counting grants carries the fractions over time.
//
// Weights are bounded (MinWeight to MaxWeight), units by MaxCost and hold
// times by minHold to maxHold: a tag grows by at most
// MaxCost×maxHold/MinWeight a grant or correction, and virtual time is
// rebased to 0 (every tag moved back with it) before it reaches rebaseAt,
// so a grant of one unit for minHold at MaxWeight is never lost to
// rounding near vtime and no weight can make a tag infinite or NaN.
//
// Invariants, with mu held: tags holds every waiting key (tagged at least
// vtime when it starts waiting: its tag orders it among the waiting keys)
// and the keys whose tag may exceed vtime; for any other key a tag at or
// below vtime reads the same as none, and may linger until the next
// rebase. holdTimes keeps a hold estimate only for keys in tags, or charged
// since the last rebase; waiting lists the keys with fair flows waiting
// and active is the sum of their weights; vtime never decreases but by a
// rebase, which moves every tag back as much and drops the tags at or
// below it of keys not waiting; a rebase comes once tags has doubled since
// the last one (amortised O(1) a grant, for a queue and for a shared
// store's dispatcher alike), or vtime reached rebaseAt. A tag falls only
// by a correction (see settle), which moves its key's listings back in
// their lanes at once: a listed place is never later than its key's tag.

// Bounds of a fair share's weight: a weight outside them counts as the
// nearest bound.
const (
	MinWeight = 0.001
	MaxWeight = 1000
)

// rebaseAt is the virtual time at which it is moved back to 0. Below it a
// float64 resolves steps far finer than 1/MaxWeight.
const rebaseAt = 1 << 20

// clampWeight returns w within MinWeight to MaxWeight, and 0 (the class
// weight) for a weight that is not a positive number.
func clampWeight(w float64) float64 {
	if !(w > 0) {
		return 0
	}
	return min(max(w, MinWeight), MaxWeight)
}

// Hold times a grant is charged for, in seconds: a request that ends at
// once still costs its key something, one held for hours costs no more
// than maxHold; a key, and a zone, with no hold time seen yet is charged
// defaultHold until its first request ends.
const (
	minHold     = 0.001
	maxHold     = 3600
	defaultHold = 1
)

// virtualClock is fair sharing's virtual time, its keys' tags and hold
// estimates.
type virtualClock struct {
	vtime float64
	tags  map[uint64]float64
	base  float64 // virtual time moved back by rebases, in all
	// rebaseAbove is the number of tags above which the next grant rebases.
	rebaseAbove int
	// holdTimes is each key's recent seconds charged per unit (hold time,
	// scaled by the units used over those taken), and holdTime the zone's: a
	// grant's estimate (see estimate).
	holdTimes map[uint64]float64
	holdTime  float64
	// rates is each key's recent units used per unit taken (Slot.Used
	// over its units; 1 where none was reported): what a unit-second it
	// holds is charged, by which the fleet's targets weigh it (see
	// Zone.entries). Kept, as holdTimes, only for keys with a tag.
	rates map[uint64]float64
	// shares is each key's part of its demand in the fleet, as the
	// ledger's latest table said, which scales its weight here (see
	// reshare); kept, as holdTimes, only for keys with a tag.
	shares map[uint64]float64
	// waiting are the keys with fair flows waiting, and active their
	// weight, by which a grant's charge moves vtime on.
	waiting map[uint64]*keyFlows
	active  float64
	// turned counts, by key, its waiters charged at their turn and not
	// yet granted (with a ledger: short of allowance): they count as
	// granted, so a key all of whose waiters are leaves active, as it
	// would have left the queue at its grant.
	turned map[uint64]int
	// of, if set, is the clock this one simulates grants on (see
	// queue.order): its tags and holdTimes are read where this one has none.
	of *virtualClock
}

// minRebaseAbove is the fewest tags that make a grant rebase.
const minRebaseAbove = 64

// place returns key's tag on a scale that rebases do not move back, for
// ordering waiters in lanes.
func (c *virtualClock) place(key uint64) float64 {
	return c.base + c.tags[key]
}

// tag returns key's tag, which orders the waiting keys: a key that starts
// waiting is tagged vtime if its tag is below (see arrive), so the key
// with the smallest tag has the smallest start tag, and of two keys whose
// start tags are vtime, the one that waits since an earlier virtual time.
func (c *virtualClock) tag(key uint64) float64 {
	tag, ok := c.tags[key]
	if !ok && c.of != nil {
		tag = c.of.tags[key]
	}
	return tag
}

// arrive records that key starts waiting, at weight w: an idle or light
// key starts at the present.
func (c *virtualClock) arrive(key uint64, kf *keyFlows) {
	if c.waiting == nil {
		c.waiting = map[uint64]*keyFlows{}
	}
	if c.tags == nil {
		c.tags = map[uint64]float64{}
	}
	if tag, ok := c.tags[key]; !ok || tag < c.vtime {
		c.tags[key] = c.vtime
	}
	c.waiting[key] = kf
	c.active += kf.weight
}

// leave records that key no longer waits.
func (c *virtualClock) leave(key uint64) {
	kf := c.waiting[key]
	delete(c.waiting, key)
	c.active -= kf.weight
	if len(c.waiting) == 0 {
		c.active = 0 // no rounding left over
	}
}

// start returns the virtual time at which key starts its next unit.
func (c *virtualClock) start(key uint64) float64 {
	return max(c.vtime, c.tag(key))
}

// estimate returns the hold time, in seconds, a grant to key is charged
// for until it ends: the key's recent hold time, else the zone's.
func (c *virtualClock) estimate(key uint64) float64 {
	if c.of != nil {
		c = c.of
	}
	if h, ok := c.holdTimes[key]; ok {
		return h
	}
	if c.holdTime > 0 {
		return c.holdTime
	}
	return defaultHold
}

// advance records a grant of work unit-seconds to key at weight w (within
// the bounds): the arithmetic of fair sharing. It returns what the grant
// added to key's tag and to virtual time, for a charge taken back.
func (c *virtualClock) advance(key uint64, work, w float64) (tag, vtime float64) {
	if c.tags == nil {
		c.tags = map[uint64]float64{}
	}
	was, before := c.tags[key], c.vtime
	start := c.start(key)
	if active := c.activeNow(); start == c.vtime && active > 0 {
		c.vtime += work / active
	}
	c.vtime = max(c.vtime, start)
	c.tags[key] = start + work/w
	return c.tags[key] - was, c.vtime - before
}

// activeNow is the weight of the waiting keys, less those whose every
// waiter was charged at its turn.
func (c *virtualClock) activeNow() float64 {
	active := c.active
	for key, n := range c.turned {
		if kf := c.waiting[key]; kf != nil && n >= kf.waiters() {
			active -= kf.weight
		}
	}
	return max(0, active)
}

// turn counts a waiter of key charged at its turn (by 1), or one that
// no longer is (by -1): granted, or its turn taken back.
func (c *virtualClock) turn(key uint64, by int) {
	if c.turned == nil {
		c.turned = map[uint64]int{}
	}
	if c.turned[key] += by; c.turned[key] <= 0 {
		delete(c.turned, key)
	}
}

// charge records a grant of units to key at weight w, charged for est
// seconds, rebasing when due. It returns what the grant added (see
// advance), and the rebases so far, which a charge taken back needs.
func (c *virtualClock) charge(key uint64, units int64, w, est float64) (added [2]float64, base float64) {
	added[0], added[1] = c.advance(key, float64(units)*est, w)
	if len(c.tags) > max(c.rebaseAbove, minRebaseAbove) || c.vtime >= rebaseAt {
		c.rebase()
		c.rebaseAbove = 2 * len(c.tags)
		added[1] = 0 // moved back with the rest
	}
	return added, c.base
}

// uncharge takes back a charge to key that added tag to its tag and vtime
// to virtual time (see charge) when the rebases were at base: virtual
// time goes back too, unless a rebase moved it since.
func (c *virtualClock) uncharge(key uint64, tag, vtime, base float64) {
	if t, ok := c.tags[key]; ok {
		c.tags[key] = t - tag
	}
	if c.base == base {
		c.vtime = max(0, c.vtime-vtime)
	}
}

// correct moves key's tag by delta, the correction of a grant's charge to
// the held seconds (see fairCharge.delta), and learns the hold time. It
// reports whether the key's tag fell, so that its listings move back.
func (c *virtualClock) correct(key uint64, delta, held, rate float64) bool {
	c.learn(key, held, rate)
	tag, ok := c.tags[key]
	switch {
	case ok:
		c.tags[key] = tag + delta
	case delta > 0: // dropped by a rebase: it starts from the present
		c.tags[key] = c.vtime + delta
	}
	return ok && delta < 0
}

// learn moves key's and the zone's hold estimates towards a hold time of
// held seconds, and key's rate towards rate: a key's (if it has a tag) by
// a quarter of the gap, the zone's by a sixteenth.
func (c *virtualClock) learn(key uint64, held, rate float64) {
	if c.holdTimes == nil {
		c.holdTimes, c.rates = map[uint64]float64{}, map[uint64]float64{}
	}
	if h, ok := c.holdTimes[key]; ok {
		c.holdTimes[key] = h + (held-h)/4
		c.rates[key] += (rate - c.rates[key]) / 4
	} else if _, tagged := c.tags[key]; tagged { // holds stays within tags
		c.holdTimes[key], c.rates[key] = held, rate
	}
	if c.holdTime == 0 {
		c.holdTime = held
	} else {
		c.holdTime += (held - c.holdTime) / 16
	}
}

// rate returns what a unit-second key holds is charged, as learnt: 1 until
// one of its requests ended.
func (c *virtualClock) rate(key uint64) float64 {
	if r, ok := c.rates[key]; ok && r > 0 {
		return r
	}
	return 1
}

// share returns the factor of key's weight on this clock: its part of its
// demand in the fleet, if known, else 1.
func (c *virtualClock) share(key uint64) float64 {
	if c.of != nil {
		c = c.of
	}
	if s, ok := c.shares[key]; ok {
		return s
	}
	return 1
}

// reshare makes s key's part of its demand in the fleet (within the
// bounds of a weight; a part of 0, a key the fleet moved all its share
// from, leaves the part as it was), and moves its tag's lead on virtual
// time by the change: the lead is the work it was granted over its weight,
// and its weight changed. Charged at a part of 0.01, a grant of 3 units for
// 0.2 s leads by 60, which at the part of 1 the key's next table gives it
// is worth 0.6: left at 60, the key waits here for a minute while what the
// fleet owes it grows. It reports whether the tag fell, so that its
// listings move back.
func (c *virtualClock) reshare(key uint64, s float64) (fell bool) {
	if !(s > 0) {
		return false
	}
	was, s := c.share(key), min(max(s, MinWeight), MaxWeight)
	if s == was {
		return false
	}
	if c.shares == nil {
		c.shares = map[uint64]float64{}
	}
	c.shares[key] = s
	if tag, ok := c.tags[key]; ok && tag > c.vtime {
		c.tags[key] = c.vtime + (tag-c.vtime)*was/s
		return s > was
	}
	return false
}

// simulate returns a clock on which grants can be simulated without
// moving c.
func (c *virtualClock) simulate() *virtualClock {
	return &virtualClock{vtime: c.vtime, active: c.active, of: c}
}

// rebase moves virtual time back to 0 and every tag with it, dropping the
// tags at or below it but those of waiting keys, and the hold estimates of
// keys without a tag.
func (c *virtualClock) rebase() {
	for k, tag := range c.tags {
		if _, waits := c.waiting[k]; tag <= c.vtime && !waits {
			delete(c.tags, k)
		} else {
			c.tags[k] = tag - c.vtime
		}
	}
	for k := range c.holdTimes {
		if _, ok := c.tags[k]; !ok {
			delete(c.holdTimes, k)
			delete(c.rates, k)
		}
	}
	for k := range c.shares {
		if _, ok := c.tags[k]; !ok {
			delete(c.shares, k)
		}
	}
	c.base += c.vtime
	c.vtime = 0
}

// chargeGrant records the grant of units to w's flow's key, charged for
// the key's estimated hold time. With a ledger, a waiter whose turn came
// but is short of allowance is charged then, with the units it would
// take, as the grant it would be in a zone of its own (see dispatch): the
// grant that comes with the allowance is not charged again, and one that
// never comes is taken back (see uncharge).
func (q *queue) chargeGrant(w *waiter, units int64) {
	f := w.flow
	est := q.vclock.estimate(f.fairKey)
	share := q.vclock.share(f.fairKey)
	wt := clampWeight(f.weight * share)
	added, base := q.vclock.charge(f.fairKey, units, wt, est)
	q.charged(w.req, &fairCharge{key: f.fairKey, weight: wt, share: share, est: est, added: added, base: base})
}

// uncharge takes back the charge of w, a waiter charged at its turn whose
// turn passed without its grant (see chargeGrant).
func (q *queue) uncharge(w *waiter) {
	if c := w.req.slot.fair; c != nil {
		q.vclock.turn(c.key, -1)
		w.req.slot.fair = nil
		q.vclock.uncharge(c.key, c.rescaled(c.added[0]), c.added[1], c.base)
		q.moveBack(c.key) // its tag fell
	}
}

// charged records what req's grant charged, for its Release to correct.
func (q *queue) charged(req *Request, c *fairCharge) {
	c.q, c.at = q, q.clock.Now()
	req.slot.fair = c
}

// fairCharge is what a grant under fair charged its request's key, for
// the correction at its Release.
type fairCharge struct {
	q      *queue
	key    uint64
	weight float64
	share  float64 // the key's part in the fleet then (see reshare)
	est    float64 // seconds
	at     time.Time
	// added and base are what it added to its key's tag and virtual
	// time, and the clock's rebases then: to take it back (see uncharge).
	added [2]float64
	base  float64
}

// delta is how far a charge for units moves its key's tag once corrected
// to charged seconds.
func (c *fairCharge) delta(units int64, charged float64) float64 {
	return c.rescaled(float64(units) * (charged - c.est) / c.weight)
}

// rescaled is lead, a move of the key's tag at its part in the fleet when
// it was charged, at its part now: as reshare moved the rest of its lead.
func (c *fairCharge) rescaled(lead float64) float64 {
	return lead * c.share / c.q.vclock.share(c.key)
}

// settle corrects the charge of req's grant to what it was found to use,
// as its units are given back, on the clocks it was charged on, and
// learns it in any case: seconds per unit it took, its hold time scaled by
// the units it used (Slot.Used) over those it took, within minHold to
// maxHold. A key whose requests use a fifth of what they take is so
// charged a fifth, at the grant too once learnt: its corrections are not
// lost to a tag falling below vtime.
func (q *queue) settle(req *Request) {
	c := req.slot.fair
	req.slot.fair = nil
	rate := float64(req.slot.UsedUnits()) / float64(req.slot.taken)
	charged := min(max(q.clock.Now().Sub(c.at).Seconds()*rate, minHold), maxHold)
	q.mu.Lock()
	if q.vclock.correct(c.key, c.delta(req.slot.taken, charged), charged, rate) {
		q.moveBack(c.key)
	}
	q.mu.Unlock()
}

// before reports whether f goes before g at time now, by their leads.
func (q *queue) before(f, g *flow, now time.Time) bool {
	return q.next(f).before(q.next(g), now)
}

// candidate is a flow's next waiter to serve, with its key's tag under
// fair: what the queue order compares.
type candidate struct {
	f   *flow
	w   *waiter
	tag float64
}

// next is f's lead (see flow.lead) as a candidate.
func (q *queue) next(f *flow) candidate {
	c := candidate{f: f, w: f.lead()}
	if f.fair {
		c.tag = q.vclock.tag(f.fairKey)
	}
	return c
}

// before reports whether a goes before b at time now. Fair flows sharing a
// dimension go by their keys' tags, ties by arrival: the order a fair lane
// keeps (see filing); flows of one key by arrival alone, as their key's
// tag is theirs too (a short waiter's place is its key's before its charge,
// which would put it before its key's earlier flows). Flows not
// comparable so go by the queue order.
func (a candidate) before(b candidate, now time.Time) bool {
	if !a.f.fair || !b.f.fair || a.f.keyDim != b.f.keyDim {
		return a.w.before(b.w.standing, now)
	}
	if a.tag != b.tag && a.f.fairKey != b.f.fairKey {
		return a.tag < b.tag
	}
	return a.w.seq < b.w.seq
}

// score is weight × (1 + waited / agingPeriod): the queue order's score.
func score(weight float64, arrived, now time.Time) float64 {
	return weight * (1 + float64(now.Sub(arrived))/float64(agingPeriod))
}
