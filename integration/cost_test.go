package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// costBackend records the units it holds per tenant at once: each request
// holds X-Units (the units the test expects it to take) for X-Hold-Ms.
type costBackend struct {
	mu    sync.Mutex
	held  map[string]int64
	peak  map[string]int64
	alone atomic.Int64 // requests that arrived while their tenant held something
	addr  string
}

func newCostBackend(t *testing.T) *costBackend {
	b := &costBackend{held: map[string]int64{}, peak: map[string]int64{}}
	b.addr = serveAt(t, "127.0.0.1:0", b)
	return b
}

func (b *costBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tenant := r.Header.Get("X-Tenant")
	units, _ := strconv.ParseInt(r.Header.Get("X-Units"), 10, 64)
	b.mu.Lock()
	b.held[tenant] += units
	b.peak[tenant] = max(b.peak[tenant], b.held[tenant])
	b.mu.Unlock()
	ms, _ := strconv.Atoi(r.Header.Get("X-Hold-Ms"))
	select {
	case <-time.After(time.Duration(ms) * time.Millisecond):
	case <-r.Context().Done():
	}
	b.mu.Lock()
	b.held[tenant] -= units
	b.mu.Unlock()
	w.Write([]byte("ok"))
}

func (b *costBackend) peakOf(tenant string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.peak[tenant]
}

// costSite is a site whose tenants each have 100 units, each request
// costing X-Cost, waiting up to 30s.
func costSite(port int, backend, store string) string {
	return fmt.Sprintf(`http://127.0.0.1:%d {
	inflight {
		limit tenant {header.X-Tenant} 100
		cost {header.X-Cost}
		zone cost
		wait 30s
		%s
	}
	reverse_proxy %s
}
`, port, store, backend)
}

func costStores(t *testing.T) map[string]string {
	r := startRedis(t)
	return map[string]string{"process": "", "redis": "store redis {\n\t\t\taddress " + r.addr + "\n\t\t\tkey_prefix " + fmt.Sprintf("cost%d", rand.Uint32()) + "\n\t\t}"}
}

// TestCostSharesCapInUnits: requests of costs 1 to 40 from 24 clients of
// one tenant share its 100 units: the backend never holds more than 100 of
// the tenant's units, every request is served, a cost above the cap (500)
// is served alone, and the counts are back at zero.
func TestCostSharesCapInUnits(t *testing.T) {
	for store, block := range costStores(t) {
		t.Run(store, func(t *testing.T) {
			b := newCostBackend(t)
			port := freePort(t)
			load(t, costSite(port, b.addr, block))
			url := fmt.Sprintf("http://127.0.0.1:%d/", port)
			c := client("127.0.0.1")
			var wg sync.WaitGroup
			var failed atomic.Int64
			for w := range 24 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 7))
					for i := range 12 {
						cost := 1 + rng.Int64N(40)
						units := cost
						if w == 0 && i == 6 {
							cost, units = 500, 100 // above the cap: alone
						}
						r := get(context.Background(), c, url, "X-Tenant", "t", "X-Cost", strconv.FormatInt(cost, 10),
							"X-Units", strconv.FormatInt(units, 10), "X-Hold-Ms", strconv.Itoa(5+rng.IntN(20)))
						if r.err != nil || r.status != 200 {
							failed.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if n := failed.Load(); n != 0 {
				t.Fatalf("%d of 288 requests not served", n)
			}
			if p := b.peakOf("t"); p > 100 {
				t.Fatalf("the backend held %d units of the tenant at once, cap 100", p)
			}
			eventually(t, "no unit left in flight", func() bool {
				return metric(t, "caddy_inflight_requests", `zone="cost"`) == 0
			})
			t.Logf("%s: peak %d of 100 units", store, b.peakOf("t"))
		})
	}
}

// TestCostBigRequestNotStarved: under a steady stream of cost-1 requests
// that keep the tenant's 100 units busy, a request of cost 100 is admitted
// within its wait (the units freed are held for it), not refused when its
// wait runs out.
func TestCostBigRequestNotStarved(t *testing.T) {
	for store, block := range costStores(t) {
		t.Run(store, func(t *testing.T) {
			b := newCostBackend(t)
			port := freePort(t)
			load(t, costSite(port, b.addr, block))
			url := fmt.Sprintf("http://127.0.0.1:%d/", port)
			c := client("127.0.0.1")
			ctx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			// 120 clients, each request held 200 ms: on a slow machine a
			// client spends a while between requests, and with 50 ms holds
			// fewer than 100 were in flight at once (seen with two cores
			// kept busy), so the tenant's units never filled.
			for range 120 {
				wg.Go(func() {
					for ctx.Err() == nil {
						get(ctx, c, url, "X-Tenant", "t", "X-Cost", "1", "X-Units", "1", "X-Hold-Ms", "200")
					}
				})
			}
			// The tenant's units are full once its requests queue.
			eventually(t, "the stream fills the tenant's units", func() bool { return metric(t, "caddy_inflight_waiting", `zone="cost"`) > 0 })
			start := time.Now()
			r := get(context.Background(), c, url, "X-Tenant", "t", "X-Cost", "100", "X-Units", "100", "X-Hold-Ms", "1")
			waited := time.Since(start)
			stop()
			wg.Wait()
			if r.err != nil || r.status != 200 {
				t.Fatalf("cost-100 request under a stream of cost 1: %d %v after %s, want 200 within its 30s wait", r.status, r.err, waited)
			}
			t.Logf("%s: cost-100 request admitted after %s", store, waited)
		})
	}
}

// TestCostPlaceholderInHandleErrors: {http.inflight.cost} carries a
// refused request's cost to handle_errors, beside the limit and reason,
// and a cost that is not a positive integer is a 500 that takes nothing.
func TestCostPlaceholderInHandleErrors(t *testing.T) {
	b := newBackend(t)
	port := freePort(t)
	load(t, fmt.Sprintf(`http://127.0.0.1:%d {
	inflight {
		limit tenant {header.X-Tenant} 10
		cost {header.X-Cost}
		zone costph
	}
	reverse_proxy %s
	handle_errors {
		respond "{http.inflight.limit} {http.inflight.reason} {http.inflight.cost}" {err.status_code}
	}
}
`, port, b.addr))
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := client("127.0.0.1")
	held := hold(t, b, context.Background(), c, url+"/hold", "X-Tenant", "t", "X-Cost", "8")
	if r := get(context.Background(), c, url+"/", "X-Tenant", "t", "X-Cost", "5"); r.status != 429 || r.body != "tenant full 5" {
		t.Fatalf("cost 5 beside 8 of 10: %d %q, want 429 %q", r.status, r.body, "tenant full 5")
	}
	if r := get(context.Background(), c, url+"/", "X-Tenant", "t", "X-Cost", "2"); r.status != 200 {
		t.Fatalf("cost 2 beside 8 of 10: %d, want 200", r.status)
	}
	for _, bad := range []string{"0", "-1", "lots", ""} {
		if r := get(context.Background(), c, url+"/", "X-Tenant", "u", "X-Cost", bad); r.status != 500 {
			t.Fatalf("cost %q: %d, want 500", bad, r.status)
		}
	}
	b.open()
	<-held
	eventually(t, "no unit in flight", func() bool { return metric(t, "caddy_inflight_units", `zone="costph"`) == 0 })
}
