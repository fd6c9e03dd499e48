package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A request over the adaptive total is refused as by a fixed total: limit
// `total`, reason `full`; with dry_run the limit is only computed and
// exported.
func TestAdaptiveTotalRefuses(t *testing.T) {
	for _, dryRun := range []bool{false, true} {
		b := newBackend(t)
		zone := fmt.Sprintf("adaptive_refuse_%v", dryRun)
		directives := "\tinflight {\n\t\tzone " + zone + "\n\t\ttotal adaptive {\n\t\t\tinitial 2\n\t\t\tmax 2\n\t\t}\n"
		if dryRun {
			directives += "\t\tdry_run\n"
		}
		cfg, url := site(t, b, directives+"\t}")
		load(t, cfg)
		c := client("127.0.0.1")
		before := metric(t, "caddy_inflight_rejected_total", `zone="`+zone+`"`, `limit="total"`)
		held := []<-chan result{hold(t, b, context.Background(), c, url+"/hold"), hold(t, b, context.Background(), c, url+"/hold")}
		if got := metric(t, "caddy_inflight_adaptive_limit", `zone="`+zone+`"`); got != 2 {
			t.Fatalf("dry_run %v: caddy_inflight_adaptive_limit = %v, want 2", dryRun, got)
		}
		if dryRun {
			held = append(held, hold(t, b, context.Background(), c, url+"/hold"))
			if got := metric(t, "caddy_inflight_rejected_total", `zone="`+zone+`"`, `limit="total"`); got != before {
				t.Fatalf("dry_run: rejected_total went from %v to %v, want no refusal", before, got)
			}
		} else {
			r := get(context.Background(), c, url+"/hold")
			if r.status != 429 {
				t.Fatalf("third request: status %d, want 429", r.status)
			}
			if got := metric(t, "caddy_inflight_rejected_total", `zone="`+zone+`"`, `limit="total"`, `reason="full"`); got != before+1 {
				t.Fatalf("rejected_total{limit=total,reason=full} went from %v to %v, want one more", before, got)
			}
		}
		b.open()
		for _, h := range held {
			if r := <-h; r.status != 200 {
				t.Fatalf("dry_run %v: held request ended %d, want 200", dryRun, r.status)
			}
		}
	}
}

func TestAdaptiveTotalRefusesSharedStore(t *testing.T) {
	err := tryLoad(`http://127.0.0.1:1 {
	inflight {
		total adaptive
		store redis {
			address 127.0.0.1:1
		}
	}
	respond "ok"
}
`)
	if err == nil || !strings.Contains(err.Error(), "total adaptive cannot be used with a shared store (store redis)") {
		t.Fatalf("load: %v, want the shared store refused with total adaptive", err)
	}
}

// workers is a real backend of a fixed number of workers serving a FIFO
// queue (a channel's waiting senders), each request taking service; it
// records how long each request queued inside it. On /fail the
// application answers 500 after 10 ms, outside the workers.
type workers struct {
	slots   chan struct{}
	service time.Duration
	mu      sync.Mutex
	queued  []time.Duration
	record  atomic.Bool
	served  atomic.Int64
}

func (b *workers) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/fail" {
		time.Sleep(10 * time.Millisecond)
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	arrived := time.Now()
	select {
	case b.slots <- struct{}{}:
	case <-r.Context().Done():
		return
	}
	waited := time.Since(arrived)
	time.Sleep(b.service)
	<-b.slots
	if b.record.Load() {
		b.mu.Lock()
		b.queued = append(b.queued, waited)
		b.mu.Unlock()
		b.served.Add(1)
	}
	w.Write([]byte("ok"))
}

// TestAdaptiveRealBackend puts a real backend of c workers (service time
// S) behind a real Caddy under 5× overload from closed-loop clients that
// wait for a slot, first with a fixed `total` of c, then with `total
// adaptive` from its default initial 4, and reports what each measures
// over its run's second half. It asserts what a shared machine cannot move:
// the limit's median left initial and stays at most 2c (the machine's own
// latency can hold it below c: 6 to 9 with both cores busy), no failed
// request, and a baseline not below S. For the figures:
//
//	INFLIGHT_ADAPTIVE_SECONDS=30 go test -count=1 -v -run '^TestAdaptiveRealBackend$' ./integration
func TestAdaptiveRealBackend(t *testing.T) {
	const c, service, initial = 8, 50 * time.Millisecond, 4 // initial: total adaptive's default
	seconds := 4
	if s := os.Getenv("INFLIGHT_ADAPTIVE_SECONDS"); s != "" {
		fmt.Sscan(s, &seconds)
	}
	duration := time.Duration(seconds) * time.Second
	fixed := overload(t, fmt.Sprintf("total %d", c), c, service, duration, 5*c, 0, func() {})
	var limits []float64
	adaptive := overload(t, "total adaptive", c, service, duration, 5*c, 0, func() {
		limits = append(limits, metric(t, "caddy_inflight_adaptive_limit", `zone="real"`))
	})
	slices.Sort(limits)
	settled := limits[len(limits)/2]
	baseline := metric(t, "caddy_inflight_adaptive_baseline_seconds", `zone="real"`)
	t.Logf("real backend c=%d S=%v, %d clients, %v each:", c, service, 5*c, duration)
	t.Logf("  total %d: %v", c, fixed)
	t.Logf("  total adaptive: %v; limit median %.0f (min %.0f, max %.0f), baseline %.1f ms", adaptive, settled, limits[0], limits[len(limits)-1], baseline*1000)

	if fixed.failed+adaptive.failed > 0 {
		t.Errorf("%d requests failed, want none (clients wait for a slot)", fixed.failed+adaptive.failed)
	}
	if settled <= initial || settled > 2*c {
		t.Errorf("limit settled at %.0f, want it moved from initial %d towards c = %d: above %d, at most %d", settled, initial, c, initial, 2*c)
	}
	if baseline < service.Seconds() {
		t.Errorf("baseline %.1f ms, below the service time %v: it cannot be", baseline*1000, service)
	}
}

// overloadResult is what the backend saw in the second half of a run.
type overloadResult struct {
	queueing   time.Duration // median time a request queued inside the backend
	throughput float64       // completions per second / (c/S)
	failed     int64         // requests that did not end in 200
}

func (r overloadResult) String() string {
	return fmt.Sprintf("backend queueing median %v, throughput %.3f of c/S, failed %d", r.queueing.Round(100*time.Microsecond), r.throughput, r.failed)
}

// overload runs closed-loop clients, and errorClients of /fail, for
// duration through `inflight { <total> wait 10s }` (zone real) before a
// fresh backend of c workers, and calls sample every 100 ms of the second
// half.
func overload(t *testing.T, total string, c int, service time.Duration, duration time.Duration, clients, errorClients int, sample func()) overloadResult {
	b := &workers{slots: make(chan struct{}, c), service: service}
	srv := &http.Server{Handler: b}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Close()
	port := freePort(t)
	load(t, fmt.Sprintf(`http://127.0.0.1:%d {
	inflight {
		zone real
		%s
		wait 10s
	}
	reverse_proxy %s
}
`, port, total, l.Addr()))
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)

	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	var wg sync.WaitGroup
	var failed atomic.Int64
	tr := &http.Transport{MaxIdleConnsPerHost: clients + errorClients}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	for range clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				r := get(ctx, hc, url)
				if r.status != 200 && ctx.Err() == nil {
					failed.Add(1)
				}
			}
		})
	}
	for range errorClients {
		wg.Go(func() {
			for ctx.Err() == nil {
				get(ctx, hc, url+"fail")
			}
		})
	}
	half := time.Now().Add(duration / 2)
	for ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
		if time.Now().After(half) {
			if !b.record.Swap(true) {
				half = time.Now()
			}
			sample()
		}
	}
	measured := time.Since(half)
	b.record.Store(false)
	wg.Wait()

	b.mu.Lock()
	defer b.mu.Unlock()
	slices.Sort(b.queued)
	return overloadResult{
		queueing:   b.queued[len(b.queued)/2],
		throughput: float64(b.served.Load()) / measured.Seconds() / (float64(c) / service.Seconds()),
		failed:     failed.Load(),
	}
}

// Two clients hammering a path the application answers 500 in 10 ms do not
// shrink the adaptive total for everyone: beside them, with 12 clients of a
// backend of c = 8 workers, the limit never goes below c over the run's
// second half (4 s). The latency reflex is taken out (tolerance 10): on a
// shared machine it answers the machine's own noise (TestAdaptiveRealBackend),
// and only the failures are under test here. A 500 that counted as overload
// held the limit at 1 to 2. The throughput against a fixed `total 8` beside
// the same two is logged, not asserted: the two runs follow one another, and
// their ratio follows the CPU each got (1.14 on a quiet machine, 0.67 to 0.81
// with two processes spinning on the two cores, the limit at 28 throughout).
// For longer runs:
//
//	INFLIGHT_ADAPTIVE_SECONDS=30 go test -count=1 -v -run '^TestAdaptiveApplicationErrors$' ./integration
func TestAdaptiveApplicationErrors(t *testing.T) {
	const c, service = 8, 50 * time.Millisecond
	seconds := 4
	if s := os.Getenv("INFLIGHT_ADAPTIVE_SECONDS"); s != "" {
		fmt.Sscan(s, &seconds)
	}
	duration := time.Duration(seconds) * time.Second
	fixed := overload(t, fmt.Sprintf("total %d", c), c, service, duration, 3*c/2, 2, func() {})
	var limits []float64
	adaptive := overload(t, "total adaptive {\n\t\t\ttolerance 10\n\t\t}", c, service, duration, 3*c/2, 2, func() {
		limits = append(limits, metric(t, "caddy_inflight_adaptive_limit", `zone="real"`))
	})
	slices.Sort(limits)
	ratio := adaptive.throughput / fixed.throughput
	t.Logf("c=%d S=%v, %d clients and 2 of a 500 path, %v each: total %d: %v; total adaptive: %v, limit median %.0f (%.0f to %.0f); throughput ratio %.2f",
		c, service, 3*c/2, duration, c, fixed, adaptive, limits[len(limits)/2], limits[0], limits[len(limits)-1], ratio)
	if limits[0] < c {
		t.Errorf("beside clients of a 500 path: the limit went down to %.0f (median %.0f), want never below c = %d", limits[0], limits[len(limits)/2], c)
	}
}

// A reload from total adaptive to a fixed total keeps the zone's counts but
// drops its adaptive gauges; back to adaptive, they return.
func TestAdaptiveGaugesFollowTheConfig(t *testing.T) {
	b := newBackend(t)
	port := freePort(t)
	conf := func(total string) string {
		return fmt.Sprintf("http://127.0.0.1:%d {\n\tinflight {\n\t\tzone switch\n\t\t%s\n\t}\n\treverse_proxy %s\n}\n", port, total, b.addr)
	}
	for _, tc := range []struct {
		total string
		want  float64
	}{{"total adaptive {\n\t\t\tinitial 3\n\t\t}", 3}, {"total 5", 0}, {"total adaptive", 3}} {
		load(t, conf(tc.total))
		if got := metric(t, "caddy_inflight_adaptive_limit", `zone="switch"`); got != tc.want {
			t.Fatalf("with %q: caddy_inflight_adaptive_limit = %v, want %v (0: not exported)", tc.total, got, tc.want)
		}
	}
}
