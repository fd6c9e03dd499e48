package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
)

// fleetSite is one instance's Caddyfile: a tenant limit kept in Redis in
// front of the backend.
func fleetSite(port int, redisAddr, backend string, max int, lease, onError string) string {
	return fmt.Sprintf(`{
	admin off
	default_bind 127.0.0.1
	auto_https off
	persist_config off
	log {
		output discard
	}
}
http://127.0.0.1:%d {
	inflight {
		limit tenant {header.X-Tenant} %d
		zone fleet
		store redis {
			address %s
			lease %s
			on_error %s
			timeout 200ms
		}
	}
	reverse_proxy %s
}
`, port, max, redisAddr, lease, onError, backend)
}

// TestFleetSharesOneCap runs three Caddy processes sharing one Redis, limit
// N, and sends a burst of 10×N spread over them: the backend never sees
// more than N at once, and admitted + refused = sent.
func TestFleetSharesOneCap(t *testing.T) {
	const n = 6
	r := startRedis(t)
	b := newBackend(t)
	var urls []string
	for range 3 {
		port := freePort(t)
		startCaddy(t, fleetSite(port, r.addr, b.addr, n, "10s", "closed"), port)
		urls = append(urls, fmt.Sprintf("http://127.0.0.1:%d/hold", port))
	}
	results := make(chan result, 10*n)
	var wg sync.WaitGroup
	c := client("127.0.0.1")
	for i := range 10 * n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results <- get(context.Background(), c, urls[i%3], "X-Tenant", "acme")
		}()
	}
	// The refused return at once; the admitted wait at the backend.
	eventually(t, "every request admitted or refused", func() bool { return int(b.cur.Load())+len(results) == 10*n })
	if got := b.cur.Load(); got != n {
		t.Fatalf("the backend has %d requests at once, want exactly %d", got, n)
	}
	b.open()
	wg.Wait()
	close(results)
	var all []result
	for r := range results {
		all = append(all, r)
	}
	got := countStatus(all)
	t.Logf("burst of %d over 3 instances with limit %d: %v, backend peak %d", 10*n, n, got, b.peak.Load())
	if got[200] != n || got[429] != 9*n || b.peak.Load() != n {
		t.Fatalf("burst: %v, peak %d; want %d × 200, %d × 429, peak %d", got, b.peak.Load(), n, 9*n, n)
	}
}

// TestKilledInstanceSlotsComeBackAfterTheLease kills an instance holding
// slots with SIGKILL: the fleet gets them back once the lease ends, not
// before, and no later than lease + the renewal interval.
func TestKilledInstanceSlotsComeBackAfterTheLease(t *testing.T) {
	const lease = 3 * time.Second
	r := startRedis(t)
	b := newBackend(t)
	portA, portB := freePort(t), freePort(t)
	a := startCaddy(t, fleetSite(portA, r.addr, b.addr, 2, "3s", "closed"), portA)
	startCaddy(t, fleetSite(portB, r.addr, b.addr, 2, "3s", "closed"), portB)
	c := client("127.0.0.1")
	for range 2 {
		go get(context.Background(), c, fmt.Sprintf("http://127.0.0.1:%d/hold", portA), "X-Tenant", "acme")
	}
	eventually(t, "instance A holds both slots", func() bool { return b.cur.Load() == 2 })
	a.kill()
	killed := time.Now()

	urlB := fmt.Sprintf("http://127.0.0.1:%d/", portB)
	var back time.Duration
	for {
		res := get(context.Background(), c, urlB, "X-Tenant", "acme")
		if res.status == 200 {
			back = time.Since(killed)
			break
		}
		if res.status != 429 {
			t.Fatalf("instance B: %d %v", res.status, res.err)
		}
		if time.Since(killed) > 3*lease {
			t.Fatal("the killed instance's slots never came back")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("slots of the killed instance came back after %v (lease %v, renewed every %v)", back, lease, lease/3)
	if back < lease-lease/3 || back > lease+lease/3+time.Second {
		t.Fatalf("slots came back after %v, want between %v (lease minus a renewal) and %v", back, lease-lease/3, lease+lease/3)
	}
}

// TestKilledInstanceStrandsItsAllowance: an instance killed while busy
// far below its cap (100, reserve 10) strands what its allowance holds in
// Redis: its units in flight and, beyond them, its spare and the units it
// was giving back, at most the reserve. Meanwhile the fleet admits
// requests that do not wait up to the cap less what is stranded (less the
// reserve at worst, see docs/fleet-guarantees.md); once the lease has run
// out, up to the whole cap. The run logs the figures.
func TestKilledInstanceStrandsItsAllowance(t *testing.T) {
	const capacity, reserve, holds, clients = 100, 10, 4, 8
	const lease = 5 * time.Second
	r := startRedis(t)
	b := newBackend(t)
	portA, portB := freePort(t), freePort(t)
	a := startCaddy(t, fleetSite(portA, r.addr, b.addr, capacity, lease.String(), "closed"), portA)
	startCaddy(t, fleetSite(portB, r.addr, b.addr, capacity, lease.String(), "closed"), portB)
	rc := redis.NewClient(&redis.Options{Addr: r.addr})
	defer rc.Close()
	c := client("127.0.0.1")
	urlA := fmt.Sprintf("http://127.0.0.1:%d", portA)
	for range holds {
		go get(context.Background(), c, urlA+"/hold", "X-Tenant", "acme")
	}
	eventually(t, "instance A holds its requests", func() bool { return b.cur.Load() == holds })
	// Short requests at A, one after another from each client, for a
	// second: A keeps spare to admit them without a call.
	busy, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var served atomic.Int64
	for range clients {
		wg.Go(func() {
			for busy.Err() == nil {
				if get(busy, c, urlA+"/", "X-Tenant", "acme").status == 200 {
					served.Add(1)
				}
			}
		})
	}
	time.Sleep(time.Second)
	a.kill()
	killed, killedAt := time.Now(), redisNow(t, rc)
	stop()
	wg.Wait()
	stranded := fleetUnits(t, rc, "")
	t.Logf("A served %d short requests in a second; killed with %d held and at most %d short ones in flight, it strands %d units", served.Load(), holds, clients, stranded)
	if stranded < holds || stranded > holds+clients+reserve {
		t.Errorf("stranded %d units, want between %d (held) and %d (in flight at most, plus the reserve)", stranded, holds, holds+clients+reserve)
	}
	eventually(t, "the backend sees A's requests end", func() bool { return b.cur.Load() == 0 })

	// B fills the cap: all but what A stranded.
	fill := func() (admitted int64) {
		refused := make(chan result, capacity)
		urlB := fmt.Sprintf("http://127.0.0.1:%d/hold", portB)
		for range capacity {
			go func() {
				if res := get(context.Background(), c, urlB, "X-Tenant", "acme"); res.status != 0 {
					refused <- res
				}
			}()
		}
		eventually(t, "B answers every request", func() bool { return b.cur.Load()+int64(len(refused)) == capacity })
		for range len(refused) {
			if res := <-refused; res.status != 429 {
				t.Fatalf("B: %d %v, want 429", res.status, res.err)
			}
		}
		admitted = b.cur.Load()
		b.open()
		eventually(t, "B's requests end", func() bool { return b.cur.Load() == 0 })
		b.close()
		return admitted
	}
	expiry := allowanceExpiry(t, rc)
	got := fill()
	if now := redisNow(t, rc); now >= expiry {
		t.Fatalf("B's requests ended %d ms after A's allowance expired: too slow to see it stranded", now-expiry)
	}
	t.Logf("while A's allowance lives, B admitted %d of %d", got, capacity)
	if got > capacity-stranded || got < capacity-stranded-reserve {
		t.Errorf("while A's allowance lives, B admitted %d of %d, want the cap less the %d stranded, %d, or less by the reserve at most", got, capacity, stranded, capacity-stranded)
	}
	// Within a lease of the death: A last wrote its allowance before it.
	time.Sleep(time.Until(killed.Add(lease + 500*time.Millisecond)))
	t.Logf("A's allowance expired %d ms after the kill (lease %v)", expiry-killedAt, lease)
	got = fill()
	t.Logf("after the lease, B admitted %d of %d", got, capacity)
	if got < capacity-reserve {
		t.Errorf("after the lease, B admitted %d of %d, want the cap, or less by the reserve at most", got, capacity)
	}
}

// TestStreamLongerThanLeaseKeepsItsSlot: renewal keeps an allowance alive
// for as long as its request runs. The stream's allowance is watched in
// Redis: after each renewal (its expiry moves on) the only slot is still
// taken, until Redis's clock is two leases past the first expiry.
func TestStreamLongerThanLeaseKeepsItsSlot(t *testing.T) {
	const lease = time.Second
	r := startRedis(t)
	b := newBackend(t)
	port := freePort(t)
	loadRaw(fleetSite(port, r.addr, b.addr, 1, lease.String(), "closed"))
	t.Cleanup(func() { caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := client("127.0.0.1")
	rc := redis.NewClient(&redis.Options{Addr: r.addr})
	defer rc.Close()
	done := hold(t, b, context.Background(), c, url+"/stream", "X-Tenant", "acme")
	var first, expiry int64
	eventually(t, "the stream's allowance is in Redis", func() bool { first = allowanceExpiry(t, rc); return first > 0 })
	renewals := 0
	for expiry = first; redisNow(t, rc) < first+2*lease.Milliseconds(); renewals++ {
		seen := expiry
		eventually(t, "the stream's allowance is renewed", func() bool { expiry = allowanceExpiry(t, rc); return expiry > seen })
		if res := get(context.Background(), c, url+"/", "X-Tenant", "acme"); res.status != 429 {
			t.Fatalf("after %d renewals, while the stream holds the only slot: %d, want 429", renewals+1, res.status)
		}
	}
	t.Logf("the stream's allowance was renewed %d times over three leases", renewals)
	b.open()
	<-done
	eventually(t, "the slot is free after the stream", func() bool {
		return get(context.Background(), c, url+"/", "X-Tenant", "acme").status == 200
	})
}

// redisNow is Redis's clock in ms, the clock leases expire by.
func redisNow(t *testing.T, rc *redis.Client) int64 {
	t.Helper()
	now, err := rc.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMilli()
}

// TestRedisDown stops Redis mid-run, killed (connections refused) or frozen
// (SIGSTOP: connections stay open, no answer comes): fail open keeps
// serving under local caps and logs it, fail closed refuses with the
// configured status; both recover when Redis returns. No Redis operation
// lasts longer than the timeout (200ms) plus what a busy machine's
// scheduler adds, by the store's own measure of each operation
// (caddy_inflight_store_seconds): within its 1s bucket, below go-redis's
// own 3s read and 5s dial timeouts that apply when the timeout does not.
// The run logs the operations' time (docs/performance.md, "Exact caps and
// recovery").
func TestRedisDown(t *testing.T) {
	for _, tc := range []struct{ onError, fault string }{{"open", "killed"}, {"closed", "killed"}, {"open", "frozen"}, {"closed", "frozen"}} {
		t.Run(tc.onError+"/"+tc.fault, func(t *testing.T) {
			onError := tc.onError
			r := startRedis(t)
			b := newBackend(t)
			port := freePort(t)
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			cfg := strings.Replace(fleetSite(port, r.addr, b.addr, 2, "5s", onError), "output discard", "output file "+logFile, 1)
			cfg = strings.Replace(cfg, "admin off", "admin "+adminAddr, 1)
			if err := loadRaw(cfg); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { caddy.Stop() })
			url := fmt.Sprintf("http://127.0.0.1:%d/", port)
			c := client("127.0.0.1")
			if res := get(context.Background(), c, url, "X-Tenant", "acme"); res.status != 200 {
				t.Fatalf("with Redis up: %d", res.status)
			}

			// Every operation of the zone counts: the first to fail may be a
			// release or a renewal, after which requests leave Redis alone.
			// Each reading is of one scrape: renewals go on meanwhile.
			storeOps := func() (ops, within1s, seconds float64) {
				m := scrapeAt(t, adminAddr)
				return metricIn(t, m, "caddy_inflight_store_seconds_count", `zone="fleet"`),
					metricIn(t, m, "caddy_inflight_store_seconds_bucket", `zone="fleet"`, `le="1"`),
					metricIn(t, m, "caddy_inflight_store_seconds_sum", `zone="fleet"`)
			}
			opsBefore, within1sBefore, tookBefore := storeOps()
			if tc.fault == "killed" {
				r.stop()
			} else {
				r.cmd.Process.Signal(syscall.SIGSTOP)
			}
			var slowest time.Duration
			statuses := map[int]int{}
			for range 20 {
				start := time.Now()
				res := get(context.Background(), c, url, "X-Tenant", "acme")
				slowest = max(slowest, time.Since(start))
				statuses[res.status]++
			}
			ops, within1s, took := storeOps()
			ops, within1s, took = ops-opsBefore, within1s-within1sBefore, took-tookBefore
			t.Logf("Redis %s, on_error %s: %v; %v operations asked Redis, %.0f ms in all; slowest request %v", tc.fault, onError, statuses, ops, took*1000, slowest)
			want := map[string]int{"open": 200, "closed": 429}[onError]
			if statuses[want] != 20 {
				t.Fatalf("with Redis %s: %v, want 20 × %d", tc.fault, statuses, want)
			}
			if ops < 1 || within1s != ops {
				t.Fatalf("with Redis %s: %v of %v Redis operations took longer than 1s, %.0f ms in all; the timeout is 200ms", tc.fault, ops-within1s, ops, took*1000)
			}
			if onError == "open" { // local caps still hold
				held := []<-chan result{
					hold(t, b, context.Background(), c, url+"hold", "X-Tenant", "acme"),
					hold(t, b, context.Background(), c, url+"hold", "X-Tenant", "acme"),
				}
				if res := get(context.Background(), c, url, "X-Tenant", "acme"); res.status != 429 {
					t.Fatalf("third request under the local cap of 2: %d, want 429", res.status)
				}
				b.open()
				for _, h := range held {
					<-h
				}
			}
			logs, _ := os.ReadFile(logFile)
			if !strings.Contains(string(logs), "redis store unreachable") {
				t.Errorf("no log line says Redis is unreachable")
			}

			if tc.fault == "killed" {
				r.start(t)
			} else {
				r.cmd.Process.Signal(syscall.SIGCONT)
			}
			eventually(t, "service recovers with Redis back", func() bool {
				return get(context.Background(), c, url, "X-Tenant", "acme").status == 200
			})
		})
	}
}

// TestRedisWaitersWakeOnRelease: a waiter in wait mode is admitted as soon
// as the holder releases, through the release notice.
func TestRedisWaitersWakeOnRelease(t *testing.T) {
	r := startRedis(t)
	b := newBackend(t)
	port := freePort(t)
	cfg := strings.Replace(fleetSite(port, r.addr, b.addr, 1, "5s", "closed"), "zone fleet", "zone fleet\n\t\twait 10s", 1)
	cfg = strings.Replace(cfg, "admin off", "admin "+adminAddr, 1)
	if err := loadRaw(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := client("127.0.0.1")
	holder := hold(t, b, context.Background(), c, url+"/hold", "X-Tenant", "acme")
	waiter := make(chan result, 1)
	go func() { waiter <- get(context.Background(), c, url+"/", "X-Tenant", "acme") }()
	eventually(t, "the waiter is queued", func() bool { return metric(t, "caddy_inflight_waiting", `zone="fleet"`) == 1 })
	select {
	case r := <-waiter:
		t.Fatalf("the waiter ended while the slot was held: %d", r.status)
	default:
	}
	b.open()
	<-holder
	select {
	case r := <-waiter:
		if r.status != 200 {
			t.Fatalf("waiter: %d, want 200", r.status)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not admitted after the release")
	}
}
