package core

import (
	"math"
	"sort"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// The reference model: the engine's rules as docs/waiting.md and
// docs/guarantees.md state them, written for clarity, not speed. It keeps
// every request and every count in plain maps, and after each event it
// grants, one at a time, the first waiter in the queue order that fits
// beyond the head's reservation, recomputing everything from scratch. It
// shares no code with the engine: numbers the docs give (class weights,
// the aging period, the fair clock's bounds, the deadline margin, early
// refusal's margin) are written here again, so that a change to one of
// them shows as a disagreement.

// The documented numbers.
const (
	mAging       = 30 * time.Second // a waiter's score doubles in 30 s
	mMinHold     = 0.001            // seconds a fair grant is charged at least
	mMaxHold     = 3600.0           // and at most
	mDefaultHold = 1.0              // before any hold time is known
	mRebaseAt    = 1 << 20          // virtual time is moved back to 0 there
	mRebaseTags  = 64               // or once this many tags (doubling) are kept
	mMarginMax   = 50 * time.Millisecond
	mGrantTau    = 3 * time.Second // the grant rate's time constant
	mMinGrants   = 4               // releases counted before it predicts
)

var mClassWeight = map[limiter.Class]float64{limiter.Low: 0.5, limiter.Normal: 1, limiter.High: 2}

// mRequest is one request as the model sees it.
type mRequest struct {
	id     int
	keys   []string // per limit; "" leaves it out
	max    []int64  // per limit whose max is the request's own
	cost   int64
	class  limiter.Class
	weight float64 // its share under fair
	used   int64   // the units it was found to use, set before its release

	gen     int // the config it arrived under
	state   mState
	wait    time.Duration // once bounded by its deadline
	arrived time.Time     // when it started waiting
	seq     uint64
	units   int64 // held while admitted
	charge  *mCharge
	charged bool // its grant was charged on the fair clock

	outcome limiter.Outcome
	dim     int
	waited  time.Duration
}

type mState uint8

const (
	mNew mState = iota
	mWaiting
	mAdmitted
	mDone // refused, timed out, aborted or released
)

// mCharge is what a fair grant charged, for the correction at release.
type mCharge struct {
	key    string
	weight float64
	est    float64
	at     time.Time
}

// mConfig is what a handler configures, as the model reads it.
type mConfig struct {
	Dims       int
	Fixed      []int64            // per limit: its fixed max; 0: the request's own
	OwnMax     []map[string]int64 // per limit with a request's own max: by key
	HasTotal   bool
	Total      int64 // 0: none
	MaxKeys    int64
	Wait       time.Duration
	MaxWaiting int
	PerKey     int // max_waiting_per_key
	Fair       int // the fair limit, -1: none
	Early      bool
}

// keyDim is the limit whose keys fair shares and max_waiting_per_key
// counts.
func (c *mConfig) keyDim() int { return max(c.Fair, 0) }

// model is the engine's state. A reload adds a config: the new handler's
// limits apply at once to requests whose own handler was unloaded
// (retired), and to the others once it is.
type model struct {
	cfg     mConfig // the newest: newcomers arrive under it
	gens    []mConfig
	retired []bool
	now     time.Time
	reqs    []*mRequest
	seq     uint64

	count  []map[string]int64 // per limit: units per key
	total  int64
	clock  mClock
	grants mGrantRate
}

func newModel(cfg mConfig, now time.Time) *model {
	m := &model{cfg: cfg, gens: []mConfig{cfg}, retired: []bool{false}, now: now, count: make([]map[string]int64, cfg.Dims)}
	for d := range m.count {
		m.count[d] = map[string]int64{}
	}
	m.clock.tags, m.clock.holdTimes, m.clock.waiting = map[string]float64{}, map[string]float64{}, map[string]float64{}
	return m
}

// limitsOf is the config whose caps r is checked against: its own, or once
// its handler was retired by a reload, the newest.
func (m *model) limitsOf(r *mRequest) *mConfig {
	if m.retired[r.gen] {
		return &m.cfg
	}
	return &m.gens[r.gen]
}

// reload adds c, the new handler's config, then retires the old one's,
// letting the waiters in after each step.
func (m *model) reload(c mConfig) {
	old := len(m.gens) - 1
	m.cfg = c
	m.gens, m.retired = append(m.gens, c), append(m.retired, false)
	m.dispatch()
	m.retired[old] = true
	m.dispatch()
}

// capOf is r's cap in limit d (limiter.TotalDim: the total, 0 for none).
func (m *model) capOf(r *mRequest, d int) int64 {
	c := m.limitsOf(r)
	switch {
	case d == limiter.TotalDim:
		return c.Total
	case c.Fixed[d] > 0:
		return c.Fixed[d]
	}
	return r.max[d]
}

// unitsOf is what r takes: its cost, at least 1, at most each cap it is
// checked against.
func (m *model) unitsOf(r *mRequest) int64 {
	u := max(r.cost, 1)
	for d, k := range r.keys {
		if k != "" {
			u = min(u, m.capOf(r, d))
		}
	}
	if m.cfg.HasTotal && m.capOf(r, limiter.TotalDim) > 0 {
		u = min(u, m.capOf(r, limiter.TotalDim))
	}
	return max(u, 1)
}

// keysIn counts limit d's keys in flight.
func (m *model) keysIn(d int) int64 { return int64(len(m.count[d])) }

// mHold is the room held while requests wait: the head holds its units in
// each of its keys; the first waiter whose keys have room beyond that
// holds its units in the total and one key in the key bound of each of
// its keys not in flight. A hold refuses only those after its holder in
// the queue order (and newcomers).
type mHold struct {
	head, shared *mRequest
}

// holdOf returns the holds with ws waiting, in the queue order.
func (m *model) holdOf(ws []*mRequest) mHold {
	if len(ws) == 0 {
		return mHold{}
	}
	h := mHold{head: ws[0]}
	for _, w := range ws {
		if m.keysFit(w, h) {
			h.shared = w
			break
		}
	}
	return h
}

// keysFit reports whether r fits in each of its keys beyond the head's
// hold.
func (m *model) keysFit(r *mRequest, h mHold) bool {
	u := m.unitsOf(r)
	for d, k := range r.keys {
		if k != "" && m.count[d][k]+u+m.keyHold(r, h, d) > m.capOf(r, d) {
			return false
		}
	}
	return true
}

// keyHold is the units h holds in r's key of limit d against r.
func (m *model) keyHold(r *mRequest, h mHold, d int) int64 {
	if h.head == nil || h.head == r || h.head.keys[d] != r.keys[d] {
		return 0
	}
	return m.unitsOf(h.head)
}

// try reports whether r fits beyond h: keys first in limit order, then
// the key bounds, then the total. waiting says r is a waiter (a newcomer
// goes after every waiter).
func (m *model) try(r *mRequest, h mHold, waiting bool) (limiter.Outcome, int) {
	u, lim := m.unitsOf(r), m.limitsOf(r)
	for d, k := range r.keys {
		if k != "" && m.count[d][k]+u+m.keyHold(r, h, d) > m.capOf(r, d) {
			return limiter.Full, d
		}
	}
	s := h.shared
	sharedFirst := s != nil && s != r && (!waiting || m.before(s, r))
	for d, k := range r.keys {
		if k == "" || m.count[d][k] > 0 || lim.MaxKeys == 0 {
			continue
		}
		held := int64(0)
		if sharedFirst && s.keys[d] != "" && s.keys[d] != k && m.count[d][s.keys[d]] == 0 {
			held = 1
		}
		if m.keysIn(d)+held >= lim.MaxKeys {
			return limiter.KeysFull, d
		}
	}
	if m.cfg.HasTotal && lim.Total > 0 {
		held := int64(0)
		if sharedFirst {
			held = m.unitsOf(s)
		}
		if m.total+u+held > lim.Total {
			return limiter.Full, limiter.TotalDim
		}
	}
	return limiter.Admitted, 0
}

// take counts r's units.
func (m *model) take(r *mRequest) {
	r.units = m.unitsOf(r)
	for d, k := range r.keys {
		if k != "" {
			m.count[d][k] += r.units
		}
	}
	m.total += r.units
	r.state = mAdmitted
}

// giveBack takes r's units off the counts.
func (m *model) giveBack(r *mRequest) {
	for d, k := range r.keys {
		if k == "" {
			continue
		}
		if m.count[d][k] -= r.units; m.count[d][k] == 0 {
			delete(m.count[d], k)
		}
	}
	m.total -= r.units
	r.state = mDone
}

// waiters returns the waiting requests in the queue order at now.
func (m *model) waiters() []*mRequest {
	var out []*mRequest
	for _, r := range m.reqs {
		if r.state == mWaiting {
			out = append(out, r)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return m.before(out[i], out[j]) })
	return out
}

// before is the queue order: with fair, the smaller tag of the fair key,
// then arrival; else the higher score (class weight × (1 + waited/30 s)),
// the higher class, then arrival.
func (m *model) before(a, b *mRequest) bool {
	if m.cfg.Fair >= 0 {
		ta, tb := m.clock.tags[a.keys[m.cfg.Fair]], m.clock.tags[b.keys[m.cfg.Fair]]
		if ta != tb {
			return ta < tb
		}
		return a.seq < b.seq
	}
	if sa, sb := m.score(mClassWeight[a.class], a), m.score(mClassWeight[b.class], b); sa != sb {
		return sa > sb
	}
	if a.class != b.class {
		return a.class > b.class
	}
	return a.seq < b.seq
}

func (m *model) score(w float64, r *mRequest) float64 {
	return w * (1 + float64(m.now.Sub(r.arrived))/float64(mAging))
}

// dispatch grants the first waiter in the queue order that fits beyond the
// holds, until none does. Each grant is charged on the fair
// clock.
func (m *model) dispatch() {
	for {
		ws := m.waiters()
		if len(ws) == 0 {
			return
		}
		h := m.holdOf(ws)
		var next *mRequest
		for _, w := range ws {
			if o, _ := m.try(w, h, true); o == limiter.Admitted {
				next = w
				break
			}
		}
		if next == nil {
			return
		}
		m.take(next) // and charged while its key still waits
		if m.cfg.Fair >= 0 {
			m.chargeGrant(next)
		}
		m.leaveQueue(next)
		next.outcome, next.waited = limiter.Admitted, m.now.Sub(next.arrived)
	}
}

// enqueue makes r a waiter.
func (m *model) enqueue(r *mRequest) {
	m.seq++
	r.state, r.arrived, r.seq = mWaiting, m.now, m.seq
	if m.cfg.Fair >= 0 {
		key := r.keys[m.cfg.Fair]
		if _, ok := m.clock.waiting[key]; !ok {
			m.clock.arrive(key, r.weight)
		}
	}
}

// leaveQueue takes r, no longer waiting (granted, or gone), out of the
// queue: its fair key stops waiting with its last waiter.
func (m *model) leaveQueue(r *mRequest) {
	if m.cfg.Fair < 0 {
		return
	}
	key := r.keys[m.cfg.Fair]
	for _, o := range m.reqs {
		if o.state == mWaiting && o.keys[m.cfg.Fair] == key {
			return
		}
	}
	m.clock.leave(key)
}

// perKeyWaiting counts the waiters with r's key in the key dimension.
func (m *model) perKeyWaiting(r *mRequest) int {
	d, n := m.cfg.keyDim(), 0
	for _, o := range m.reqs {
		if o.state == mWaiting && d < len(o.keys) && o.keys[d] == r.keys[d] {
			n++
		}
	}
	return n
}

func (m *model) queued() int64 {
	n := int64(0)
	for _, r := range m.reqs {
		if r.state == mWaiting {
			n++
		}
	}
	return n
}

// arrive is a request's admission: left > 0 is its deadline's distance.
func (m *model) arrive(r *mRequest, left time.Duration) {
	r.gen = len(m.gens) - 1
	m.reqs = append(m.reqs, r)
	r.wait = m.cfg.Wait
	if left > 0 {
		r.wait = max(0, min(r.wait, left-min(mMarginMax, left/10)))
	}
	settle := func(o limiter.Outcome, d int) { r.state, r.outcome, r.dim = mDone, o, d }
	waiting := m.queued() > 0
	if waiting {
		m.dispatch()
	}
	o, d := m.try(r, m.holdOf(m.waiters()), false)
	if o == limiter.Admitted {
		m.take(r)
		r.outcome = limiter.Admitted
		return
	}
	if r.wait <= 0 {
		settle(o, d)
		return
	}
	if kd := m.cfg.keyDim(); m.cfg.PerKey > 0 && kd < len(r.keys) && r.keys[kd] != "" && m.perKeyWaiting(r) >= m.cfg.PerKey {
		settle(limiter.QueueFull, kd)
		return
	}
	if m.cfg.MaxWaiting > 0 && m.queued() >= int64(m.cfg.MaxWaiting) {
		settle(limiter.QueueFull, d)
		return
	}
	if m.cfg.Early && left > 0 && m.grants.refuses(m.queued(), r.wait, m.now) {
		settle(limiter.Timeout, d)
		return
	}
	r.dim = d
	m.enqueue(r)
	m.dispatch()
}

// release gives back an admitted request's units, corrects its fair
// charge, and lets the waiters in.
func (m *model) release(r *mRequest) {
	if c := r.charge; c != nil {
		r.charge = nil
		used := r.units
		if r.used > 0 {
			used = min(r.used, limiter.MaxCost)
		}
		held := m.now.Sub(c.at).Seconds() * float64(used) / float64(r.units)
		charged := min(max(held, mMinHold), mMaxHold)
		m.clock.correct(c.key, float64(r.units)*(charged-c.est)/c.weight, charged)
	}
	m.giveBack(r)
	if m.queued() > 0 {
		m.dispatch()
	}
	if m.cfg.Early {
		m.grants.add(m.now)
	}
}

// leave ends a waiter's wait: timed out, or its client gone.
func (m *model) leave(r *mRequest, o limiter.Outcome) {
	r.state = mDone
	m.leaveQueue(r)
	r.outcome, r.waited = o, m.now.Sub(r.arrived)
	m.dispatch()
}

// chargeGrant charges r's fair key for r's units at its estimated hold.
func (m *model) chargeGrant(r *mRequest) {
	key := r.keys[m.cfg.Fair]
	est := m.clock.estimate(key)
	m.clock.charge(key, float64(r.units)*est, r.weight)
	r.charge, r.charged = &mCharge{key: key, weight: r.weight, est: est, at: m.now}, true
}

// mClock is fair sharing's virtual time: each waiting key's tag is where
// the work granted to it ends; a grant starts at max(vtime, tag), moves the
// tag by work/weight and vtime by work shared among the waiting weights.
type mClock struct {
	vtime, base float64
	tags        map[string]float64
	holdTimes   map[string]float64 // per key: recent seconds held per unit
	holdTime    float64            // the zone's
	waiting     map[string]float64 // waiting keys' weights
	active      float64
	rebaseAbove int
}

func (c *mClock) arrive(key string, w float64) {
	if tag, ok := c.tags[key]; !ok || tag < c.vtime {
		c.tags[key] = c.vtime
	}
	c.waiting[key] = w
	c.active += w
}

func (c *mClock) leave(key string) {
	c.active -= c.waiting[key]
	delete(c.waiting, key)
	if len(c.waiting) == 0 {
		c.active = 0
	}
}

func (c *mClock) estimate(key string) float64 {
	if h, ok := c.holdTimes[key]; ok {
		return h
	}
	if c.holdTime > 0 {
		return c.holdTime
	}
	return mDefaultHold
}

func (c *mClock) charge(key string, work, w float64) {
	start := max(c.vtime, c.tags[key])
	if start == c.vtime && c.active > 0 {
		c.vtime += work / c.active
	}
	c.vtime = max(c.vtime, start)
	c.tags[key] = start + work/w
	if len(c.tags) > max(c.rebaseAbove, mRebaseTags) || c.vtime >= mRebaseAt {
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
			}
		}
		c.base += c.vtime
		c.vtime = 0
		c.rebaseAbove = 2 * len(c.tags)
	}
}

// correct moves key's tag by delta (the charge corrected to the held
// seconds) and learns the hold: a key's estimate moves a quarter of the
// way, the zone's a sixteenth.
func (c *mClock) correct(key string, delta, held float64) {
	tag, tagged := c.tags[key]
	if h, ok := c.holdTimes[key]; ok {
		c.holdTimes[key] = h + (held-h)/4
	} else if tagged {
		c.holdTimes[key] = held
	}
	if c.holdTime == 0 {
		c.holdTime = held
	} else {
		c.holdTime += (held - c.holdTime) / 16
	}
	switch {
	case tagged:
		c.tags[key] = tag + delta
	case delta > 0:
		c.tags[key] = c.vtime + delta
	}
}

// mGrantRate is early refusal's estimate of the zone's rate of released
// slots: an exponentially weighted count with τ = 3 s, corrected for the
// time it has counted.
type mGrantRate struct {
	n           int
	first, last time.Time
	r           float64
}

func (g *mGrantRate) add(now time.Time) {
	if g.n == 0 {
		g.first = now
	} else {
		g.r *= math.Exp(-now.Sub(g.last).Seconds() / mGrantTau.Seconds())
	}
	g.r += 1 / mGrantTau.Seconds()
	g.last = now
	g.n++
}

// refuses reports whether a request queued behind queued others would
// be refused early: its expected wait, (queued + 1) / rate, is over 125 %
// of the wait it has.
func (g *mGrantRate) refuses(queued int64, wait time.Duration, now time.Time) bool {
	if g.n < mMinGrants {
		return false
	}
	r := g.r * math.Exp(-now.Sub(g.last).Seconds()/mGrantTau.Seconds())
	if w := 1 - math.Exp(-now.Sub(g.first).Seconds()/mGrantTau.Seconds()); w > 0 {
		r /= w
	}
	s := float64(queued+1) / r
	exp := time.Duration(math.MaxInt64)
	if r > 0 && s < float64(math.MaxInt64)/1e9 {
		exp = time.Duration(s * 1e9)
	}
	return exp > wait+wait/4 // the documented 125 %
}
