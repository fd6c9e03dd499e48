package integration

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// waitSite is a site with one slot per tenant, a queue, and priorities from
// X-Priority; it returns the Caddyfile for a given max, and the base URL.
func waitSite(t *testing.T, b *backend, wait string) (func(max int) string, string) {
	port := freePort(t)
	return func(max int) string {
		return fmt.Sprintf(`http://127.0.0.1:%d {
	inflight {
		limit tenant {header.X-Tenant} %d
		zone queue
		wait %s
		max_waiting 3
		priority {header.X-Priority}
	}
	reverse_proxy %s
}
`, port, max, wait, b.addr)
	}, fmt.Sprintf("http://127.0.0.1:%d", port)
}

func waiting(t *testing.T) float64 { return metric(t, "caddy_inflight_waiting", `zone="queue"`) }

func TestWaitersAreAdmittedByPriority(t *testing.T) {
	b := newBackend(t)
	conf, url := waitSite(t, b, "30s")
	load(t, conf(1))
	c := client("127.0.0.1")

	holder := hold(t, b, context.Background(), c, url+"/hold", "X-Tenant", "t", "X-Name", "holder")

	done := make(chan result, 3)
	for i, class := range []string{"low", "normal", "high"} {
		go func() {
			done <- get(context.Background(), c, url+"/hold", "X-Tenant", "t", "X-Priority", class, "X-Name", class)
		}()
		eventually(t, class+" is queued", func() bool { return waiting(t) == float64(i+1) })
	}
	// Another tenant is not held up by the queue.
	if r := get(context.Background(), c, url+"/", "X-Tenant", "other"); r.status != 200 {
		t.Fatalf("another tenant while t's queue waits: %d, want 200", r.status)
	}
	b.open()
	<-holder
	for range 3 {
		if r := <-done; r.status != 200 {
			t.Fatalf("waiter ended %d, want 200", r.status)
		}
	}
	got := fmt.Sprint(b.order())
	if got != "[holder  high normal low]" {
		t.Fatalf("backend saw %s, want [holder  high normal low] (the other tenant second)", got)
	}
	if b.peak.Load() != 2 { // t's one slot plus the other tenant
		t.Fatalf("backend peak %d, want 2", b.peak.Load())
	}
	if w := waiting(t); w != 0 {
		t.Fatalf("caddy_inflight_waiting = %v after the queue drained", w)
	}
}

func TestWaitTimeoutAndQueueFull(t *testing.T) {
	b := newBackend(t)
	conf, url := waitSite(t, b, "1s") // long enough to queue three under load
	load(t, conf(1))
	c := client("127.0.0.1")
	holder := hold(t, b, context.Background(), c, url+"/hold", "X-Tenant", "t")

	before := metric(t, "caddy_inflight_rejected_total", `zone="queue"`, `reason="timeout"`)
	// The wait as the server measured it, by the buckets of its histogram.
	timedOut := func(le string) float64 {
		return metric(t, "caddy_inflight_wait_seconds_bucket", `zone="queue"`, `outcome="timeout"`, `le="`+le+`"`)
	}
	upTo1, upTo2500ms := timedOut("1"), timedOut("2.5")
	start := time.Now()
	r := get(context.Background(), c, url+"/", "X-Tenant", "t")
	waited := time.Since(start)
	if r.status != 429 || r.retryAfter != "1" {
		t.Fatalf("timed-out request: %d Retry-After %q, want 429 and 1", r.status, r.retryAfter)
	}
	if got1, got2500ms := timedOut("1")-upTo1, timedOut("2.5")-upTo2500ms; got1 != 0 || got2500ms != 1 {
		t.Fatalf("the server measured the timed-out wait in (0, 1] s %v times and in (0, 2.5] s %v times, want 0 and 1: refused after its wait of 1s, within 1.5 s of it (docs/waiting.md)", got1, got2500ms)
	}
	t.Logf("timed out after %v at the client (wait 1s)", waited)
	if got := metric(t, "caddy_inflight_rejected_total", `zone="queue"`, `reason="timeout"`) - before; got != 1 {
		t.Fatalf("timeout refusals counted %v, want 1", got)
	}

	// Three wait (max_waiting 3); the fourth is refused at once. A long
	// wait now, so none of the three leaves before the fourth comes.
	long, longURL := waitSite(t, b, "30s")
	load(t, long(1))
	c.CloseIdleConnections()
	done := make(chan result, 3)
	for i := range 3 {
		go func() { done <- get(context.Background(), c, longURL+"/", "X-Tenant", "t") }()
		eventually(t, "queued", func() bool { return waiting(t) == float64(i+1) })
	}
	// At once: its 429 comes while nothing has moved, the slot still held
	// and the three still waiting (their wait is 30s), so it waited for
	// neither a slot nor a timeout.
	fullBefore := metric(t, "caddy_inflight_rejected_total", `zone="queue"`, `reason="queue_full"`)
	timeoutsBefore := metric(t, "caddy_inflight_rejected_total", `zone="queue"`, `reason="timeout"`)
	r = get(context.Background(), c, longURL+"/", "X-Tenant", "t")
	full := metric(t, "caddy_inflight_rejected_total", `zone="queue"`, `reason="queue_full"`) - fullBefore
	timeouts := metric(t, "caddy_inflight_rejected_total", `zone="queue"`, `reason="timeout"`) - timeoutsBefore
	if r.status != 429 || full != 1 || timeouts != 0 || waiting(t) != 3 || b.cur.Load() != 1 {
		t.Fatalf("fourth waiter: %d, %v queue_full and %v timeout refusals, then %v waiting and %d at the backend; want 429 at once: 1 queue_full, no timeout, 3 waiting, the holder still at the backend",
			r.status, full, timeouts, waiting(t), b.cur.Load())
	}
	b.open() // the holder ends; the three are admitted in turn
	<-holder
	for range 3 {
		if r := <-done; r.status != 200 {
			t.Fatalf("a waiter ended %d, want 200", r.status)
		}
	}
}

func TestAbortWhileWaitingLeavesTheQueue(t *testing.T) {
	b := newBackend(t)
	conf, url := waitSite(t, b, "30s")
	load(t, conf(1))
	c := client("127.0.0.1")
	holder := hold(t, b, context.Background(), c, url+"/hold", "X-Tenant", "t")

	before := metric(t, "caddy_inflight_wait_seconds_count", `zone="queue"`, `outcome="aborted"`)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan result)
	go func() { done <- get(ctx, c, url+"/", "X-Tenant", "t") }()
	eventually(t, "queued", func() bool { return waiting(t) == 1 })
	cancel()
	<-done
	eventually(t, "the queue is empty", func() bool { return waiting(t) == 0 })
	if got := metric(t, "caddy_inflight_wait_seconds_count", `zone="queue"`, `outcome="aborted"`) - before; got != 1 {
		t.Fatalf("aborted waits counted %v, want 1", got)
	}
	b.open()
	<-holder
	// A client reads its answer before the handler returns its slot.
	eventually(t, "no slot is held after all ended", func() bool {
		return metric(t, "caddy_inflight_requests", `zone="queue"`) == 0
	})
	if n := b.served.Load(); n != 1 {
		t.Fatalf("backend served %d, want only the holder", n)
	}
}

func TestReloadRaisingMaxAdmitsWaiters(t *testing.T) {
	b := newBackend(t)
	conf, url := waitSite(t, b, "30s")
	load(t, conf(1))
	c := client("127.0.0.1")
	done := make(chan result, 3)
	go func() { done <- get(context.Background(), c, url+"/hold", "X-Tenant", "t") }()
	eventually(t, "the holder has the slot", func() bool { return b.cur.Load() == 1 })
	for i := range 2 {
		go func() { done <- get(context.Background(), c, url+"/hold", "X-Tenant", "t") }()
		eventually(t, "queued", func() bool { return waiting(t) == float64(i+1) })
	}
	if err := tryLoad(conf(3)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the waiters are admitted under the raised max", func() bool { return b.cur.Load() == 3 })
	b.open()
	for range 3 {
		if r := <-done; r.status != 200 {
			t.Fatalf("request across the reload: %d, want 200", r.status)
		}
	}
}
