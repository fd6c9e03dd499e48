package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The fault suite: a fleet of three Caddy processes sharing caps in a real
// redis-server, a client mix that cancels, resets and waits, and one fault
// at a time. The checker replays what the backend saw and asserts #11's
// invariants, with the windows measured. INFLIGHT_FAULTS_LONG=1 runs every
// fault for longer, with the default 30s lease.

// faultTiming is how long the store's lease and each fault last. The
// other phases wait on the traffic itself (see repeat).
type faultTiming struct {
	lease time.Duration // the store's lease; renewal runs every lease/3
	fault time.Duration // how long the fault lasts
	// steady bounds the wait for a steady load: past it, the fleet is
	// not serving the load it should.
	steady time.Duration
}

func timings() faultTiming {
	if os.Getenv("INFLIGHT_FAULTS_LONG") != "" {
		return faultTiming{lease: 30 * time.Second, fault: 10 * time.Second, steady: time.Minute}
	}
	return faultTiming{lease: 2 * time.Second, fault: time.Second, steady: 15 * time.Second}
}

// storeTimeout is generous: on a loaded 2-core machine a loopback reply
// sometimes takes 200 ms, and the suite must not inject faults by itself.
const storeTimeout = 500 * time.Millisecond

// tenantCaps is each tenant's cap in the fault runs; withTotal adds a total
// that three busy tenants at 3 each (9) exceed, so it binds too. The polite
// tenant never needs more than one slot at once.
var (
	tenantCaps = caps{tenant: 3}
	withTotal  = caps{tenant: 3, total: 7}
)

var faultLoad = []tenantLoad{
	{key: "a", clients: 5, mix: rude},
	{key: "b", clients: 5, mix: rude},
	{key: "c", clients: 5, mix: rude},
	{key: "a", clients: 1, mix: []behaviour{streams}},
	{key: "b", clients: 1, mix: []behaviour{streams}},
	{key: "polite", clients: 1, mix: []behaviour{polite}},
}

// faultEnv is one fault run: Redis, a fault proxy per instance (when on
// one server), the fleet, the backend, the traffic.
type faultEnv struct {
	t       *testing.T
	timing  faultTiming
	redis   *redisServer
	proxies []*faultProxy
	rec     *recorder
	caps    caps
	onError string
	maxCost int  // 1: every request costs 1
	fair    bool // the busy tenants share the total fairly
	fleet   []*fleetMember
	traffic *traffic
	start   time.Time
}

// newFaultEnv runs a fleet of three on one redis-server, each instance
// through a fault proxy of its own.
func newFaultEnv(t *testing.T, site faultSite, c caps) *faultEnv {
	t.Helper()
	r := startRedis(t)
	var proxies []*faultProxy
	var addrs []string
	for range 3 {
		proxies = append(proxies, newFaultProxy(t, r.addr))
		addrs = append(addrs, proxies[len(proxies)-1].addr)
	}
	e := startFaultFleet(t, site, c, addrs...)
	e.redis, e.proxies = r, proxies
	return e
}

// startFaultFleet runs an instance for each Redis address and the backend,
// with the suite's lease and timeout.
func startFaultFleet(t *testing.T, site faultSite, c caps, addrs ...string) *faultEnv {
	t.Helper()
	e := &faultEnv{t: t, timing: timings(), rec: newRecorder(t), caps: c, onError: site.onError, maxCost: 1, fair: site.fair}
	if site.cost {
		e.maxCost = maxCost
	}
	// A waiter's wait outlasts what admitting it may take with Redis 100 ms
	// away (the latency case): a release notice, the zone's call under way
	// and its own, each a round trip (group commit, docs/fleet.md, "How it works").
	site.lease, site.timeout, site.wait = e.timing.lease, storeTimeout, 600*time.Millisecond
	site.tenantMax, site.total = c.tenant, c.total
	var sites []faultSite
	for _, a := range addrs {
		site.address = a
		sites = append(sites, site)
	}
	e.fleet = startFleet(t, sites, e.rec.addr)
	return e
}

// everyProxy applies a fault to every instance's way to Redis.
func (e *faultEnv) everyProxy(fault func(p *faultProxy)) {
	for _, p := range e.proxies {
		fault(p)
	}
}

func (e *faultEnv) urls() []string {
	var urls []string
	for _, m := range e.fleet {
		urls = append(urls, m.url)
	}
	return urls
}

// run sends traffic until the load is steady, applies the fault (which
// returns when Redis answered again, or when the fault ends), keeps the
// traffic on for bound and until the load is steady again, and returns
// the times the fault began and healed.
func (e *faultEnv) run(bound time.Duration, fault func(e *faultEnv) (healed time.Time)) (began, healed time.Time) {
	c := e.repeat(1, bound, fault)[0]
	return c.began, c.healed
}

// cycle is one fault of a run: when it began, and when it healed.
type cycle struct{ began, healed time.Time }

// repeat is run with the fault applied n times, each once the load is
// steady, and followed by bound and until it is steady again: every busy
// tenant was back at its cap at the backend, its slots taken over by new
// requests, so a window longer than bound would have shown.
func (e *faultEnv) repeat(n int, bound time.Duration, fault func(e *faultEnv) (healed time.Time)) []cycle {
	e.start = time.Now()
	e.traffic = startTraffic(e.t, e.urls(), e.maxCost, e.timing.lease*3/2, faultLoad...)
	if !e.steady(e.start) {
		e.t.Fatalf("before any fault, the load never became steady in %v (each busy tenant at its cap at the backend, then its slots taken over); statuses by tenant: %v",
			e.timing.steady, e.traffic.statuses())
	}
	var cycles []cycle
	for i := range n {
		began := time.Now()
		healed := fault(e)
		cycles = append(cycles, cycle{began, healed})
		time.Sleep(time.Until(healed.Add(bound)))
		since := time.Now()
		if !e.steady(since) {
			e.t.Errorf("after fault %d healed, the load never became steady again in %v after its bound %v; statuses by tenant: %v",
				i+1, e.timing.steady, bound, e.traffic.statuses())
		}
		e.t.Logf("fault %d: began once the load was steady (+%v), healed %v later, steady again %v after the bound",
			i+1, began.Sub(e.start).Round(time.Millisecond), healed.Sub(began).Round(time.Millisecond), time.Since(since).Round(time.Millisecond))
	}
	e.traffic.stop()
	return cycles
}

// busyTenants are the tenants of faultLoad whose clients keep more
// requests on than their cap.
var busyTenants = []string{"a", "b", "c"}

// steady waits until, since since, every busy tenant has held at the
// backend as many units as leave no room for a request of the largest
// cost, and then cap more units arrived for it (its slots taken over),
// and the total (if any) was as full. Where the busy tenants share the
// total fairly, a tenant's cap is its fair share of the total (the busy
// tenants' demand exceeds it): a fleet that shares exactly seldom lets
// one reach its own cap. It reports false if that took longer than
// timing.steady.
func (e *faultEnv) steady(since time.Time) bool {
	room := e.maxCost - 1 // units short of the cap that leave no room
	tenantCap := e.caps.tenant
	if e.fair {
		tenantCap = min(tenantCap, e.caps.total/len(busyTenants))
	}
	full := map[string]bool{}
	after := map[string]int{} // units arrived since the tenant was full
	count, sum, totalFull, seen := map[string]int{}, 0, e.caps.total == 0, 0
	deadline := time.Now().Add(e.timing.steady)
	for {
		e.rec.mu.Lock()
		events := e.rec.events[seen:]
		seen = len(e.rec.events)
		e.rec.mu.Unlock()
		for _, ev := range events {
			count[ev.key] += ev.delta
			sum += ev.delta
			if ev.at.Before(since) {
				continue
			}
			if full[ev.key] && ev.delta > 0 {
				after[ev.key] += ev.delta
			}
			full[ev.key] = full[ev.key] || count[ev.key] >= tenantCap-room
			totalFull = totalFull || sum >= e.caps.total-room
		}
		done := totalFull
		for _, k := range busyTenants {
			done = done && after[k] >= tenantCap
		}
		if done {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// answered returns when Redis first answered a PING through each of these
// proxies, the way the fleet reaches it, from now on: the moment a fault
// healed. Without proxies, now.
func (e *faultEnv) answered(proxies ...*faultProxy) time.Time {
	healed := time.Now()
	for _, p := range proxies {
		healed = latest(healed, p.pong(e.t, e.timing.steady))
	}
	return healed
}

// check asserts the invariants of #11 on a run: exact before the fault;
// after it healed, over-admission and lost capacity end within bound; an
// outage is logged once when it starts and once when it ends, and only
// then.
func (e *faultEnv) check(name string, began, healed time.Time, bound time.Duration, outage bool) windows {
	e.t.Helper()
	return e.checkCycles(name, []cycle{{began, healed}}, bound, outage)
}

// checkCycles is check on a run of several faults: the windows are the
// longest after any of them, each measured until the next began.
func (e *faultEnv) checkCycles(name string, cycles []cycle, bound time.Duration, outage bool) windows {
	t := e.t
	t.Helper()
	// The bound: no slot stays taken for a request that has ended
	// for longer than one renewal interval.
	tl := e.rec.replay(e.caps, e.timing.lease/3, e.traffic.all())
	refusals := e.traffic.refusals()
	w := windows{fault: name, peakTenant: tl.peakTenant, peakTotal: tl.peakTotal}
	for i, c := range cycles {
		until := time.Now()
		if i+1 < len(cycles) {
			until = cycles[i+1].began
		}
		w.overAdmission = max(w.overAdmission, tl.overWindow(c.healed, until))
		w.capacityLost = max(w.capacityLost, tl.lostWindow(refusals, c.healed, until))
	}
	began := cycles[0].began
	t.Log(w)
	t.Logf("statuses by tenant: %v", e.traffic.statuses())
	if d := tl.overIn(e.start, began); d > 0 {
		t.Errorf("while Redis answered within timeout (before any fault), the backend held more than the caps %v (tenant %d, total %d) for %v",
			e.caps, tl.peakTenant, tl.peakTotal, d)
	}
	if lost := tl.undeserved(refusals, e.start, began); len(lost) > 0 {
		t.Errorf("while Redis answered within timeout (before any fault), %d refusals while neither their tenant nor the total was at its cap at the backend, first: tenant %s at +%v, %d after %v",
			len(lost), lost[0].key, lost[0].sent.Sub(e.start).Round(time.Millisecond), lost[0].status, lost[0].done.Sub(lost[0].sent).Round(time.Millisecond))
	}
	if w.overAdmission > bound {
		t.Errorf("over-admission lasted %v after Redis was reachable again, want at most %v", w.overAdmission, bound)
	}
	if w.capacityLost > bound {
		t.Errorf("capacity was lost (refusals with the backend below the caps) for %v after the fault, want at most %v", w.capacityLost, bound)
	}
	if most := e.mostAfterAFault(e.caps.tenant); w.peakTenant > most {
		t.Errorf("a tenant had %d units at the backend, want at most %d of its cap %d (fleet-guarantees.md, when Redis loses its data)", w.peakTenant, most, e.caps.tenant)
	}
	if most := e.mostAfterAFault(e.caps.total); e.caps.total > 0 && w.peakTotal > most {
		t.Errorf("the backend held %d units in all, want at most %d of the total %d (fleet-guarantees.md, when Redis loses its data)", w.peakTotal, most, e.caps.total)
	}
	for i, m := range e.fleet {
		down, up := m.outageLines()
		switch {
		case !outage && len(down) > 0:
			t.Errorf("instance %d logged %d times that Redis was unreachable, though it always answered within timeout; first: %s", i, len(down), down[0])
		case outage && (len(down) > len(cycles) || len(up) > len(cycles)):
			t.Errorf("instance %d logged %d outages as %d × unreachable and %d × reachable again, want once each per outage; unreachable: %s",
				i, len(cycles), len(down), len(up), down)
		}
	}
	return w
}

// mostAfterAFault is the most units a fault may let a cap of capacity have
// at the backend, as fleet-guarantees.md states it: the units Redis
// counted, as many again that it lost and granted anew, and with on_error
// open what each instance admitted alone, within its share, while Redis
// was down.
func (e *faultEnv) mostAfterAFault(capacity int) int {
	most := 2 * capacity
	if e.onError == "open" {
		n := len(e.fleet)
		most += n * ((capacity + n - 1) / n)
	}
	return most
}

// wantOutages asserts that every instance logged each of n outages, once
// when it started and once when it ended: a fault that every instance
// sees (Redis gone) is not logged as less, nor as more.
func (e *faultEnv) wantOutages(n int) {
	e.t.Helper()
	for i, m := range e.fleet {
		down, up := m.outageLines()
		if len(down) != n || len(up) != n {
			e.t.Errorf("instance %d logged %d outages as %d × unreachable and %d × reachable again, want %d each; unreachable: %s", i, n, len(down), len(up), n, down)
		}
	}
}

// outageLines returns m's lines that say an outage started and that one
// ended, once every outage logged as started is logged as over, or after
// a second and a half: the closing line comes once Redis has answered for
// a second (outageQuiet).
func (m *fleetMember) outageLines() (down, up []string) {
	deadline := time.Now().Add(storeBackOff + 500*time.Millisecond)
	for {
		down, up = m.logLines("redis store unreachable"), m.logLines("redis store reachable again")
		if len(up) >= len(down) || time.Now().After(deadline) {
			return down, up
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// storeBackOff is how long the store leaves Redis alone after a failed
// call (book.available).
const storeBackOff = time.Second

// renewalBound is how soon after a fault the issue wants the fleet exact
// and whole again: one renewal interval, plus the renewal's own round trip.
func (e *faultEnv) renewalBound() time.Duration { return e.timing.lease/3 + storeTimeout }

// faultCase is one fault: how it is done and what it may cost.
type faultCase struct {
	name    string
	onError string
	outage  bool // some instance cannot reach Redis within timeout for a while
	exact   bool // Redis answers within timeout and keeps its data: the caps hold throughout
	// bound on the over-admission and capacity-lost windows after healing;
	// nil: one renewal interval.
	bound  func(e *faultEnv) time.Duration
	inject func(e *faultEnv) (healed time.Time)
}

var faultCases = []faultCase{
	{name: "latency 100ms (within timeout)", onError: "closed", exact: true, inject: func(e *faultEnv) time.Time {
		e.everyProxy(func(p *faultProxy) { p.SetLatency(50 * time.Millisecond) }) // each way
		time.Sleep(e.timing.fault)
		e.everyProxy(func(p *faultProxy) { p.SetLatency(0) })
		return e.answered(e.proxies...)
	}},
	{name: "stall longer than timeout", onError: "closed", outage: true, inject: func(e *faultEnv) time.Time {
		e.everyProxy((*faultProxy).Stall)
		time.Sleep(e.timing.fault)
		e.everyProxy((*faultProxy).Resume)
		return e.answered(e.proxies...)
	}},
	{name: "packets dropped", onError: "open", outage: true, inject: func(e *faultEnv) time.Time {
		e.everyProxy(func(p *faultProxy) { p.Drop(true) })
		time.Sleep(e.timing.fault)
		e.everyProxy(func(p *faultProxy) { p.Drop(false) })
		return e.answered(e.proxies...)
	}},
	{name: "partition of one instance", onError: "open", outage: true, inject: func(e *faultEnv) time.Time {
		e.proxies[0].Drop(true)
		time.Sleep(e.timing.fault)
		e.proxies[0].Drop(false)
		return e.answered(e.proxies[0])
	}},
	{name: "connections reset", onError: "closed", outage: true, inject: func(e *faultEnv) time.Time {
		e.everyProxy((*faultProxy).Reset)
		return e.answered(e.proxies...)
	}},
	// #29: a reply lost to a reset must not leave a lease nobody renews or
	// removes, and the flapping is one outage in the log.
	{name: "connections reset every 200ms", onError: "closed", outage: true, inject: func(e *faultEnv) time.Time {
		for end := time.Now().Add(3 * e.timing.fault); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
			e.everyProxy((*faultProxy).Reset)
		}
		return e.answered(e.proxies...)
	}},
	{name: "FLUSHALL", onError: "closed", inject: func(e *faultEnv) time.Time {
		if err := e.redis.do(e.t, "flushall").Err(); err != nil {
			e.t.Fatal(err)
		}
		return time.Now()
	}},
	{name: "restart with empty data", onError: "open", outage: true, inject: restartEmpty},
	{name: "restart with empty data", onError: "closed", outage: true, inject: restartEmpty},
	{name: "SIGSTOP, SIGCONT", onError: "closed", outage: true, inject: func(e *faultEnv) time.Time {
		e.redis.pause()
		time.Sleep(e.timing.fault)
		e.redis.unpause()
		return e.answered(e.proxies...)
	}},
	// A script waits in Redis's socket for the whole stop: it must not
	// write a lease once the book stopped removing it.
	{name: "SIGSTOP for 2× the lease, SIGCONT", onError: "closed", outage: true, inject: func(e *faultEnv) time.Time {
		e.redis.pause()
		time.Sleep(2 * e.timing.lease)
		e.redis.unpause()
		return e.answered(e.proxies...)
	}},
	{name: "reloads every 200ms changing store options", onError: "closed", exact: true, inject: func(e *faultEnv) time.Time {
		e.reloadEvery(200*time.Millisecond, e.timing.fault)
		return time.Now()
	}},
	{name: "SIGKILL of a Caddy instance", onError: "closed",
		// The README's promise: a crashed instance's slots come back within
		// lease of its last renewal.
		bound: func(e *faultEnv) time.Duration { return e.timing.lease + e.timing.lease/3 },
		inject: func(e *faultEnv) time.Time {
			e.fleet[0].kill()
			return time.Now()
		}},
}

// restartEmpty stops Redis for the fault's time and starts it with no
// data.
func restartEmpty(e *faultEnv) time.Time {
	e.redis.stop()
	time.Sleep(e.timing.fault)
	e.redis.start(e.t)
	return e.answered(e.proxies...)
}

// TestFaults runs every fault against a fresh fleet and logs the table of
// windows for the README.
//
// The fleet's tests (TestFaults*) run processes of their own (Redis, Caddy,
// a backend) on ports of their own, and nothing of the in-process Caddy:
// they are parallel tests, so they run once the package's other tests are
// done, as many at once as -parallel allows (GOMAXPROCS: two on two cores),
// their fault cases included; `-parallel 1` runs them one at a time.
func TestFaults(t *testing.T) {
	t.Parallel()
	runFaults(t, faultCases, tenantCaps, faultSite{})
}

// runFaults runs each fault case against a fresh fleet, as many at once as
// -parallel allows (each has its own Redis, proxies, fleet and backend;
// -parallel 1 runs them one at a time), with the caps and, if cost,
// requests of costs 1 to maxCost; and logs the table of windows.
func runFaults(t *testing.T, cases []faultCase, c caps, opts faultSite) {
	table := make([]windows, len(cases)) // in the order of cases
	t.Run("each", func(t *testing.T) {
		for i, f := range cases {
			t.Run(strings.NewReplacer(" ", "_", ",", "").Replace(f.name), func(t *testing.T) {
				t.Parallel()
				site := opts
				site.onError = f.onError
				e := newFaultEnv(t, site, c)
				bound := e.renewalBound()
				if f.bound != nil {
					bound = f.bound(e)
				}
				began, healed := e.run(bound, f.inject)
				if f.exact {
					began = time.Now() // the checks of the time before a fault hold for the whole run
				}
				table[i] = e.check(f.name+opts.variant()+", on_error "+f.onError, began, healed, bound, f.outage)
			})
		}
	})
	printTable(t, table)
}

// TestFaultsTotal: with a total that binds, the client mix over the fleet
// never gets more than the caps to the backend, and no refusal is
// undeserved.
func TestFaultsTotal(t *testing.T) {
	t.Parallel() // see TestFaults
	r := startRedis(t)
	e := startFaultFleet(t, faultSite{onError: "closed"}, withTotal, r.addr, r.addr, r.addr)
	e.run(0, func(e *faultEnv) time.Time {
		time.Sleep(e.timing.fault)
		return time.Now()
	})
	end := time.Now()
	e.check("client mix, no fault, with a total", end, end, 0, false)
}

// TestFaultsCost runs faults of each kind with requests of costs 1 to 3
// (X-Cost, drawn per request) under a tenant cap of 6 units: the caps hold in
// units at the backend as they do in requests, with the same bounds after
// healing.
func TestFaultsCost(t *testing.T) {
	t.Parallel() // see TestFaults
	cases := faultCasesNamed("latency 100ms (within timeout)", "connections reset", "connections reset every 200ms", "restart with empty data", "SIGSTOP for 2× the lease, SIGCONT")
	runFaults(t, cases, caps{tenant: 6}, faultSite{cost: true})
}

// TestFaultsFair runs faults of each kind with the tenants sharing a total
// that binds fairly (fair tenant), on the zone's one fair clock in Redis:
// the caps hold and no refusal is undeserved, with the same bounds after
// healing, while the clock refuses requests whose tenant is ahead of one
// waiting at another instance.
func TestFaultsFair(t *testing.T) {
	t.Parallel() // see TestFaults
	cases := faultCasesNamed("latency 100ms (within timeout)", "packets dropped", "restart with empty data", "SIGSTOP for 2× the lease, SIGCONT")
	runFaults(t, cases, withTotal, faultSite{fair: true})
}

// faultCasesNamed returns the fault cases of these names, in the suite's
// order.
func faultCasesNamed(names ...string) []faultCase {
	var cases []faultCase
	for _, f := range faultCases {
		if slices.Contains(names, f.name) {
			cases = append(cases, f)
		}
	}
	return cases
}

// reloadEvery reloads every instance every interval for d, alternating the
// store's timeout, so that each reload builds a new Redis client.
func (e *faultEnv) reloadEvery(interval, d time.Duration) {
	start := time.Now()
	for i := 0; time.Since(start) < d; i++ {
		for n, m := range e.fleet {
			site := m.site
			site.timeout = storeTimeout + time.Duration(1-i%2)*50*time.Millisecond
			if err := m.reload(site, e.rec.addr); err != nil {
				e.t.Errorf("reload %d of instance %d: %v", i, n, err)
			}
		}
		time.Sleep(time.Until(start.Add(time.Duration(i+1) * interval)))
	}
}

// printTable logs the measured windows as the README's table.
func printTable(t *testing.T, table []windows) {
	var b strings.Builder
	b.WriteString("| fault | over-admission window | capacity-lost window |\n|---|---|---|\n")
	for _, w := range table {
		fmt.Fprintf(&b, "| %s | %v | %v |\n", w.fault, w.overAdmission.Round(10*time.Millisecond), w.capacityLost.Round(10*time.Millisecond))
	}
	t.Logf("lease %v, timeout %v:\n%s", timings().lease, storeTimeout, b.String())
}

// TestFaultsReleaseDoesNotDelayTheResponse compares the median time to a
// whole response with Redis 200 ms away (a round trip) and without delay.
// One client at a time: the admission waits for Redis, one round trip, and
// the release must not hold the response (a second). Ten clients at once:
// a request that arrives while the zone's admission call is under way goes
// in the next (group commit), so it may wait one round trip more, never
// the release's as well. The median of 30 and of 100 samples: a release
// on the response path adds its round trip to every response, the median
// included, while a loaded machine's scheduling stalls reach the upper
// samples (a p99 of 30 or 100 samples would be their maximum).
func TestFaultsReleaseDoesNotDelayTheResponse(t *testing.T) {
	t.Parallel() // see TestFaults
	const rtt = 200 * time.Millisecond
	r := startRedis(t)
	p := newFaultProxy(t, r.addr)
	site := faultSite{address: p.addr, lease: 3 * time.Second, timeout: time.Second, onError: "closed", tenantMax: 3}
	url := startFleet(t, []faultSite{site}, newRecorder(t).addr)[0].url
	median := func(clients, each int) time.Duration {
		var took []time.Duration
		var mu sync.Mutex
		var wg sync.WaitGroup
		for w := range clients {
			wg.Go(func() {
				for range each {
					start := time.Now()
					res := get(context.Background(), http.DefaultClient, url+"/work", "X-Tenant", strconv.Itoa(w))
					if res.status != http.StatusOK {
						t.Errorf("request: %d %v", res.status, res.err)
					}
					mu.Lock()
					took = append(took, time.Since(start))
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return percentile(took, 50)
	}
	median(10, 1) // the scripts are loaded, connections made
	alonePlain, busyPlain := median(1, 30), median(10, 10)
	p.SetLatency(rtt / 2)
	alone, busy := median(1, 30), median(10, 10)
	t.Logf("median response completion with Redis %v away: one client %v (%v without delay), ten %v (%v)", rtt, alone, alonePlain, busy, busyPlain)
	if alone-alonePlain > rtt*3/2 {
		t.Errorf("one client: responses complete %v later (median of 30): the release is on the response path (want less than %v: the admission's round trip alone)",
			alone-alonePlain, rtt*3/2)
	}
	if busy-busyPlain > rtt*5/2 {
		t.Errorf("ten clients: responses complete %v later (median of 100), want less than %v: the admission's round trip and at most one call under way before it",
			busy-busyPlain, rtt*5/2)
	}
}

// percentile returns the p-th percentile of samples: the smallest that
// at least p % of them do not exceed.
func percentile(samples []time.Duration, p int) time.Duration {
	slices.Sort(samples)
	return samples[(len(samples)*p+99)/100-1]
}
