package limiter

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddy-inflight/caddy-inflight/inflight/internal/fleetref"
)

// The README's tenant example, in virtual time: a map gives acme a cap of
// 30, globex 20 and requests without a key (anonymous) 5; the total is 40,
// requests wait up to 30 s, and the backend holds each 500 ms. 80 clients
// each for acme and globex and 10 anonymous ones send request after
// request. Measured over 60 s after a 5 s warm-up: the units the backend
// held on average, and each tenant's share of the request-seconds. With
// instances, the zone is a fleet of that many on the ledger's reference
// rules, each client sending to one of them.
type tenantExample struct {
	fair      bool
	priority  map[string]Class // by tenant; none: normal
	instances int              // 0: one zone, no ledger
}

var tenantCaps = map[string]int64{"acme": 30, "globex": 20, "anonymous": 5}

// run returns the backend's average units held and each tenant's share.
func (x tenantExample) run(t *testing.T) (held float64, share map[string]float64) {
	const (
		service = 500 * time.Millisecond
		warmUp  = 5 * time.Second
		window  = 60 * time.Second
	)
	zones := []*Zone{NewZone(1, true, nil)}
	if x.instances > 0 {
		zones = fleetZones(t, fleetref.NewFleet(), x.instances, 1, true)
	}
	lim := &Limits{Max: []int64{0}, Total: 40}
	start := time.Now()
	from, to := start.Add(warmUp), start.Add(warmUp+window)
	var mu sync.Mutex
	seconds := map[string]float64{}
	var wg sync.WaitGroup
	if x.instances > 0 {
		wg.Go(func() { checkShortIndexes(t, zones, to) })
	}
	for tenant, clients := range map[string]int{"acme": 80, "globex": 80, "anonymous": 10} {
		opt := WaitOptions{Wait: 30 * time.Second, Fair: x.fair, Class: Normal}
		if c, ok := x.priority[tenant]; ok {
			opt.Class = c
		}
		for c := range clients {
			z := zones[c%len(zones)]
			wg.Go(func() {
				for time.Now().Before(to) {
					r := &Request{Keys: []string{tenant}, Max: []int64{tenantCaps[tenant]}, Limits: lim}
					if res := z.Acquire(context.Background(), r, opt); res.Outcome != Admitted {
						continue // timed out: the client sends the next
					}
					began := time.Now()
					time.Sleep(service)
					// The part of [began, now) within the window.
					overlap := minTime(time.Now(), to).Sub(maxTime(began, from)).Seconds()
					mu.Lock()
					seconds[tenant] += max(overlap, 0)
					mu.Unlock()
					r.slot.Release()
				}
			})
		}
	}
	wg.Wait()
	for _, z := range zones {
		if waitingIn(z) != 0 || unitsIn(z, TotalDim) != 0 {
			t.Fatalf("left behind: %d waiting, %d held", waitingIn(z), unitsIn(z, TotalDim))
		}
	}
	var sum float64
	for _, s := range seconds {
		sum += s
	}
	share = map[string]float64{}
	for tenant, s := range seconds {
		share[tenant] = s / sum
	}
	return sum / window.Seconds(), share
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// fleetAnonymousAtLeast is anonymous's least share over a fleet: its cap
// is its whole share, and a unit of its key can sit at one instance,
// held for a request there that lacks a unit of the total, while another
// instance has a unit of the total but none of the key.
// docs/fleet-guarantees.md gives what was measured.
const fleetAnonymousAtLeast = 0.09

// fleetSharedAtLeast is acme's and globex's least share over a fleet
// (their max-min share is 0.4375): globex's cap, 20, leaves it little
// room beyond its share, so it loses some of it as anonymous does. One
// run of 501 went below 0.40 (globex 0.398, inside the whole suite);
// docs/fleet-guarantees.md gives what was measured.
const fleetSharedAtLeast = 0.39

// TestTenantExampleKeepsTheBackendBusy: whatever the order (fair by
// tenant, first come, or the capped tenant first by priority), in one
// zone or over a fleet of three instances, the backend holds at least 38
// of its 40 slots, and with fair the shares are max-min with caps:
// anonymous its cap, 5 of 40 (0.125 ± 0.02; over the fleet at least
// fleetAnonymousAtLeast), acme and globex the rest, half each (at least
// 0.40 of the request-seconds each; over the fleet fleetSharedAtLeast).
func TestTenantExampleKeepsTheBackendBusy(t *testing.T) {
	for _, c := range []struct {
		name string
		x    tenantExample
	}{
		{"fair", tenantExample{fair: true}},
		{"first come", tenantExample{}},
		{"anonymous high", tenantExample{priority: map[string]Class{"anonymous": High}}},
		{"fair, a fleet of three", tenantExample{fair: true, instances: 3}},
		{"first come, a fleet of three", tenantExample{instances: 3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				held, share := c.x.run(t)
				t.Logf("backend held %.2f of 40; acme %.3f globex %.3f anonymous %.3f", held, share["acme"], share["globex"], share["anonymous"])
				if held < 38 {
					t.Errorf("the backend held %.2f of 40 on average, want at least 38", held)
				}
				if !c.x.fair {
					return
				}
				least := 0.40
				if c.x.instances > 0 {
					least = fleetSharedAtLeast
				}
				for _, tenant := range []string{"acme", "globex"} {
					if share[tenant] < least {
						t.Errorf("%s: %.3f of the request-seconds, want at least %.2f", tenant, share[tenant], least)
					}
				}
				low := 5.0/40 - 0.02
				if c.x.instances > 0 {
					low = fleetAnonymousAtLeast
				}
				if a := share["anonymous"]; a < low || a > 5.0/40+0.02 {
					t.Errorf("anonymous: %.3f of the request-seconds, want %s", a, fmt.Sprintf("%.3f to %.3f", low, 5.0/40+0.02))
				}
			})
		})
	}
}
