package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// holdBackend answers each request after the milliseconds its X-Hold
// header asks, and records, per X-Tenant, the unit-seconds its requests
// held within a window, and in all: X-Cost (1 without it) × the time
// held, so without costs slot-seconds: what the backend gave each tenant.
// It also records them per instance (X-Instance, which each instance's
// reverse_proxy sets). A request with X-Used is answered as a model does,
// reporting X-Used output tokens in a JSON usage, and holds those units:
// what it really used, whatever it reserved.
type holdBackend struct {
	addr       string
	mu         sync.Mutex
	from, to   time.Time
	held       map[string]float64 // tenant → unit-seconds in the window
	all        map[string]float64 // tenant → unit-seconds in all
	byInstance map[string]float64 // "instance/tenant" → unit-seconds in the window
}

func newHoldBackend(t *testing.T) *holdBackend {
	t.Helper()
	b := &holdBackend{held: map[string]float64{}, all: map[string]float64{}, byInstance: map[string]float64{}}
	b.addr = serveAt(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.Header.Get("X-Hold"))
		units := 1
		if c := r.Header.Get("X-Cost"); c != "" {
			units, _ = strconv.Atoi(c)
		}
		used := r.Header.Get("X-Used")
		if used != "" {
			units, _ = strconv.Atoi(used)
		}
		start := time.Now()
		time.Sleep(time.Duration(ms) * time.Millisecond)
		end := time.Now()
		b.mu.Lock()
		b.all[r.Header.Get("X-Tenant")] += float64(units) * end.Sub(start).Seconds()
		if !b.from.IsZero() {
			if s, e := latest(start, b.from), earliest(end, b.to); e.After(s) {
				us := float64(units) * e.Sub(s).Seconds()
				b.held[r.Header.Get("X-Tenant")] += us
				b.byInstance[r.Header.Get("X-Instance")+"/"+r.Header.Get("X-Tenant")] += us
			}
		}
		b.mu.Unlock()
		if used != "" {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"object":"chat.completion","choices":[],"usage":{"prompt_tokens":0,"completion_tokens":%s}}`, used)
			return
		}
		w.Write([]byte("ok"))
	}))
	return b
}

// window records the unit-seconds held from now for d.
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
// redis, two sites run side by side. The admin API shows each waiting
// tenant's share of the slot-seconds given so far (the last one to two
// minutes) as the backend recorded it, within 0.03, and its weight. Its
// Caddy is a process of its own, so that it runs beside the fleet's tests
// (see TestFaults).
func TestFairSharesSlotSecondsThroughCaddy(t *testing.T) {
	t.Parallel()
	redis := startRedis(t)
	admin := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	stores := []string{"local", "redis"}
	site := map[string]struct {
		port    int
		backend *holdBackend
	}{}
	caddyfile := globalsAt(admin, "")
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
		metrics per_key plain
		%s
	}
	reverse_proxy %s
}
`, s.port, store, storeLine, s.backend.addr)
	}
	startCaddy(t, caddyfile, site["local"].port)
	waitForPort(t, fmt.Sprintf("127.0.0.1:%d", site["redis"].port))
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
			return metricAt(t, admin, "caddy_inflight_waiting", `zone="seconds-`+store+`"`) >= 8
		})
	}
	time.Sleep(2 * time.Second)
	const window = 20 * time.Second
	// given is the unit-seconds each tenant's requests held, counted as
	// each ended (caddy_inflight_key_given_seconds_total).
	given := func(store string) map[string]float64 {
		scraped := scrapeAt(t, admin)
		out := map[string]float64{}
		for _, tn := range []string{"long", "short"} {
			out[tn] = metricIn(t, scraped, "caddy_inflight_key_given_seconds_total", `zone="seconds-`+store+`"`, `key="`+tn+`"`)
		}
		return out
	}
	before := map[string]map[string]float64{}
	for _, store := range stores {
		before[store] = given(store)
		site[store].backend.window(window)
	}
	time.Sleep(window)
	after := map[string]map[string]float64{}
	for _, store := range stores {
		after[store] = given(store)
	}
	time.Sleep(1100 * time.Millisecond) // the requests that end in the window
	for _, store := range stores {
		checkSharesShown(t, admin, "seconds-"+store, site[store].backend)
	}
	stop()
	wg.Wait()
	for _, store := range stores {
		b := site[store].backend
		b.mu.Lock()
		long, short := b.held["long"], b.held["short"]
		b.mu.Unlock()
		share := long / (long + short)
		t.Logf("%s: slot-seconds long %.1f, short %.1f: the 1 s tenant's share %.3f (of %.0f slot-seconds at most)", store, long, short, share, 4*window.Seconds())
		if share < 0.47 || share > 0.53 {
			t.Errorf("%s: the tenant of 1 s requests has %.3f of the backend's slot-seconds, want 0.5 ± 0.03", store, share)
		}
		gl, gs := after[store]["long"]-before[store]["long"], after[store]["short"]-before[store]["short"]
		counted := gl / (gl + gs)
		t.Logf("%s: caddy_inflight_key_given_seconds_total rose by long %.1f, short %.1f in the window: share %.3f", store, gl, gs, counted)
		if d := counted - share; !(d >= -0.03 && d <= 0.03) {
			t.Errorf("%s: the per-key counter gives the 1 s tenant a share of %.3f over the window, the backend %.3f: want within 0.03", store, counted, share)
		}
	}
}

// checkSharesShown compares the share of the slot-seconds the admin API at
// admin shows for each waiting tenant of zone with the one b recorded so
// far.
func checkSharesShown(t *testing.T, admin, zone string, b *holdBackend) {
	t.Helper()
	type shown struct {
		Limit, Key string
		Share      *float64
		Weight     float64
	}
	var got map[string]shown
	eventually(t, zone+": both tenants waiting, each with a share", func() bool {
		var state struct {
			Zones []struct {
				Zone       string
				TopWaiting []shown `json:"top_waiting"`
			}
		}
		json.Unmarshal([]byte(adminGetAt(t, admin, "/inflight/")), &state)
		got = map[string]shown{}
		for _, z := range state.Zones {
			for _, k := range z.TopWaiting {
				if z.Zone == zone && k.Limit == "tenant" && k.Share != nil {
					got[k.Key] = k
				}
			}
		}
		return len(got) == 2
	})
	b.mu.Lock()
	long, short := b.all["long"], b.all["short"]
	b.mu.Unlock()
	recorded := map[string]float64{"long": long / (long + short), "short": short / (long + short)}
	t.Logf("%s: shown shares long %.3f, short %.3f (weights %v, %v); the backend's %.3f, %.3f", zone,
		*got["long"].Share, *got["short"].Share, got["long"].Weight, got["short"].Weight, recorded["long"], recorded["short"])
	for _, k := range got {
		if d := *k.Share - recorded[k.Key]; d < -0.03 || d > 0.03 {
			t.Errorf("%s: the admin API shows tenant %s's share as %.3f, the backend recorded %.3f: want within 0.03", zone, k.Key, *k.Share, recorded[k.Key])
		}
		if k.Weight != 1 {
			t.Errorf("%s: tenant %s shown with weight %v, want 1 (its class weight)", zone, k.Key, k.Weight)
		}
	}
}
