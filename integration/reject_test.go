package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
)

// site returns a Caddyfile site on a free loopback port proxying to b, with
// the given directives before reverse_proxy, and its base URL.
func site(t *testing.T, b *backend, directives string) (string, string) {
	port := freePort(t)
	return fmt.Sprintf("http://127.0.0.1:%d {\n%s\n\treverse_proxy %s\n}\n", port, directives, b.addr),
		fmt.Sprintf("http://127.0.0.1:%d", port)
}

func TestBurstAdmitsExactlyMax(t *testing.T) {
	b := newBackend(t)
	cfg, url := site(t, b, "\tinflight 5")
	load(t, cfg)
	c := client("127.0.0.1")

	done := make(chan []result)
	go func() { done <- burst(c, 5, url+"/hold") }()
	eventually(t, "5 requests reach the backend", func() bool { return b.cur.Load() == 5 })

	refused := burst(c, 15, url+"/hold")
	for _, r := range refused {
		if r.status != 429 || r.retryAfter != "1" {
			t.Fatalf("over the cap: status %d Retry-After %q err %v, want 429 and 1", r.status, r.retryAfter, r.err)
		}
	}
	if got := metric(t, "caddy_inflight_requests", `limit="client"`); got != 5 {
		t.Fatalf("caddy_inflight_requests = %v, want 5", got)
	}
	b.open()
	if got := countStatus(<-done); got[200] != 5 {
		t.Fatalf("held requests ended %v, want 5 × 200", got)
	}
	if p := b.peak.Load(); p != 5 {
		t.Fatalf("backend saw %d at once, want 5", p)
	}
	// A client reads its answer before the handler returns its slot.
	eventually(t, "caddy_inflight_requests is 0 after the burst", func() bool {
		return metric(t, "caddy_inflight_requests", `limit="client"`) == 0
	})
	if got := metric(t, "caddy_inflight_rejected_total", `limit="client"`, `reason="full"`); got < 15 {
		t.Fatalf("rejected_total = %v, want at least 15", got)
	}
	// When one finishes, the next is admitted.
	if r := get(context.Background(), c, url+"/hold"); r.status != 200 {
		t.Fatalf("after the burst: %d, want 200", r.status)
	}
}

func TestClientsAreIsolatedAndXFFIsNotTrusted(t *testing.T) {
	b := newBackend(t)
	cfg, url := site(t, b, "\tinflight 1")
	load(t, cfg)
	one, two := client("127.0.0.1"), client("127.0.0.2")

	done := hold(t, b, context.Background(), one, url+"/hold")

	// 127.0.0.1 is not a trusted proxy: its X-Forwarded-For is ignored.
	for _, h := range [][]string{nil, {"X-Forwarded-For", "203.0.113.9"}, {"X-Real-IP", "203.0.113.9"}} {
		if r := get(context.Background(), one, url+"/", h...); r.status != 429 {
			t.Fatalf("127.0.0.1 with %v: %d, want 429", h, r.status)
		}
	}
	if r := get(context.Background(), two, url+"/"); r.status != 200 {
		t.Fatalf("127.0.0.2 while 127.0.0.1 is full: %d, want 200", r.status)
	}
	b.open()
	<-done
}

func TestTrustedProxyKeysByRealClient(t *testing.T) {
	b := newBackend(t)
	port := freePort(t)
	loadWith(t, "\tservers {\n\t\ttrusted_proxies static 127.0.0.1/32\n\t}", fmt.Sprintf(`http://127.0.0.1:%d {
	inflight 1
	reverse_proxy %s
}
`, port, b.addr))
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := client("127.0.0.1")
	done := hold(t, b, context.Background(), c, url+"/hold", "X-Forwarded-For", "198.51.100.1")
	if r := get(context.Background(), c, url+"/", "X-Forwarded-For", "198.51.100.1"); r.status != 429 {
		t.Fatalf("same client behind the proxy: %d, want 429", r.status)
	}
	if r := get(context.Background(), c, url+"/", "X-Forwarded-For", "198.51.100.2"); r.status != 200 {
		t.Fatalf("another client behind the proxy: %d, want 200", r.status)
	}
	b.open()
	<-done
}

// A stream holds its slot to its end: once its headers and first event have
// reached the client, the next request is still refused, and the slot is
// free only after the stream ends.
func TestStreamHoldsItsSlotToTheEnd(t *testing.T) {
	b := newBackend(t)
	cfg, url := site(t, b, "\tinflight 1")
	load(t, cfg)
	c := client("127.0.0.1")

	resp, err := c.Get(url + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := bufio.NewReader(resp.Body)
	if line, err := events.ReadString('\n'); err != nil || line != "data: start\n" {
		t.Fatalf("stream: %d, first line %q %v; want 200 and data: start", resp.StatusCode, line, err)
	}
	if r := get(context.Background(), c, url+"/"); r.status != 429 {
		t.Fatalf("during the stream: %d, want 429", r.status)
	}
	b.open()
	if rest, err := io.ReadAll(events); err != nil || !strings.Contains(string(rest), "data: end") {
		t.Fatalf("stream after the first event: %q %v, want data: end", rest, err)
	}
	eventually(t, "the slot is free", func() bool { return get(context.Background(), c, url+"/").status == 200 })
}

func TestAbortedClientFreesItsSlot(t *testing.T) {
	b := newBackend(t)
	cfg, url := site(t, b, "\tinflight 1")
	load(t, cfg)
	c := client("127.0.0.1")

	ctx, cancel := context.WithCancel(context.Background())
	done := hold(t, b, ctx, c, url+"/hold")
	cancel()
	if r := <-done; r.err == nil {
		t.Fatalf("cancelled request ended with %d, want an error", r.status)
	}
	eventually(t, "the slot is free again", func() bool { return metric(t, "caddy_inflight_requests", `limit="client"`) == 0 })
	if r := get(context.Background(), c, url+"/"); r.status != 200 {
		t.Fatalf("after the abort: %d, want 200", r.status)
	}
}

func TestPanicBelowReleasesSlot(t *testing.T) {
	port := freePort(t)
	load(t, fmt.Sprintf(`http://127.0.0.1:%d {
	inflight 2
	abort
}
`, port))
	c := client("127.0.0.1")
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	for range 10 {
		if r := get(context.Background(), c, url); r.err == nil {
			t.Fatalf("abort answered %d, want a dropped connection", r.status)
		}
	}
	eventually(t, "caddy_inflight_requests is 0 after aborted handlers", func() bool {
		return metric(t, "caddy_inflight_requests", `limit="client"`) == 0
	})
}

func TestReloadLowersCapWhileInFlight(t *testing.T) {
	b := newBackend(t)
	port := freePort(t)
	conf := func(max int) string {
		return fmt.Sprintf("http://127.0.0.1:%d {\n\tinflight %d\n\treverse_proxy %s\n}\n", port, max, b.addr)
	}
	load(t, conf(5))
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := client("127.0.0.1")

	done := make(chan []result)
	go func() { done <- burst(c, 4, url+"/hold") }()
	eventually(t, "4 in flight", func() bool { return b.cur.Load() == 4 })

	if err := tryLoad(conf(2)); err != nil { // a real reload, as POST /load does
		t.Fatal(err)
	}
	c.CloseIdleConnections() // kept connections belong to the old server
	if r := getReached(context.Background(), c, url+"/"); r.status != 429 {
		t.Fatalf("after lowering to 2 with 4 in flight: %d %v, want 429", r.status, r.err)
	}
	if got := metric(t, "caddy_inflight_requests", `limit="client"`); got != 4 {
		t.Fatalf("in flight after reload = %v, want the 4 carried over", got)
	}
	b.open()
	if got := countStatus(<-done); got[200] != 4 {
		t.Fatalf("requests across the reload ended %v, want 4 × 200", got)
	}
	b.close()
	held := make(chan []result)
	go func() { held <- burst(c, 2, url+"/hold") }()
	eventually(t, "2 in flight under the new cap", func() bool { return b.cur.Load() == 2 })
	if r := get(context.Background(), c, url+"/"); r.status != 429 {
		t.Fatalf("third request under cap 2: %d, want 429", r.status)
	}
	b.open()
	<-held
}

func TestHandleErrorsSeesTheLimitName(t *testing.T) {
	b := newBackend(t)
	port := freePort(t)
	load(t, fmt.Sprintf(`http://127.0.0.1:%d {
	inflight {
		limit tenant {header.X-Tenant} 1
		status 503
		retry_after 2500ms
	}
	reverse_proxy %s
	handle_errors {
		respond "{\"error\":\"{http.inflight.limit}\",\"reason\":\"{http.inflight.reason}\",\"status\":{err.status_code}}"
	}
}
`, port, b.addr))
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := client("127.0.0.1")
	done := hold(t, b, context.Background(), c, url+"/hold", "X-Tenant", "acme")
	r := get(context.Background(), c, url+"/", "X-Tenant", "acme")
	if r.status != 503 || r.retryAfter != "3" || r.body != `{"error":"tenant","reason":"full","status":503}` {
		t.Fatalf("refusal: %d Retry-After %q body %q", r.status, r.retryAfter, r.body)
	}
	// No tenant header: the key is empty and the limit does not apply.
	if r := get(context.Background(), c, url+"/"); r.status != 200 {
		t.Fatalf("without a key: %d, want 200", r.status)
	}
	b.open()
	<-done
}

func TestExemptionByMatcher(t *testing.T) {
	b := newBackend(t)
	cfg, url := site(t, b, "\t@limited not client_ip 127.0.0.2/32\n\tinflight @limited 1")
	load(t, cfg)
	for _, ip := range []string{"127.0.0.1", "127.0.0.2"} {
		b.close()
		c := client(ip)
		done := hold(t, b, context.Background(), c, url+"/hold")
		want := 429
		if ip == "127.0.0.2" {
			want = 200 // exempt
		}
		if r := get(context.Background(), c, url+"/"); r.status != want {
			t.Fatalf("%s second request: %d, want %d", ip, r.status, want)
		}
		b.open()
		<-done
	}
}

func TestTenantMaxFromMap(t *testing.T) {
	b := newBackend(t)
	port := freePort(t)
	load(t, fmt.Sprintf(`http://127.0.0.1:%d {
	map {header.X-Api-Key} {tenant} {tenant_max} {
		key-a acme 2
		key-b globex 1
		key-bad broken zero
		default "" 1
	}
	inflight {
		limit tenant {tenant} {tenant_max}
	}
	reverse_proxy %s
}
`, port, b.addr))
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := client("127.0.0.1")
	refused := func() float64 { return metric(t, "caddy_inflight_rejected_total", `limit="tenant"`, `reason="full"`) }
	before := refused()
	done := make(chan []result)
	go func() { done <- burst(c, 3, url+"/hold", "X-Api-Key", "key-a") }()
	// The third must be refused before the gate opens, or on a slow
	// machine it arrives after and is admitted in a freed slot.
	eventually(t, "acme at its cap of 2, its third refused", func() bool { return b.cur.Load() == 2 && refused()-before == 1 })
	if r := get(context.Background(), c, url+"/", "X-Api-Key", "key-b"); r.status != 200 {
		t.Fatalf("globex: %d, want 200", r.status)
	}
	if r := get(context.Background(), c, url+"/", "X-Api-Key", "key-bad"); r.status != 500 {
		t.Fatalf("a max that is not a number: %d, want 500", r.status)
	}
	b.open()
	if got := countStatus(<-done); got[200] != 2 || got[429] != 1 {
		t.Fatalf("acme burst of 3 with max 2: %v", got)
	}
}

func TestDryRunCountsButNeverRefuses(t *testing.T) {
	b := newBackend(t)
	cfg, url := site(t, b, "\tinflight 1 {\n\t\tzone dry\n\t\tdry_run\n\t}")
	load(t, cfg)
	c := client("127.0.0.1")
	before := metric(t, "caddy_inflight_rejected_total", `zone="dry"`, `reason="dry_run"`)
	done := make(chan []result)
	go func() { done <- burst(c, 4, url+"/hold") }()
	eventually(t, "all 4 reach the backend", func() bool { return b.cur.Load() == 4 })
	if got := metric(t, "caddy_inflight_requests", `zone="dry"`); got != 1 {
		t.Fatalf("slots held in dry run = %v, want 1 (the others would have been refused)", got)
	}
	b.open()
	if got := countStatus(<-done); got[200] != 4 {
		t.Fatalf("dry run: %v, want 4 × 200", got)
	}
	if got := metric(t, "caddy_inflight_rejected_total", `zone="dry"`, `reason="dry_run"`) - before; got != 3 {
		t.Fatalf("dry-run refusals counted %v, want 3", got)
	}
}

func TestBadConfigRefusesToStart(t *testing.T) {
	for _, tc := range []struct{ cfg, want string }{
		{`{"handler":"inflight","limits":[{"name":"client","max":-3}]}`, `max "-3" is not allowed`},
		{`{"handler":"inflight","limits":[{"name":"client","max":"lots"}]}`, `max "lots" is not allowed`},
		{`{"handler":"inflight","limits":[{"name":"client"}]}`, `limit "client": max is missing`},
		{`{"handler":"inflight","limits":[{"name":"a b","max":1}]}`, `name "a b" is not allowed`},
		{`{"handler":"inflight","limits":[{"name":"total","max":1}]}`, `name "total" is reserved`},
		{`{"handler":"inflight","limits":[{"name":"c","max":1},{"name":"c","max":2}]}`, `name "c" is used twice`},
		{`{"handler":"inflight","total":5,"status_code":302}`, `status_code 302 is not allowed: want 400-599`},
		{`{"handler":"inflight"}`, `no limit`},
		{`{"handler":"inflight","total":5,"replicas":-1}`, `replicas -1 is not allowed`},
		{`{"handler":"inflight","total":5,"wait":"-1s"}`, `wait -1s is not allowed`},
		{`{"handler":"inflight","total":-5}`, `total -5 is not allowed: want an integer from 1 to 1099511627775`},
		{`{"handler":"inflight","total":5,"retry_after":"-2s"}`, `retry_after -2s is not allowed`},
		{`{"handler":"inflight","total":5,"max_waiting":-1}`, `max_waiting -1 is not allowed`},
		{`{"handler":"inflight","total":5,"max_keys":-1}`, `max_keys -1 is not allowed`},
		{`{"handler":"inflight","total":5,"status_code":"429"}`, `cannot unmarshal string`},
	} {
		err := loadJSONRoute(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to contain %q", tc.cfg, err, tc.want)
		}
	}
}

func TestZoneWithTwoShapesIsRefused(t *testing.T) {
	port := freePort(t)
	err := tryLoad(fmt.Sprintf(`http://127.0.0.1:%d {
	handle /a {
		inflight {
			zone shared
			limit client {client_ip} 5
		}
		respond "a"
	}
	handle /b {
		inflight {
			zone shared
			limit key {header.X-Api-Key} 5
		}
		respond "b"
	}
}
`, port))
	if err == nil || !strings.Contains(err.Error(), `zone "shared" is used with limits`) {
		t.Fatalf("error %v, want a zone conflict", err)
	}
}
