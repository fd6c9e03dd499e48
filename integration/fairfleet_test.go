package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Fair sharing across a fleet: three Caddy processes, one Redis, one
// backend. Each tenant's requests go mostly (80 %) to an instance of its
// own, so an instance that is fair only among the requests it sees gives
// each tenant about what its home instance gets, whatever the weights; a
// fleet-wide fair order gives each its weighted share of the fleet's
// slots.

// fairFleetNode is one Caddy process of the fleet.
type fairFleetNode struct {
	url, admin string
}

// fairFleetSite is what every instance runs.
type fairFleetSite struct {
	weights map[string]float64 // tenant → weight, through a map of X-Tenant; none: the class weight
	cost    bool               // requests cost X-Cost units
	tokens  bool               // cost tokens, under a total of 6 requests of an empty body (6 × 1025 tokens)
}

// startFairFleet runs three Caddy processes, each with the same site
// (total 6, fair tenant, store redis at redisAddr, zone fleet) in front
// of backend.
func startFairFleet(t *testing.T, site fairFleetSite, redisAddr, backend string) []fairFleetNode {
	t.Helper()
	var weightMap, weightLine, costLine string
	if site.weights != nil {
		weightMap = "map {header.X-Tenant} {tenant_weight} {"
		for _, tn := range slices.Sorted(maps.Keys(site.weights)) {
			weightMap += fmt.Sprintf("\n\t\t%s %v", tn, site.weights[tn])
		}
		weightMap += "\n\t\tdefault 1\n\t}"
		weightLine = "weight {tenant_weight}"
	}
	total := 6
	switch {
	case site.cost:
		costLine = "cost {header.X-Cost}"
	case site.tokens:
		costLine, total = "cost tokens", 6*emptyBodyTokens
	}
	var nodes []fairFleetNode
	for i := range 3 {
		port, admin := freePort(t), freePort(t)
		caddyfile := globalsAt(fmt.Sprint("127.0.0.1:", admin), "") + fmt.Sprintf(`http://127.0.0.1:%d {
	%s
	inflight {
		limit tenant {header.X-Tenant} 100000
		total %d
		zone fleet
		wait 60s
		fair tenant
		%s
		%s
		metrics per_key plain
		store redis {
			address %s
			timeout 5s
		}
	}
	reverse_proxy %s {
		header_up X-Instance %d
	}
}
`, port, weightMap, total, weightLine, costLine, redisAddr, backend, i+1)
		startCaddy(t, caddyfile, port)
		nodes = append(nodes, fairFleetNode{url: fmt.Sprintf("http://127.0.0.1:%d/", port), admin: fmt.Sprintf("127.0.0.1:%d", admin)})
	}
	return nodes
}

// fleetWaiting sums a metric's samples with the given labels over the
// fleet's instances.
func fleetWaiting(t *testing.T, nodes []fairFleetNode, name string, labels ...string) float64 {
	t.Helper()
	var sum float64
	for _, n := range nodes {
		sum += metricAt(t, n.admin, name, labels...)
	}
	return sum
}

// jain is Jain's fairness index of xs: 1 when all are equal, 1/n when one
// has everything.
func jain(xs []float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// fleetTenant is one tenant of a shares test.
type fleetTenant struct {
	name   string
	weight float64
	home   int // the instance (0, 1, 2) that gets 80 % of its requests
	hold   int // ms each request holds the backend
}

// fleetSharesCase is a shares test: the tenants, 8 closed-loop clients
// each, and the costs each client cycles through (none: no cost), or with
// used, requests in tokens (cost tokens: an empty JSON body, 1,025
// tokens) whose model reports the tokens used gives per tenant.
type fleetSharesCase struct {
	tenants []fleetTenant
	costs   []int
	used    map[string]int
}

// emptyBodyTokens is what cost tokens estimates for a body of {}: 1 token
// of prompt and the default output, 1,024.
const emptyBodyTokens = 1025

// fleetShares runs the case through three Caddy instances sharing one
// Redis (total 6) and checks that each tenant gets its weighted share of
// the unit-seconds the backend gave over 40 s, within 0.03, and that Jain's index over share/weight is at least 0.99.
func fleetShares(t *testing.T, c fleetSharesCase) {
	t.Helper()
	redis := startRedis(t)
	b := newHoldBackend(t)
	weights := map[string]float64{}
	var sumWeights float64
	maxHold := 0
	for _, tn := range c.tenants {
		weights[tn.name] = tn.weight
		sumWeights += tn.weight
		maxHold = max(maxHold, tn.hold)
	}
	nodes := startFairFleet(t, fairFleetSite{weights: weights, cost: c.costs != nil, tokens: c.used != nil}, redis.addr, b.addr)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	for _, tn := range c.tenants {
		hc := client("127.0.0.1")
		for i := range 8 {
			wg.Go(func() {
				// The balancer: 8 of every 10 requests to the tenant's
				// home, one to each other instance; clients start at
				// different points of the cycle.
				for n := i; ctx.Err() == nil; n++ {
					inst := tn.home
					switch n % 10 {
					case 8:
						inst = (tn.home + 1) % 3
					case 9:
						inst = (tn.home + 2) % 3
					}
					header := []string{"X-Tenant", tn.name, "X-Hold", strconv.Itoa(tn.hold)}
					if c.costs != nil {
						header = append(header, "X-Cost", strconv.Itoa(c.costs[n%len(c.costs)]))
					}
					request := get
					if c.used != nil {
						header = append(header, "X-Used", strconv.Itoa(c.used[tn.name]))
						request = postEmpty
					}
					if r := request(ctx, hc, nodes[inst].url, header...); r.status != 200 && ctx.Err() == nil {
						t.Errorf("tenant %s at instance %d: status %d %v", tn.name, inst+1, r.status, r.err)
						return
					}
				}
			})
		}
	}
	for _, tn := range c.tenants {
		eventually(t, "tenant "+tn.name+" queues in the fleet", func() bool {
			return fleetWaiting(t, nodes, "caddy_inflight_key_waiting", `zone="fleet"`, `key="`+tn.name+`"`) >= 1
		})
	}
	time.Sleep(2 * time.Second) // warm-up: past the first charges, made before any hold time is known
	const window = 40 * time.Second
	given := func() map[string]float64 { // the limiters' own count, over the fleet
		out := map[string]float64{}
		for _, tn := range c.tenants {
			out[tn.name] = fleetWaiting(t, nodes, "caddy_inflight_key_given_seconds_total", `zone="fleet"`, `key="`+tn.name+`"`)
		}
		return out
	}
	givenBefore := given()
	b.window(window)
	// The window, and the requests that end in it.
	time.Sleep(window + time.Duration(maxHold)*time.Millisecond + 500*time.Millisecond)
	t.Logf("waiting at the end of the window, over the fleet: %.0f", fleetWaiting(t, nodes, "caddy_inflight_waiting", `zone="fleet"`))
	givenAfter := given()
	var givenAll float64
	for _, tn := range c.tenants {
		givenAll += givenAfter[tn.name] - givenBefore[tn.name]
	}
	for _, tn := range c.tenants { // beside the backend's: what the limiters counted, requests that ended in the window
		t.Logf("tenant %s: the limiters counted %.3f of the unit-seconds they gave", tn.name, (givenAfter[tn.name]-givenBefore[tn.name])/givenAll)
	}
	checkFleetWeightsShown(t, nodes, weights)
	stop()
	wg.Wait()

	b.mu.Lock()
	defer b.mu.Unlock()
	var all float64
	for _, tn := range c.tenants {
		all += b.held[tn.name]
	}
	unit := "slot-seconds"
	switch {
	case c.costs != nil:
		unit = "unit-seconds"
	case c.used != nil:
		unit = "reported token-seconds"
	}
	t.Logf("%s given over %v: %.1f", unit, window, all)
	var normalized []float64
	for _, tn := range c.tenants {
		share, want := b.held[tn.name]/all, tn.weight/sumWeights
		normalized = append(normalized, share/tn.weight)
		var per []string
		for i := range 3 {
			per = append(per, fmt.Sprintf("instance %d %.1f", i+1, b.byInstance[fmt.Sprintf("%d/%s", i+1, tn.name)]))
		}
		t.Logf("tenant %s (weight %v, home instance %d, %d ms): %.1f %s, share %.3f (want %.3f); %s",
			tn.name, tn.weight, tn.home+1, tn.hold, b.held[tn.name], unit, share, want, strings.Join(per, ", "))
		if math.IsNaN(share) || math.Abs(share-want) > 0.03 {
			t.Errorf("tenant %s (weight %v) has %.3f of the fleet's %s, want %.3f ± 0.03", tn.name, tn.weight, share, unit, want)
		}
	}
	for i := range 3 {
		var per []string
		for _, tn := range c.tenants {
			per = append(per, fmt.Sprintf("%s %.1f", tn.name, b.byInstance[fmt.Sprintf("%d/%s", i+1, tn.name)]))
		}
		t.Logf("instance %d gave: %s", i+1, strings.Join(per, ", "))
	}
	j := jain(normalized)
	t.Logf("Jain's index over share/weight: %.4f (want ≥ 0.99)", j)
	if !(j >= 0.99) {
		t.Errorf("Jain's fairness index over share/weight is %.4f, want ≥ 0.99", j)
	}
}

// checkFleetWeightsShown checks that the admin API of the instances shows
// each waiting tenant with the weight the map gives it: the weights are
// configured, not defaulted. An instance shows a key's weight once it has
// admitted one of the key's requests.
func checkFleetWeightsShown(t *testing.T, nodes []fairFleetNode, weights map[string]float64) {
	t.Helper()
	shown := map[string]float64{}
	eventually(t, "every tenant shown waiting with its weight", func() bool {
		for _, n := range nodes {
			var state struct {
				Zones []struct {
					Zone       string
					TopWaiting []struct {
						Limit, Key string
						Weight     float64
					} `json:"top_waiting"`
				}
			}
			json.Unmarshal([]byte(adminGetAt(t, n.admin, "/inflight/")), &state)
			for _, z := range state.Zones {
				for _, k := range z.TopWaiting {
					if z.Zone == "fleet" && k.Limit == "tenant" && k.Weight != 0 {
						shown[k.Key] = k.Weight
					}
				}
			}
		}
		return len(shown) == len(weights)
	})
	t.Logf("weights shown by the admin API: %v", shown)
	for tn, w := range weights {
		if shown[tn] != w {
			t.Errorf("tenant %s shown with weight %v, want %v (from the map)", tn, shown[tn], w)
		}
	}
}

// fleetSkewedTenants are three tenants of weights 2 : 1 : 1, each sending
// 80 % of its requests to an instance of its own.
func fleetSkewedTenants(holdA, holdBC int) []fleetTenant {
	return []fleetTenant{
		{name: "a", weight: 2, home: 0, hold: holdA},
		{name: "b", weight: 1, home: 1, hold: holdBC},
		{name: "c", weight: 1, home: 2, hold: holdBC},
	}
}

// TestFairFleetWeightsThroughCaddy: three Caddy instances sharing one
// Redis (total 6, fair tenant, weights 2 : 1 : 1 from a map of the tenant),
// each tenant's requests 80 % to an instance of its own and 10 % to each
// other, 8 closed-loop clients per tenant, requests of 200 ms: over 40 s,
// the tenants get 0.5 : 0.25 : 0.25 ± 0.03 of the slot-seconds the
// backend gave, Jain's index over share/weight ≥ 0.99. An instance fair
// only among its own waiters gives each tenant about what its home
// instance gets instead.
func TestFairFleetWeightsThroughCaddy(t *testing.T) {
	t.Parallel()
	fleetShares(t, fleetSharesCase{tenants: fleetSkewedTenants(200, 200)})
}

// TestFairFleetWeightsMixedLengthsThroughCaddy is
// TestFairFleetWeightsThroughCaddy with a's requests holding 1 s and b's
// and c's 100 ms: shares are of slot-seconds, not of requests. a's long
// requests, granted at once at the instances it reaches now and then,
// give it more than its share there; what a key is owed over the fleet
// takes nine tenths of that out (docs/fleet-guarantees.md).
func TestFairFleetWeightsMixedLengthsThroughCaddy(t *testing.T) {
	t.Parallel()
	fleetShares(t, fleetSharesCase{tenants: fleetSkewedTenants(1000, 100)})
}

// TestFairFleetCostsThroughCaddy is TestFairFleetWeightsThroughCaddy with
// requests of 1 to 3 units (X-Cost; each client cycles 1, 2, 3) under a
// total of 6 units: the shares are of unit-seconds.
func TestFairFleetCostsThroughCaddy(t *testing.T) {
	t.Parallel()
	fleetShares(t, fleetSharesCase{tenants: fleetSkewedTenants(200, 200), costs: []int{1, 2, 3}})
}

// TestFairFleetReportedTokensThroughCaddy is TestFairFleetWeightsThroughCaddy
// with cost tokens: every request reserves 1,025 tokens (under a total of
// 6,150), but a's model reports using all of them and b's and c's a fifth
// (205): the shares are of the token-seconds the model reported, across
// the fleet. Charged what they reserved, a would have 0.83 of them.
func TestFairFleetReportedTokensThroughCaddy(t *testing.T) {
	t.Parallel()
	fleetShares(t, fleetSharesCase{tenants: fleetSkewedTenants(200, 200), used: map[string]int{"a": emptyBodyTokens, "b": emptyBodyTokens / 5, "c": emptyBodyTokens / 5}})
}

// postEmpty is get with a POST of an empty JSON object.
func postEmpty(ctx context.Context, c *http.Client, url string, header ...string) result {
	return post(ctx, c, url, "{}", header...)
}

// TestFairFleetLightTenantBehindFlood: three Caddy instances sharing one
// Redis (total 6, fair tenant, equal weights). A flood tenant of 24
// closed-loop clients sends requests of 600 ms to instances 1 and 2 only;
// once it queues, a light tenant sends 20 requests of 10 ms, one at a
// time 300 ms apart, to instance 3. Each light request waits at most two
// of the flood's service times (1.2 s): a fleet-wide fair order gives the
// light tenant one of the next slots freed, wherever its request waits.
func TestFairFleetLightTenantBehindFlood(t *testing.T) {
	t.Parallel()
	const (
		floodHold = 600 * time.Millisecond
		lightHold = 10 * time.Millisecond
		bound     = 2 * floodHold
	)
	redis := startRedis(t)
	b := newHoldBackend(t)
	nodes := startFairFleet(t, fairFleetSite{}, redis.addr, b.addr)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	hc := client("127.0.0.1")
	for i := range 24 {
		wg.Go(func() {
			for n := i; ctx.Err() == nil; n++ {
				inst := n % 2 // instances 1 and 2 only
				r := get(ctx, hc, nodes[inst].url, "X-Tenant", "flood", "X-Hold", strconv.Itoa(int(floodHold.Milliseconds())))
				if r.status != 200 && ctx.Err() == nil {
					t.Errorf("flood at instance %d: status %d %v", inst+1, r.status, r.err)
					return
				}
			}
		})
	}
	eventually(t, "the flood queues (at least 12 of its 18 extra requests waiting)", func() bool {
		return fleetWaiting(t, nodes, "caddy_inflight_waiting", `zone="fleet"`) >= 12
	})
	time.Sleep(2 * floodHold) // the flood at its pace
	t.Logf("the flood waiting, over the fleet: %.0f", fleetWaiting(t, nodes, "caddy_inflight_waiting", `zone="fleet"`))
	lc := client("127.0.0.1")
	var waits []time.Duration
	for i := range 20 {
		start := time.Now()
		r := get(context.Background(), lc, nodes[2].url, "X-Tenant", "light", "X-Hold", strconv.Itoa(int(lightHold.Milliseconds())))
		took := time.Since(start)
		if r.status != 200 {
			t.Errorf("light request %d: status %d %v", i, r.status, r.err)
		}
		waits = append(waits, took-lightHold)
		time.Sleep(300 * time.Millisecond)
	}
	stop()
	wg.Wait()
	t.Logf("the light tenant's waits (response time − %v hold), in order: %v", lightHold, roundAll(waits))
	sorted := slices.Clone(waits)
	slices.Sort(sorted)
	t.Logf("light waits: min %v, median %v, max %v (bound %v = 2 × the flood's %v)",
		sorted[0].Round(time.Millisecond), sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond), bound, floodHold)
	for i, w := range waits {
		if w > bound {
			t.Errorf("light request %d waited %v behind the flood, want ≤ %v (2 × the flood's %v service time)", i, w.Round(time.Millisecond), bound, floodHold)
		}
	}
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}
