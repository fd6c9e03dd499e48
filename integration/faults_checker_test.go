package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// recorder is the real backend of the fault suite. It holds each request
// for ?ms= milliseconds (or until the client goes) and records when each
// arrived and left, by tenant, so the checker can replay the concurrency
// the backend saw over time.
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
	rec.record(key, +units)
	defer rec.record(key, -units)
	io.Copy(io.Discard, r.Body)
	ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
	select {
	case <-time.After(time.Duration(ms) * time.Millisecond):
		io.WriteString(w, "ok")
	case <-r.Context().Done():
	}
}

func (rec *recorder) record(key string, delta int) {
	rec.mu.Lock()
	rec.events = append(rec.events, event{time.Now(), key, delta})
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
// no room for a request of each cost (so its refusal then was deserved).
type timeline struct {
	over       []overSpan
	peakTenant int
	peakTotal  int
	keyFull    map[fullAt][]span
	totalFull  map[int][]span // by cost
	grace      time.Duration  // how long a slot may stay taken after its request ended
}

// fullAt is a tenant without room for a request of cost.
type fullAt struct {
	key  string
	cost int
}

// replay sweeps the recorded events in order; grace is how long a slot may
// stay taken after its request ended.
func (rec *recorder) replay(c caps, grace time.Duration) *timeline {
	rec.mu.Lock()
	events := append([]event(nil), rec.events...)
	rec.mu.Unlock()
	tl := &timeline{keyFull: map[fullAt][]span{}, totalFull: map[int][]span{}, grace: grace}
	count := map[string]int{}
	sum, overKeys := 0, 0
	var overSince, overAdmitted time.Time
	keySince, totalSince := map[fullAt]time.Time{}, map[int]time.Time{}
	end := time.Now().Add(time.Hour) // spans still open at the end
	for _, e := range events {
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
		case wasOver && !isOver && e.at.Sub(overSince) > overlapSlack:
			tl.over = append(tl.over, overSpan{span{overSince, e.at}, overAdmitted})
		}
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

// overlapSlack is how long the backend may seem to hold more than the caps
// without it counting: a client's cancellation reaches the backend (through
// Caddy's upstream connection closing) a moment after Caddy has given its
// slot to the next request.
const overlapSlack = 20 * time.Millisecond

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
// before its request reaches the backend.
const admitSlack = 150 * time.Millisecond

// undeserved returns the refusals sent and answered within [from, to)
// while the backend had not had the tenant, nor the total, without room
// for the request's cost for longer than tl.grace: some slot stayed taken
// longer than that after its request ended (or was never admitted). That
// is capacity lost.
func (tl *timeline) undeserved(refusals []outcome, from, to time.Time) []outcome {
	var out []outcome
next:
	for _, r := range refusals {
		if r.sent.Before(from) || !r.done.Before(to) {
			continue
		}
		a, b := r.sent.Add(-tl.grace), r.done.Add(admitSlack)
		cost := max(r.cost, 1)
		for _, s := range append(tl.keyFull[fullAt{r.key, cost}], tl.totalFull[cost]...) {
			if s.overlaps(a, b) {
				continue next
			}
		}
		out = append(out, r)
	}
	return out
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
// over-admission, ignores an overlap shorter than overlapSlack, and tells a
// deserved refusal from one that lost capacity.
func TestFaultChecker(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	rec := &recorder{}
	for _, e := range []struct {
		ms    int
		key   string
		delta int
	}{
		{0, "a", +1}, {0, "a", +1}, // a at its cap of 2
		{100, "a", +1}, {105, "a", -1}, // an overlap of 5 ms: a cancellation seen late
		{200, "a", +1}, {300, "a", +1}, {400, "a", -1}, {900, "a", -1}, // over from 200 to 900, last admitted at 300
		{1000, "a", -1}, {1000, "a", -1}, // a empty from 1000 on
		{1500, "a", +1}, {1800, "a", -1}, // a holds 1 of 2 from 1500 to 1800
	} {
		rec.events = append(rec.events, event{at(e.ms), e.key, e.delta})
	}
	tl := rec.replay(caps{tenant: 2}, 150*time.Millisecond)
	if got := tl.overIn(at(0), at(2000)); got != 700*time.Millisecond {
		t.Errorf("over-admission for %v, want 700ms (the 5 ms overlap ignored)", got)
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
