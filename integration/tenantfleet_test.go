package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
)

// tenantFleetBackend holds each request 500 ms, adds up per tenant the
// request-seconds it held within [from, to), and records the most
// requests that came before to it held at once.
type tenantFleetBackend struct {
	mu            sync.Mutex
	from, to      time.Time
	seconds       map[string]float64
	inFlight, max int
}

func (b *tenantFleetBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	if !time.Now().Before(b.to) {
		// The clients have gone: Caddy freed the slots of their requests
		// while this backend still holds them, so they are not counted.
		b.mu.Unlock()
		return
	}
	b.inFlight++
	b.max = max(b.max, b.inFlight)
	b.mu.Unlock()
	began := time.Now()
	time.Sleep(500 * time.Millisecond)
	ended := time.Now()
	tenant := map[string]string{"key-acme-123": "acme", "key-globex-456": "globex"}[r.Header.Get("X-Api-Key")]
	if tenant == "" {
		tenant = "anonymous"
	}
	b.mu.Lock()
	b.inFlight--
	if s := earliest(ended, b.to).Sub(latest(began, b.from)).Seconds(); s > 0 {
		b.seconds[tenant] += s
	}
	b.mu.Unlock()
}

// TestTenantExampleFleetThroughCaddy runs the README's tenant example on
// a fleet: three Caddy processes with `store redis` on one Redis, in
// front of one backend that holds each request 500 ms, with 80 acme, 80
// globex and 10 anonymous closed-loop clients spread over the three. Over
// 10 s after 3 s of warm-up, the backend holds at least 38 of the total
// of 40 on average and never more than 40. The shares are what
// fleet-guarantees.md states for a fleet, where a tenant whose own cap is
// near its share of the total gets less than that share: acme and globex
// at least 0.33 of the request-seconds each (their share is 0.4375),
// anonymous 0.085 to 0.145 (its cap's 0.125).
func TestTenantExampleFleetThroughCaddy(t *testing.T) {
	rs := startRedis(t)
	backend := &tenantFleetBackend{seconds: map[string]float64{}}
	srv := serveAt(t, "127.0.0.1:0", backend)
	var urls []string
	for range 3 {
		port := freePort(t)
		startCaddy(t, globalsAt("off", "")+fmt.Sprintf(`http://127.0.0.1:%d {
	map {header.X-Api-Key} {tenant} {tenant_max} {
		key-acme-123 acme 30
		key-globex-456 globex 20
		default anonymous 5
	}
	inflight {
		limit tenant {tenant} {tenant_max}
		total 40
		wait 30s
		fair tenant
		store redis {
			address %s
		}
	}
	reverse_proxy %s
}
`, port, rs.addr, srv), port)
		urls = append(urls, fmt.Sprintf("http://127.0.0.1:%d/", port))
	}

	window, warmUp := 10*time.Second, 3*time.Second
	start := time.Now()
	backend.mu.Lock()
	backend.from, backend.to = start.Add(warmUp), start.Add(warmUp+window)
	backend.mu.Unlock()
	ctx, cancel := context.WithDeadline(context.Background(), backend.to)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 200}}
	var wg sync.WaitGroup
	n := 0
	for key, clients := range map[string]int{"key-acme-123": 80, "key-globex-456": 80, "": 10} {
		for range clients {
			url := urls[n%len(urls)]
			n++
			wg.Go(func() {
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
					if key != "" {
						req.Header.Set("X-Api-Key", key)
					}
					res, err := client.Do(req)
					if err != nil {
						continue
					}
					io.Copy(io.Discard, res.Body)
					res.Body.Close()
				}
			})
		}
	}
	wg.Wait()

	backend.mu.Lock()
	defer backend.mu.Unlock()
	var sum float64
	for _, s := range backend.seconds {
		sum += s
	}
	held := sum / window.Seconds()
	share := func(tenant string) float64 { return backend.seconds[tenant] / sum }
	t.Logf("the backend held %.2f of 40 on average, at most %d; acme %.3f, globex %.3f, anonymous %.3f",
		held, backend.max, share("acme"), share("globex"), share("anonymous"))
	if held < 38 {
		t.Errorf("the backend held %.2f of 40 on average, want at least 38", held)
	}
	if backend.max > 40 {
		t.Errorf("the backend held %d requests at once, over the total of 40", backend.max)
	}
	for _, tenant := range []string{"acme", "globex"} {
		if s := share(tenant); s < 0.33 {
			t.Errorf("%s: %.3f of the request-seconds, want at least 0.33", tenant, s)
		}
	}
	if s := share("anonymous"); s < 0.085 || s > 0.145 {
		t.Errorf("anonymous: %.3f of the request-seconds, want 0.085 to 0.145", s)
	}
}
