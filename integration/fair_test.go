package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// slowBackend answers every request after a fixed service time, and
// records the most requests it had at once.
type slowBackend struct {
	service   time.Duration
	cur, peak atomic.Int64
	addr      string
}

func newSlowBackend(t *testing.T, service time.Duration) *slowBackend {
	t.Helper()
	b := &slowBackend{service: service}
	b.addr = serveAt(t, "127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer b.cur.Add(-1)
		notePeak(&b.peak, b.cur.Add(1))
		time.Sleep(b.service) // whatever the client does
		w.Write([]byte("ok"))
	}))
	return b
}

// lightTenantWait floods a zone of total 4 with 80 requests of one tenant
// (200 ms each: a 4 s queue), then sends one request of another tenant once
// the flood queues, and returns how long that one took. With a Redis
// address, the counts are kept there.
func lightTenantWait(t *testing.T, fair bool, redisAddr string) time.Duration {
	t.Helper()
	return lightTenantWaitAfter(t, fair, redisAddr, nil)
}

// lightTenantWaitAfter is lightTenantWait with the weight taken from the
// X-Weight header, and before(url) run before the flood.
func lightTenantWaitAfter(t *testing.T, fair bool, redisAddr string, before func(url string)) time.Duration {
	t.Helper()
	b := newSlowBackend(t, 200*time.Millisecond)
	port := freePort(t)
	fairLine, storeLine := "", ""
	if fair {
		fairLine = "fair tenant"
	}
	if before != nil {
		fairLine += "\n\t\tweight {header.X-Weight}"
	}
	if redisAddr != "" {
		// A generous timeout: on a busy machine a reply later than the
		// default 250ms counts as Redis failing, and on_error open then
		// admits locally beside the Redis queue (seen: 5 and 8 at the
		// backend against total 4 at load average 30). Faults are the
		// fault suite's; this test is about order.
		storeLine = "store redis {\n\t\t\taddress " + redisAddr + "\n\t\t\ttimeout 5s\n\t\t}"
	}
	load(t, fmt.Sprintf(`http://127.0.0.1:%d {
	inflight {
		limit tenant {header.X-Tenant} 100
		total 4
		zone llm
		wait 60s
		%s
		metrics per_key
		%s
	}
	reverse_proxy %s
}
`, port, fairLine, storeLine, b.addr))
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	if before != nil {
		before(url)
	}
	c := client("127.0.0.1")
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 80 {
		wg.Go(func() {
			if r := get(context.Background(), c, url, "X-Tenant", "flood"); r.status != 200 {
				failed.Add(1)
			}
		})
	}
	eventually(t, "the flood queues", func() bool { return metric(t, "caddy_inflight_waiting", `zone="llm"`) >= 60 })
	checkKeyWaiting(t) // with Redis: this instance's queue
	start := time.Now()
	r := get(context.Background(), c, url, "X-Tenant", "light")
	waited := time.Since(start)
	if r.status != 200 {
		t.Fatalf("light tenant: %d", r.status)
	}
	wg.Wait()
	if failed.Load() != 0 || b.peak.Load() != 4 {
		t.Fatalf("flood: %d failed, backend peak %d; want 0 and 4", failed.Load(), b.peak.Load())
	}
	eventually(t, "no waiting series left", func() bool {
		return metric(t, "caddy_inflight_key_waiting", `zone="llm"`) == 0 && len(adminTopWaiting(t)) == 0
	})
	return waited
}

// checkKeyWaiting: the flooding tenant's queue shows in the per-key gauge
// and in the admin API.
func checkKeyWaiting(t *testing.T) {
	t.Helper()
	if got := metric(t, "caddy_inflight_key_waiting", `zone="llm"`, `limit="tenant"`, `key="h:`); got < 40 {
		t.Errorf("caddy_inflight_key_waiting of the flooding tenant: %v, want the queue (≥ 40)", got)
	}
	if top := adminTopWaiting(t); len(top) == 0 || top[0].Waiting < 40 || !strings.HasPrefix(top[0].Key, "h:") {
		t.Errorf("GET /inflight/ top_waiting %+v, want the flooding tenant's hash first with the queue", top)
	}
}

type topWaiting []struct {
	Key     string `json:"key"`
	Waiting int64  `json:"waiting"`
}

func adminTopWaiting(t *testing.T) topWaiting {
	t.Helper()
	resp, err := adminClient.Get("http://" + adminAddr + "/inflight/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var state struct {
		Zones []struct {
			Zone       string     `json:"zone"`
			TopWaiting topWaiting `json:"top_waiting"`
		} `json:"zones"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&state); err != nil {
		t.Fatal(err)
	}
	for _, z := range state.Zones {
		if z.Zone == "llm" {
			return z.TopWaiting
		}
	}
	return nil
}

// TestFairLightTenantBehindFlood: through a real Caddy, a tenant's single
// request behind another's flood of 80 (total 4, 200 ms each: a 4 s queue)
// waits about one service time with fair, and the whole queue without.
func TestFairLightTenantBehindFlood(t *testing.T) {
	without := lightTenantWait(t, false, "")
	with := lightTenantWait(t, true, "")
	t.Logf("light tenant's latency behind a flood of 80 (total 4, 200 ms service): without fair %s, with fair %s", without.Round(time.Millisecond), with.Round(time.Millisecond))
	if without < 2*time.Second || with*4 > without {
		t.Fatalf("light tenant's latency: without fair %s, with fair %s; want over 2s without (the queue) and under a quarter of that with (about one service time)", without, with)
	}
}

// TestFairSurvivesPoisonedWeights: a client that sends extreme weights
// (X-Weight 1e-17, 5e-324, 1e300, NaN, Inf, -1, 0, not a number) while
// slots are contended is served like any other, and fair sharing still
// works afterwards: a light tenant behind a flood of 80 is served in about
// one service time, not after the flood.
func TestFairSurvivesPoisonedWeights(t *testing.T) {
	poison := func(url string) {
		c := client("127.0.0.1")
		var wg sync.WaitGroup
		var failed atomic.Int64
		for i := range 3 {
			for _, w := range []string{"1e-17", "5e-324", "1e300", "NaN", "Inf", "-1", "0", "x"} {
				wg.Go(func() {
					if r := get(context.Background(), c, url, "X-Tenant", fmt.Sprint("poison", i), "X-Weight", w); r.status != 200 {
						failed.Add(1)
					}
				})
			}
		}
		wg.Wait()
		if failed.Load() != 0 {
			t.Fatalf("%d of 24 requests with extreme weights failed, want 0", failed.Load())
		}
	}
	with := lightTenantWaitAfter(t, true, "", poison)
	t.Logf("light tenant's latency behind a flood of 80 after extreme weights: %s", with.Round(time.Millisecond))
	if with > time.Second {
		t.Fatalf("light tenant's latency after extreme weights: %s, want under 1s (about one service time)", with)
	}
	// A client reads its answer before the handler returns its slot.
	eventually(t, "every zone is empty after the requests ended", func() bool { return zonesEmpty(t) })
}

// TestFairRedisStore: with store redis, fair sharing applies to this
// instance's own waiters: the light tenant is served at the next slot
// Redis frees, not after the flood.
func TestFairRedisStore(t *testing.T) {
	r := startRedis(t)
	without := lightTenantWait(t, false, r.addr)
	with := lightTenantWait(t, true, r.addr)
	t.Logf("with store redis: light tenant's latency without fair %s, with fair %s", without.Round(time.Millisecond), with.Round(time.Millisecond))
	if without < 2*time.Second || with*4 > without {
		t.Fatalf("light tenant's latency: without fair %s, with fair %s; want over 2s without and under a quarter of that with", without, with)
	}
}

// TestFairJSONErrors: a fair that names no limit, a negative
// max_waiting_per_key and a weight out of range refuse the config with a
// clear message.
func TestFairJSONErrors(t *testing.T) {
	for _, tc := range []struct{ handler, want string }{
		{`{"handler":"inflight","limits":[{"name":"tenant","max":5}],"wait":"10s","fair":"client"}`, `fair "client" is not allowed: want the name of one of this handler's limits ["tenant"]`},
		{`{"handler":"inflight","limits":[{"name":"tenant","max":5}],"wait":"10s","max_waiting_per_key":-1}`, `max_waiting_per_key -1 is not allowed: want a positive integer`},
		{`{"handler":"inflight","limits":[{"name":"tenant","max":5}],"wait":"10s","fair":"tenant","weight":"5000"}`, `weight "5000" is not allowed: want a number from 0.001 to 1000, or a placeholder`},
	} {
		err := loadJSONRoute(tc.handler)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to contain %q", tc.handler, err, tc.want)
		}
	}
}
