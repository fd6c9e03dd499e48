package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The cross product: every option that decides admission, with each store
// (in process, Redis), each with and without a reload while requests are
// held and waiting (with Redis, the reload also changes a store option).
// Each scenario sends a burst through a real Caddy to a
// backend that holds every request until the test lets them go, and checks
// what a user would notice: how many the backend had at once, how many
// waited, the statuses and Retry-After of the refused, that a reload kept
// the counts (a request sent after it is still refused), and that every
// count (metrics, Redis's leases) is back at zero afterwards.

type matrixCase struct {
	name    string
	options string   // the inflight block's lines
	keys    []string // the X-Client header of each request of the burst
	held    int      // requests the backend holds at once
	waiting int      // requests waiting meanwhile, all served later
	// status and retryAfter of the refused (the rest of the burst).
	status     int
	retryAfter string
	// redisHeld is held with store redis, where it differs (replicas).
	redisHeld int
	// queueFull: the burst fills a queue bound, so one more request like
	// the first is refused even while others wait.
	queueFull bool
}

var matrixCases = []matrixCase{
	{name: "limit", options: "limit client {header.X-Client} 2",
		keys: repeat("a", 6), held: 2, status: 429, retryAfter: "1"},
	{name: "total", options: "limit client {header.X-Client} 10\ntotal 2",
		keys: distinct(6), held: 2, status: 429},
	{name: "max_keys", options: "limit client {header.X-Client} 1\nmax_keys 2",
		keys: distinct(6), held: 2, status: 429},
	{name: "status and retry_after", options: "limit client {header.X-Client} 2\nstatus 503\nretry_after 3s",
		keys: repeat("a", 5), held: 2, status: 503, retryAfter: "3"},
	{name: "dry_run", options: "limit client {header.X-Client} 1\ndry_run",
		keys: repeat("a", 4), held: 4},
	{name: "replicas", options: "limit client {header.X-Client} 4\nreplicas 2",
		keys: repeat("a", 6), held: 2, redisHeld: 4, status: 429},
	{name: "wait", options: "limit client {header.X-Client} 2\nwait 30s",
		keys: repeat("a", 6), held: 2, waiting: 4},
	{name: "wait and max_waiting", options: "limit client {header.X-Client} 1\nwait 30s\nmax_waiting 2",
		keys: repeat("a", 5), held: 1, waiting: 2, status: 429, queueFull: true},
	{name: "wait and max_waiting_per_key", options: "limit client {header.X-Client} 1\ntotal 2\nwait 30s\nmax_waiting_per_key 1",
		keys: []string{"a", "a", "a", "b", "b", "b"}, held: 2, waiting: 2, status: 429, queueFull: true},
	{name: "wait, total and fair", options: "limit client {header.X-Client} 10\ntotal 2\nwait 30s\nfair client",
		keys: []string{"a", "a", "a", "a", "b"}, held: 2, waiting: 3},
	{name: "wait, total and priority", options: "limit client {header.X-Client} 10\ntotal 2\nwait 30s\npriority {header.X-Client}",
		keys: []string{"high", "high", "low", "normal", "high"}, held: 2, waiting: 3},
}

func TestMatrix(t *testing.T) {
	r := startRedis(t)
	for i, tc := range matrixCases {
		for _, store := range []string{"process", "redis"} {
			for _, reload := range []bool{false, true} {
				name := fmt.Sprintf("%s/%s/reload=%v", tc.name, store, reload)
				t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
					prefix := ""
					if store == "redis" {
						prefix = fmt.Sprintf("mx%d%v", i, reload)
					}
					runMatrix(t, tc, fmt.Sprintf("mx%d", i), r.addr, prefix, reload)
				})
			}
		}
	}
}

// runMatrix runs one scenario; prefix is the Redis key prefix, or "" in
// process.
func runMatrix(t *testing.T, tc matrixCase, zone, redisAddr, prefix string, reload bool) {
	b := newBackend(t)
	b.close()
	port := freePort(t)
	held := tc.held
	if prefix != "" && tc.redisHeld > 0 {
		held = tc.redisHeld
	}
	site := func(generation int) string {
		storeBlock := ""
		if prefix != "" {
			// The reload changes a store option too: a new Redis client.
			storeBlock = fmt.Sprintf("store redis {\n\t\t\taddress %s\n\t\t\tkey_prefix %s\n\t\t\ton_error closed\n\t\t\ttimeout %dms\n\t\t}",
				redisAddr, prefix, 500+generation)
		}
		return fmt.Sprintf(`http://127.0.0.1:%d {
	respond /generation %d
	inflight {
		%s
		zone %s
		%s
	}
	reverse_proxy %s
}
`, port, generation, strings.ReplaceAll(tc.options, "\n", "\n\t\t"), zone, storeBlock, b.addr)
	}
	load(t, site(1))
	url := fmt.Sprintf("http://127.0.0.1:%d/hold", port)
	c := client("127.0.0.1")

	results := make([]result, len(tc.keys))
	var wg sync.WaitGroup
	var mu sync.Mutex
	ended := 0
	for i, key := range tc.keys {
		wg.Go(func() {
			r := get(context.Background(), c, url, "X-Client", key)
			mu.Lock()
			results[i] = r
			ended++
			mu.Unlock()
		})
	}
	refused := len(tc.keys) - held - tc.waiting
	if tc.status == 0 {
		refused = 0
	}
	endedNow := func() int { mu.Lock(); defer mu.Unlock(); return ended }
	eventually(t, fmt.Sprintf("the backend holds %d, %d wait, %d were refused", held, tc.waiting, refused), func() bool {
		return b.cur.Load() == int64(held) && endedNow() == refused &&
			metric(t, "caddy_inflight_waiting", `zone="`+zone+`"`) == float64(tc.waiting)
	})

	if reload {
		load(t, site(2))
		if tc.status != 0 && (tc.waiting == 0 || tc.queueFull) {
			// The counts and queues carried over: the same client is
			// refused still (bounded: a request that waits instead would
			// hold the test for the whole wait).
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			r := getReached(ctx, c, url, "X-Client", tc.keys[0])
			cancel()
			if r.status != tc.status {
				t.Errorf("a request after the reload: status %d (%v), want %d (the reload lost the counts or the queue bound)", r.status, r.err, tc.status)
			}
		}
		if w := metric(t, "caddy_inflight_waiting", `zone="`+zone+`"`); w != float64(tc.waiting) {
			t.Errorf("after the reload %v wait, want %d", w, tc.waiting)
		}
	}

	b.open()
	wg.Wait()
	got := countStatus(results)
	if got[200] != held+tc.waiting || got[tc.status] != refused {
		t.Errorf("statuses %v, want %d × 200 and %d × %d", got, held+tc.waiting, refused, tc.status)
	}
	for _, r := range results {
		if r.status == tc.status && tc.retryAfter != "" && r.retryAfter != tc.retryAfter {
			t.Errorf("Retry-After %q on a refusal, want %q", r.retryAfter, tc.retryAfter)
		}
	}
	if p := b.peak.Load(); p != int64(held) {
		t.Errorf("the backend had %d at once, want %d", p, held)
	}
	var rc *redis.Client
	if prefix != "" {
		rc = redis.NewClient(&redis.Options{Addr: redisAddr})
		defer rc.Close()
	}
	eventually(t, "every count back at zero", func() bool {
		return metric(t, "caddy_inflight_requests", `zone="`+zone+`"`) == 0 &&
			metric(t, "caddy_inflight_waiting", `zone="`+zone+`"`) == 0 &&
			(rc == nil || fleetUnits(t, rc, prefix) == 0)
	})
}

// TestWaitOrder: waiters reach the backend in priority order, and with
// fair in fair order, with each store and across a reload (with Redis, one
// that changes a store option). One request is held (total 1); the others
// queue one after another, in the worst order for the rule checked.
func TestWaitOrder(t *testing.T) {
	r := startRedis(t)
	for _, tc := range []struct {
		name, option, held string
		queued, want       []string
	}{
		// Priorities come from the key: high before normal before low.
		{"priority", "priority {header.X-Client}", "normal", []string{"low", "normal", "high"}, []string{"high", "normal", "low"}},
		// Once a waiter of a was served, b, which had nothing yet, goes
		// before a's others (in arrival order: a, a, a, b).
		{"fair", "fair client", "a", []string{"a", "a", "a", "b"}, []string{"a", "b", "a", "a"}},
	} {
		for _, store := range []string{"process", "redis"} {
			for _, reload := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/reload=%v", tc.name, store, reload), func(t *testing.T) {
					zone := fmt.Sprintf("order%s%s%v", tc.name, store, reload)
					b := newBackend(t)
					b.close()
					port := freePort(t)
					site := func(generation int) string {
						storeBlock := ""
						if store == "redis" {
							storeBlock = fmt.Sprintf("store redis {\n\t\t\taddress %s\n\t\t\tkey_prefix %s\n\t\t\ttimeout %dms\n\t\t}", r.addr, zone, 500+generation)
						}
						return fmt.Sprintf(`http://127.0.0.1:%d {
	inflight {
		limit client {header.X-Client} 10
		total 1
		wait 30s
		%s
		zone %s
		%s
	}
	reverse_proxy %s
}
`, port, tc.option, zone, storeBlock, b.addr)
					}
					load(t, site(1))
					url := fmt.Sprintf("http://127.0.0.1:%d/hold", port)
					c := client("127.0.0.1")
					var wg sync.WaitGroup
					send := func(key string) {
						wg.Go(func() { get(context.Background(), c, url, "X-Client", key, "X-Name", key) })
					}
					send(tc.held)
					eventually(t, "one held", func() bool { return b.cur.Load() == 1 })
					for i, key := range tc.queued {
						send(key)
						eventually(t, key+" queued", func() bool {
							return metric(t, "caddy_inflight_waiting", `zone="`+zone+`"`) == float64(i+1)
						})
					}
					if reload {
						load(t, site(2))
					}
					b.open()
					wg.Wait()
					if got := b.order()[1:]; !slices.Equal(got, tc.want) {
						t.Errorf("the waiters reached the backend as %v, want %v", got, tc.want)
					}
				})
			}
		}
	}
}

func repeat(key string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = key
	}
	return out
}

func distinct(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprint("c", i)
	}
	return out
}
