package integration

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// holdBackend answers each request after the milliseconds its X-Hold
// header asks, and records, per X-Tenant, the slot-seconds its requests
// held within a window: what the backend gave each tenant.
type holdBackend struct {
	addr     string
	mu       sync.Mutex
	from, to time.Time
	held     map[string]time.Duration
}

func newHoldBackend(t *testing.T) *holdBackend {
	t.Helper()
	b := &holdBackend{held: map[string]time.Duration{}}
	b.addr = serveAt(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.Header.Get("X-Hold"))
		start := time.Now()
		time.Sleep(time.Duration(ms) * time.Millisecond)
		end := time.Now()
		b.mu.Lock()
		if !b.from.IsZero() {
			if s, e := later(start, b.from), earlier(end, b.to); e.After(s) {
				b.held[r.Header.Get("X-Tenant")] += e.Sub(s)
			}
		}
		b.mu.Unlock()
		w.Write([]byte("ok"))
	}))
	return b
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// window records the slot-seconds held from now for d.
func (b *holdBackend) window(d time.Duration) {
	b.mu.Lock()
	b.from = time.Now()
	b.to = b.from.Add(d)
	b.mu.Unlock()
}

// TestFairSharesSlotSecondsThroughCaddy: through a real Caddy (total 4,
// fair tenant), two tenants of equal weight, 8 clients each, whose
// requests hold the backend 1 s and 100 ms, each get 0.5 ± 0.03 of the
// slot-seconds the backend gave over 20 s: in the zone and with store
// redis, two sites run side by side.
func TestFairSharesSlotSecondsThroughCaddy(t *testing.T) {
	redis := startRedis(t)
	stores := []string{"local", "redis"}
	site := map[string]struct {
		port    int
		backend *holdBackend
	}{}
	caddyfile := ""
	for _, store := range stores {
		storeLine := ""
		if store == "redis" {
			storeLine = "store redis {\n\t\t\taddress " + redis.addr + "\n\t\t\ttimeout 5s\n\t\t}"
		}
		s := site[store]
		s.port, s.backend = freePort(t), newHoldBackend(t)
		site[store] = s
		caddyfile += fmt.Sprintf(`http://127.0.0.1:%d {
	inflight {
		limit tenant {header.X-Tenant} 100
		total 4
		zone seconds-%s
		wait 60s
		fair tenant
		%s
	}
	reverse_proxy %s
}
`, s.port, store, storeLine, s.backend.addr)
	}
	load(t, caddyfile)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, store := range stores {
		url := fmt.Sprintf("http://127.0.0.1:%d/", site[store].port)
		for _, tn := range []struct{ name, hold string }{{"long", "1000"}, {"short", "100"}} {
			c := client("127.0.0.1")
			for range 8 {
				wg.Go(func() {
					for ctx.Err() == nil {
						if r := get(ctx, c, url, "X-Tenant", tn.name, "X-Hold", tn.hold); r.status != 200 && ctx.Err() == nil {
							t.Errorf("%s %s: status %d %v", store, tn.name, r.status, r.err)
							return
						}
					}
				})
			}
		}
	}
	// Past the first requests, charged before any hold time is known.
	for _, store := range stores {
		eventually(t, store+": both tenants queue", func() bool {
			return metric(t, "caddy_inflight_waiting", `zone="seconds-`+store+`"`) >= 8
		})
	}
	time.Sleep(2 * time.Second)
	const window = 20 * time.Second
	for _, store := range stores {
		site[store].backend.window(window)
	}
	time.Sleep(window + 1100*time.Millisecond) // the window, and the requests that end in it
	stop()
	wg.Wait()
	for _, store := range stores {
		b := site[store].backend
		b.mu.Lock()
		long, short := b.held["long"].Seconds(), b.held["short"].Seconds()
		b.mu.Unlock()
		share := long / (long + short)
		t.Logf("%s: slot-seconds long %.1f, short %.1f: the 1 s tenant's share %.3f (of %.0f slot-seconds at most)", store, long, short, share, 4*window.Seconds())
		if share < 0.47 || share > 0.53 {
			t.Errorf("%s: the tenant of 1 s requests has %.3f of the backend's slot-seconds, want 0.5 ± 0.03", store, share)
		}
	}
}
