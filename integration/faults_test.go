package integration

import (
	"os"
	"testing"
	"time"
)

// The fault suite: a fleet of three Caddy processes sharing caps in a real
// redis-server, a client mix that cancels, resets and waits, and one fault
// at a time. The checker replays what the backend saw and asserts #11's
// invariants, with the windows measured. INFLIGHT_FAULTS_LONG=1 runs every
// fault for longer, with the default 30s lease.
//
// The scenarios land as the store's fixes they need land (#11); until
// then they live on the faults branch.

// faultTiming is how long each phase of a fault run lasts.
type faultTiming struct {
	lease  time.Duration // the store's lease; renewal runs every lease/3
	warm   time.Duration // traffic before the fault
	fault  time.Duration // how long the fault lasts
	settle time.Duration // traffic after it healed
}

func timings() faultTiming {
	if os.Getenv("INFLIGHT_FAULTS_LONG") != "" {
		return faultTiming{lease: 30 * time.Second, warm: 5 * time.Second, fault: 10 * time.Second, settle: 40 * time.Second}
	}
	return faultTiming{lease: 2 * time.Second, warm: time.Second, fault: time.Second, settle: 3 * time.Second}
}

const storeTimeout = 200 * time.Millisecond

// tenantCaps is each tenant's cap in the fault runs. The polite tenant
// never needs more than one slot at once.
var tenantCaps = caps{tenant: 3}

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
	fleet   []*fleetMember
	traffic *traffic
	start   time.Time
}

// newFaultEnv runs a fleet of three on one redis-server, each instance
// through a fault proxy of its own.
func newFaultEnv(t *testing.T, onError string) *faultEnv {
	t.Helper()
	r := startRedis(t)
	var proxies []*faultProxy
	var addrs []string
	for range 3 {
		proxies = append(proxies, newFaultProxy(t, r.addr))
		addrs = append(addrs, proxies[len(proxies)-1].addr)
	}
	e := startFaultFleet(t, faultSite{onError: onError}, tenantCaps, addrs...)
	e.redis, e.proxies = r, proxies
	return e
}

// startFaultFleet runs an instance for each Redis address and the backend,
// with the suite's lease and timeout.
func startFaultFleet(t *testing.T, site faultSite, c caps, addrs ...string) *faultEnv {
	t.Helper()
	e := &faultEnv{t: t, timing: timings(), rec: newRecorder(t), caps: c}
	site.lease, site.timeout, site.wait = e.timing.lease, storeTimeout, 300*time.Millisecond
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

// run sends traffic for the warm-up, applies the fault (which returns when
// Redis is reachable again, or when the fault ends), keeps the traffic on
// to settle, and returns the times the fault began and healed.
func (e *faultEnv) run(fault func(e *faultEnv) (healed time.Time)) (began, healed time.Time) {
	e.start = time.Now()
	e.traffic = startTraffic(e.t, e.urls(), e.timing.lease*3/2, faultLoad...)
	time.Sleep(e.timing.warm)
	began = time.Now()
	healed = fault(e)
	time.Sleep(e.timing.settle)
	e.traffic.halt()
	return began, healed
}

// check asserts the invariants of #11 on a run: exact before the fault;
// after it healed, over-admission and lost capacity end within bound; an
// outage is logged once when it starts and once when it ends, and only
// then.
func (e *faultEnv) check(name string, began, healed time.Time, bound time.Duration, outage bool) windows {
	t := e.t
	t.Helper()
	tl := e.rec.replay(e.caps)
	refusals := e.traffic.refusals()
	w := windows{fault: name, overAdmission: tl.overWindow(healed), capacityLost: tl.lostWindow(refusals, healed),
		peakTenant: tl.peakTenant, peakTotal: tl.peakTotal}
	t.Log(w)
	t.Logf("statuses by tenant: %v", e.traffic.statuses())
	if d := tl.overIn(e.start, began); d > 0 {
		t.Errorf("while Redis answered within timeout, before the fault, the backend held more than the caps %v (tenant %d, total %d) for %v",
			e.caps, tl.peakTenant, tl.peakTotal, d)
	}
	if lost := tl.undeserved(refusals, e.start, began); len(lost) > 0 {
		t.Errorf("before the fault, %d refusals while neither their tenant nor the total was at its cap at the backend, first: %+v", len(lost), lost[0])
	}
	if w.overAdmission > bound {
		t.Errorf("over-admission lasted %v after Redis was reachable again, want at most %v", w.overAdmission, bound)
	}
	if w.capacityLost > bound {
		t.Errorf("capacity was lost (refusals with the backend below the caps) for %v after the fault, want at most %v", w.capacityLost, bound)
	}
	for i, m := range e.fleet {
		down, up := m.logLines("redis store unreachable"), m.logLines("redis store reachable again")
		switch {
		case !outage && down > 0:
			t.Errorf("instance %d logged %d times that Redis was unreachable, though it always answered within timeout", i, down)
		case outage && (down > 1 || up > 1):
			t.Errorf("instance %d logged one outage as %d × unreachable and %d × reachable again, want once each", i, down, up)
		}
	}
	return w
}

// renewalBound is how soon after a fault the issue wants the fleet exact
// and whole again: one renewal interval, plus the renewal's own round trip.
func (e *faultEnv) renewalBound() time.Duration { return e.timing.lease/3 + storeTimeout }
