package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// recorder is the real backend of the fault suite. It holds each request
// for ?ms= milliseconds (or until the client goes) and records when each
// arrived and left, by tenant and X-Request-Id, so the checker can replay
// the concurrency the backend saw over time.
type recorder struct {
	addr   string
	mu     sync.Mutex
	events []event
}

// event is a request arriving at (+units) or leaving (-units) the backend.
type event struct {
	at    time.Time
	key   string
	delta int
	id    int // the request's X-Request-Id; 0: none
}

// maxCost is the largest cost the suite's clients ask for.
const maxCost = 3

func newRecorder(t *testing.T) *recorder {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{addr: l.Addr().String()}
	srv := &http.Server{Handler: rec}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return rec
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("X-Tenant")
	units, err := strconv.Atoi(r.Header.Get("X-Cost")) // within every cap: taken as asked
	if err != nil {
		units = 1
	}
	id, _ := strconv.Atoi(r.Header.Get("X-Request-Id"))
	rec.record(event{key: key, delta: +units, id: id})
	defer rec.record(event{key: key, delta: -units, id: id})
	io.Copy(io.Discard, r.Body)
	ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
	select {
	case <-time.After(time.Duration(ms) * time.Millisecond):
		io.WriteString(w, "ok")
	case <-r.Context().Done():
	}
}

func (rec *recorder) record(e event) {
	rec.mu.Lock()
	e.at = time.Now()
	rec.events = append(rec.events, e)
	rec.mu.Unlock()
}

// caps are the limits the fleet promises: per tenant and in total (0: none).
type caps struct{ tenant, total int }

func (c caps) String() string {
	if c.total == 0 {
		return fmt.Sprintf("tenant %d", c.tenant)
	}
	return fmt.Sprintf("tenant %d, total %d", c.tenant, c.total)
}

// span is a stretch of time [from, to).
type span struct{ from, to time.Time }

func (s span) overlaps(from, to time.Time) bool { return s.from.Before(to) && from.Before(s.to) }

// overSpan is a stretch of over-admission, and when the last request that
// took the backend over the caps arrived in it.
type overSpan struct {
	span
	lastAdmitted time.Time
}

// timeline is the backend's concurrency replayed, in units: when it held
// more than the caps (over-admission) and when a tenant or the total had
// no room for a request of each cost (so its refusal then was deserved),
// and who waited on each instance (whose room was held).
type timeline struct {
	over       []overSpan
	peakTenant int
	peakTotal  int
	keyFull    map[fullAt][]span
	totalFull  map[int][]span // by cost
	grace      time.Duration  // how long a slot may stay taken after its request ended
	waits      map[int][]wait // by instance
}

// fullAt is a tenant without room for a request of cost.
type fullAt struct {
	key  string
	cost int
}

// wait is a request waiting on an instance, from when it was sent until
// it reached the backend or its client had its answer.
type wait struct {
	id   int
	key  string
	cost int
	span
}

// replay sweeps the recorded events in time order; grace is how long a
// slot may stay taken after its request ended. A request ends at the
// backend when it leaves, or when its client gave up on it if that was
// earlier (outcome.gaveUp): Caddy gives the slot back once it sees the
// client go, a moment before its upstream connection's close reaches the
// backend. outcomes are every request the clients made.
//
// A request whose client gave up before it reached the backend may have
// been admitted as its client left (by the call under way then), and
// held its units in Redis until its release got there, never seen by the
// backend: for the refusals it explains (not for over-admission), it
// counts at the backend for the moment its client left, and like any
// other request its release may reach Redis up to grace later.
func (rec *recorder) replay(c caps, grace time.Duration, outcomes []outcome) *timeline {
	rec.mu.Lock()
	events := append([]event(nil), rec.events...)
	rec.mu.Unlock()
	arrived := map[int]time.Time{}
	for _, e := range events {
		if e.delta > 0 && e.id != 0 {
			arrived[e.id] = e.at
		}
	}
	tl := &timeline{keyFull: map[fullAt][]span{}, totalFull: map[int][]span{}, grace: grace, waits: map[int][]wait{}}
	gaveUp := map[int]time.Time{}
	for _, o := range outcomes {
		until := o.done
		if at, ok := arrived[o.id]; ok {
			until = earliest(until, at)
		}
		tl.waits[o.instance] = append(tl.waits[o.instance], wait{o.id, o.key, max(o.cost, 1), span{o.sent, until}})
		if !o.gaveUp.IsZero() {
			gaveUp[o.id] = o.gaveUp
		}
	}
	for i, e := range events {
		if g, ok := gaveUp[e.id]; ok && e.delta < 0 && g.Before(e.at) {
			events[i].at = latest(g, arrived[e.id])
		}
	}
	var ghosts []event // the moments of clients that left before the backend saw them
	for _, o := range outcomes {
		if _, ok := arrived[o.id]; !ok && !o.gaveUp.IsZero() {
			ghosts = append(ghosts, event{o.gaveUp, o.key, max(o.cost, 1), o.id})
		}
	}
	slices.SortStableFunc(events, func(a, b event) int { return a.at.Compare(b.at) })
	slices.SortStableFunc(ghosts, func(a, b event) int { return a.at.Compare(b.at) })
	count := map[string]int{}
	sum, overKeys := 0, 0
	var overSince, overAdmitted time.Time
	keySince, totalSince := map[fullAt]time.Time{}, map[int]time.Time{}
	end := time.Now().Add(time.Hour) // spans still open at the end
	for _, e := range events {
		for ; len(ghosts) > 0 && !ghosts[0].at.After(e.at); ghosts = ghosts[1:] {
			tl.ghost(c, ghosts[0], count[ghosts[0].key], sum)
		}
		wasOver := overKeys > 0 || (c.total > 0 && sum > c.total)
		before, sumBefore := count[e.key], sum
		count[e.key] += e.delta
		sum += e.delta
		after := count[e.key]
		tl.peakTenant, tl.peakTotal = max(tl.peakTenant, after), max(tl.peakTotal, sum)
		switch {
		case before <= c.tenant && after > c.tenant:
			overKeys++
		case before > c.tenant && after <= c.tenant:
			overKeys--
		}
		for cost := 1; cost <= maxCost; cost++ { // full for cost: held + cost > cap
			at, full := fullAt{e.key, cost}, c.tenant-cost+1
			switch {
			case before < full && after >= full:
				keySince[at] = e.at
			case before >= full && after < full:
				tl.keyFull[at] = append(tl.keyFull[at], span{keySince[at], e.at})
			}
			if c.total > 0 {
				full = c.total - cost + 1
				switch {
				case sumBefore < full && sum >= full:
					totalSince[cost] = e.at
				case sumBefore >= full && sum < full:
					tl.totalFull[cost] = append(tl.totalFull[cost], span{totalSince[cost], e.at})
				}
			}
		}
		isOver := overKeys > 0 || (c.total > 0 && sum > c.total)
		if isOver && e.delta > 0 && (after > c.tenant || (c.total > 0 && sum > c.total)) {
			overAdmitted = e.at
		}
		switch {
		case !wasOver && isOver:
			overSince = e.at
		case wasOver && !isOver && e.at.After(overSince):
			tl.over = append(tl.over, overSpan{span{overSince, e.at}, overAdmitted})
		}
	}
	for _, g := range ghosts {
		tl.ghost(c, g, count[g.key], sum)
	}
	if overKeys > 0 || (c.total > 0 && sum > c.total) {
		tl.over = append(tl.over, overSpan{span{overSince, end}, overAdmitted})
	}
	for cost := 1; cost <= maxCost; cost++ {
		for k, n := range count {
			if at := (fullAt{k, cost}); n >= c.tenant-cost+1 {
				tl.keyFull[at] = append(tl.keyFull[at], span{keySince[at], end})
			}
		}
		if c.total > 0 && sum >= c.total-cost+1 {
			tl.totalFull[cost] = append(tl.totalFull[cost], span{totalSince[cost], end})
		}
	}
	return tl
}

// ghost records the moment g of a client that left before the backend saw
// its request, with held units of its key and sum in all at the backend
// then: each cost it leaves no room for is full for that moment.
func (tl *timeline) ghost(c caps, g event, held, sum int) {
	for cost := 1; cost <= maxCost; cost++ {
		if held+g.delta > c.tenant-cost {
			tl.keyFull[fullAt{g.key, cost}] = append(tl.keyFull[fullAt{g.key, cost}], span{g.at, g.at})
		}
		if c.total > 0 && sum+g.delta > c.total-cost {
			tl.totalFull[cost] = append(tl.totalFull[cost], span{g.at, g.at})
		}
	}
}

// overIn returns how long the backend held more than the caps within
// [from, to).
func (tl *timeline) overIn(from, to time.Time) time.Duration {
	var d time.Duration
	for _, s := range tl.over {
		if s.overlaps(from, to) {
			d += earliest(s.to, to).Sub(latest(s.from, from))
		}
	}
	return d
}

// overWindow is how long after heal (and before until) the fleet still
// admitted over the caps: when the last request that took the backend over
// them arrived (0 if none did after heal). Requests admitted in excess then
// run to their end; the store cannot take them back.
func (tl *timeline) overWindow(heal, until time.Time) time.Duration {
	var w time.Duration
	for _, s := range tl.over {
		if s.lastAdmitted.Before(until) {
			w = max(w, s.lastAdmitted.Sub(heal))
		}
	}
	return w
}

// admitSlack is how long after a refusal a tenant or the total reaching its
// cap at the backend still explains it: a slot is taken in Redis a little
// before its request reaches the backend. That is the reply's way back to
// Caddy (50 ms through the fault proxy in the latency fault) and Caddy's
// hand-over to the backend, which are in other processes than the test's:
// on a busy 2-core machine the sum reaches about 100 ms.
const admitSlack = 150 * time.Millisecond

// undeserved returns the refusals sent and answered within [from, to)
// that no full cap and no held room explains (see deserved): some slot
// stayed taken after its request ended (or was never admitted). That is
// capacity lost.
func (tl *timeline) undeserved(refusals []outcome, from, to time.Time) []outcome {
	var out []outcome
	for _, r := range refusals {
		if !r.sent.Before(from) && r.done.Before(to) && !tl.deserved(r) {
			out = append(out, r)
		}
	}
	return out
}

// deserved reports whether refusal r is explained while it waited:
//   - its tenant, or the total, had no room for its cost at the backend
//     (for longer than tl.grace: a slot is given back in Redis up to a
//     renewal interval after its request ended); or
//   - its room was held (the engine's rule against starvation, see
//     limiter.Ledger): on the same instance, a request waiting at the
//     same time was refused by its tenant or the total, which it needed
//     too; each call of that instance then refuses everything behind
//     that waiter there. The test sees that waiter as a bigger request of
//     the same tenant (or of any tenant, for the total) waiting on the
//     same instance while its tenant (or the total) had no room for it. It
//     cannot see whether the waiter arrived first, as held room requires
//     (Caddy's arrival order), nor which constraint refused it, so it
//     takes either.
//
// Other instances' waiters hold nothing for r: held room lasts one call
// of one instance.
func (tl *timeline) deserved(r outcome) bool {
	cost := max(r.cost, 1)
	if tl.fullIn(r.key, cost, r.span()) || tl.fullIn("", cost, r.span()) {
		return true
	}
	for _, w := range tl.waits[r.instance] {
		if w.id == r.id || w.cost <= cost {
			continue
		}
		both := span{latest(r.sent, w.from), earliest(r.done, w.to)}
		if !both.from.Before(both.to) {
			continue
		}
		if w.key == r.key && tl.fullIn(r.key, w.cost, both) || tl.fullIn("", w.cost, both) {
			return true
		}
	}
	return false
}

// span is the stretch the request waited for its answer.
func (o outcome) span() span { return span{o.sent, o.done} }

// fullIn reports whether key ("": the total) had no room for cost at the
// backend in s as Redis saw it: from tl.grace before to admitSlack after.
func (tl *timeline) fullIn(key string, cost int, s span) bool {
	spans := tl.totalFull[cost]
	if key != "" {
		spans = tl.keyFull[fullAt{key, cost}]
	}
	for _, f := range spans {
		if f.overlaps(s.from.Add(-tl.grace), s.to.Add(admitSlack)) {
			return true
		}
	}
	return false
}

// lostWindow is how long after heal (and before until) a refusal was last
// undeserved: 0 if none was.
func (tl *timeline) lostWindow(refusals []outcome, heal, until time.Time) time.Duration {
	var w time.Duration
	for _, r := range tl.undeserved(refusals, heal, until) {
		w = max(w, r.done.Sub(heal))
	}
	return w
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// windows is what one fault cost, as measured.
type windows struct {
	fault         string
	overAdmission time.Duration
	capacityLost  time.Duration
	peakTenant    int
	peakTotal     int
}

func (w windows) String() string {
	return fmt.Sprintf("%s: over-admission window %v (peak tenant %d, total %d), capacity-lost window %v",
		w.fault, w.overAdmission.Round(10*time.Millisecond), w.peakTenant, w.peakTotal, w.capacityLost.Round(10*time.Millisecond))
}

// TestFaultChecker replays a made-up history: the checker finds the
// over-admission, ignores an overlap while a client that gave up is seen
// to leave, and tells a deserved refusal from one that lost capacity.
func TestFaultChecker(t *testing.T) {
	t0 := time.Now()
	at := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	rec := &recorder{events: []event{
		{at(0), "a", +1, 0}, {at(0), "a", +1, 0}, // a at its cap of 2
		{at(100), "a", +1, 7}, {at(105), "a", -1, 7}, // its client gave up at +100ms
		{at(200), "a", +1, 0}, {at(300), "a", +1, 0}, {at(400), "a", -1, 0}, {at(900), "a", -1, 0}, // over from 200 to 900, last admitted at 300
		{at(1000), "a", -1, 0}, {at(1000), "a", -1, 0}, // a empty from 1000 on
		{at(1500), "a", +1, 0}, {at(1800), "a", -1, 0}, // a holds 1 of 2 from 1500 to 1800
	}}
	gaveUp := []outcome{{id: 7, key: "a", sent: at(90), done: at(101), gaveUp: at(100)}}
	tl := rec.replay(caps{tenant: 2}, 150*time.Millisecond, gaveUp)
	if got := tl.overIn(at(0), at(2000)); got != 700*time.Millisecond {
		t.Errorf("over-admission for %v, want 700ms (the request whose client gave up at +100ms ended then)", got)
	}
	if got := rec.replay(caps{tenant: 2}, 150*time.Millisecond, nil).overIn(at(0), at(2000)); got != 705*time.Millisecond {
		t.Errorf("over-admission for %v with no client seen to give up, want 705ms (the 5 ms overlap counted)", got)
	}
	if got := tl.overWindow(at(250), at(2000)); got != 50*time.Millisecond {
		t.Errorf("over-admission window after +250ms: %v, want 50ms (the last admission over the cap at +300ms)", got)
	}
	if got := tl.overWindow(at(250), at(300)); got != 0 {
		t.Errorf("over-admission window from +250ms until +300ms: %v, want 0 (the admission at +300ms is after it)", got)
	}
	refusals := []outcome{
		{key: "a", sent: at(500), done: at(501), status: 429},            // a over its cap: deserved
		{key: "a", sent: at(1200), done: at(1201), status: 429},          // a empty for longer than the grace: capacity lost
		{key: "a", cost: 2, sent: at(1700), done: at(1701), status: 429}, // 1 + 2 > 2: deserved
		{key: "a", cost: 1, sent: at(1710), done: at(1711), status: 429}, // 1 + 1 fits: capacity lost
	}
	lost := tl.undeserved(refusals, at(0), at(2000))
	if len(lost) != 2 || lost[0].sent != at(1200) || lost[1].sent != at(1710) {
		t.Errorf("undeserved refusals %v, want those at +1200ms and +1710ms (cost 1 beside 1 of 2)", lost)
	}
}

// TestFaultCheckerHeldRoom: a refusal while a bigger request of its tenant
// waited on the same instance, without room for it, is deserved (that
// waiter held the room); the same refusal is capacity lost when the waiter
// was on another instance, had room, or had stopped waiting.
func TestFaultCheckerHeldRoom(t *testing.T) {
	t0 := time.Now()
	at := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	rec := &recorder{events: []event{
		{at(0), "b", +4, 0}, {at(2000), "b", -4, 0}, // b holds 4 of 6
		{at(0), "d", +2, 0}, {at(2000), "d", -2, 0}, // d holds 2 of 6
	}}
	requests := []outcome{
		{id: 1, key: "b", cost: 3, instance: 0, sent: at(100), done: at(800), status: 429}, // 4 + 3 > 6: deserved
		{id: 2, key: "b", cost: 1, instance: 0, sent: at(200), done: at(800), status: 429}, // behind 1 on its instance: deserved
		{id: 3, key: "b", cost: 1, instance: 1, sent: at(200), done: at(800), status: 429}, // 1 is on another instance: lost
		{id: 4, key: "d", cost: 3, instance: 0, sent: at(100), done: at(800), status: 429}, // 2 + 3 fits: lost
		{id: 5, key: "d", cost: 1, instance: 0, sent: at(200), done: at(800), status: 429}, // 4 had room, held none: lost
		{id: 6, key: "b", cost: 3, instance: 2, sent: at(100), done: at(150), status: 429}, // refused at +150ms: deserved
		{id: 7, key: "b", cost: 1, instance: 2, sent: at(300), done: at(900), status: 429}, // 6 waited no more: lost
	}
	tl := rec.replay(caps{tenant: 6}, 150*time.Millisecond, requests)
	if lost := lostIDs(tl, requests, at(0), at(2000)); !slices.Equal(lost, []int{3, 4, 5, 7}) {
		t.Errorf("refusals taken for capacity lost: %v, want [3 4 5 7] (2 is held back by 1, a cost-3 waiter of b on its instance with b at 4 of 6)", lost)
	}
}

// TestFaultCheckerClientLeftAsAdmitted: a request whose client left before
// it reached the backend may have been admitted in Redis as it left; a
// refusal is deserved if that request's units, at the moment its client
// left, leave no room, and capacity lost otherwise.
func TestFaultCheckerClientLeftAsAdmitted(t *testing.T) {
	t0 := time.Now()
	at := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	rec := &recorder{events: []event{
		{at(0), "e", +5, 0}, {at(2000), "e", -5, 0}, // e holds 5 of 6
		{at(0), "f", +4, 0}, {at(2000), "f", -4, 0}, // f holds 4 of 6
	}}
	requests := []outcome{
		{id: 1, key: "e", cost: 1, instance: 0, sent: at(100), done: at(300), gaveUp: at(300)}, // left at +300ms: 5 + 1 of 6
		{id: 2, key: "e", cost: 1, instance: 1, sent: at(400), done: at(1000), status: 429},    // within the grace after 1 left: deserved
		{id: 3, key: "e", cost: 1, instance: 1, sent: at(1000), done: at(1600), status: 429},   // long after: lost
		{id: 4, key: "f", cost: 1, instance: 0, sent: at(100), done: at(300), gaveUp: at(300)}, // left at +300ms: 4 + 1 of 6
		{id: 5, key: "f", cost: 1, instance: 1, sent: at(400), done: at(1000), status: 429},    // 4 left room: lost
	}
	tl := rec.replay(caps{tenant: 6}, 150*time.Millisecond, requests)
	if lost := lostIDs(tl, requests, at(0), at(2000)); !slices.Equal(lost, []int{3, 5}) {
		t.Errorf("refusals taken for capacity lost: %v, want [3 5] (2 is explained by 1, which may have held e's last unit as its client left)", lost)
	}
}

// lostIDs returns the ids of the refusals among requests that tl takes for
// capacity lost within [from, to).
func lostIDs(tl *timeline, requests []outcome, from, to time.Time) []int {
	var ids []int
	for _, r := range tl.undeserved(slices.DeleteFunc(slices.Clone(requests), func(o outcome) bool { return o.status == 0 }), from, to) {
		ids = append(ids, r.id)
	}
	return ids
}
