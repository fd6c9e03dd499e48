// Package tenants drives the README's tenant example against Caddy: a
// map gives acme (key-acme-123) a cap of 30, globex (key-globex-456) 20
// and requests without a key (anonymous) 5, under a total of 40; 80
// clients each for acme and globex and 10 anonymous ones send request
// after request to a backend that holds each 500 ms.
package tenants

import (
	"context"
	"io"
	"net/http"
	"sync"
	"time"
)

// Site is the example's map and inflight block; extra goes inside the
// block (a store, say). The site proxies to the backend at the address
// given to reverse_proxy after it.
func Site(extra string) string {
	return `map {header.X-Api-Key} {tenant} {tenant_max} {
		key-acme-123 acme 30
		key-globex-456 globex 20
		default anonymous 5
	}
	inflight {
		limit tenant {tenant} {tenant_max}
		total 40
		wait 30s
		fair tenant
		` + extra + `
	}
	reverse_proxy `
}

// Backend holds each request 500 ms, adds up per tenant the
// request-seconds it held within [from, to), and records the most
// requests that came before to it held at once: a request that comes
// later comes after its client left, its slot freed while this backend
// still held the one before.
type Backend struct {
	mu            sync.Mutex
	from, to      time.Time
	seconds       map[string]float64
	inFlight, max int
}

// NewBackend returns a backend that measures over the window Drive sets.
func NewBackend() *Backend { return &Backend{seconds: map[string]float64{}} }

func (b *Backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	if !time.Now().Before(b.to) {
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
	if began.Before(b.from) {
		began = b.from
	}
	if ended.After(b.to) {
		ended = b.to
	}
	if s := ended.Sub(began).Seconds(); s > 0 {
		b.seconds[tenant] += s
	}
	b.mu.Unlock()
	io.WriteString(w, "ok")
}

// Drive runs the example's clients for warmUp and then window, the
// backend measuring over window, client i sending to urls[i %
// len(urls)], and returns how many responses came with each status.
func (b *Backend) Drive(urls []string, warmUp, window time.Duration) map[int]int {
	b.mu.Lock()
	b.from = time.Now().Add(warmUp)
	b.to = b.from.Add(window)
	b.mu.Unlock()
	ctx, cancel := context.WithDeadline(context.Background(), b.to)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 200}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
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
					mu.Lock()
					statuses[res.StatusCode]++
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return statuses
}

// Figures returns the slots the backend held on average over its
// window, the most it held at once, and each tenant's share of the
// request-seconds.
func (b *Backend) Figures() (held float64, most int, share map[string]float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var sum float64
	for _, s := range b.seconds {
		sum += s
	}
	share = map[string]float64{}
	for tenant, s := range b.seconds {
		share[tenant] = s / sum
	}
	return sum / b.to.Sub(b.from).Seconds(), b.max, share
}
