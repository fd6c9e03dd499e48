package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// zoneStates reads GET /inflight/, by zone name.
func zoneStates(t *testing.T) map[string]ZoneLike {
	t.Helper()
	var state struct{ Zones []ZoneLike }
	if err := json.Unmarshal([]byte(adminGet(t, "/inflight/")), &state); err != nil {
		t.Fatal(err)
	}
	out := map[string]ZoneLike{}
	for _, z := range state.Zones {
		if _, dup := out[z.Zone]; dup {
			t.Fatalf("two zones named %q: %+v", z.Zone, state.Zones)
		}
		out[z.Zone] = z
	}
	return out
}

// zonesEmpty reports whether every zone, retired ones included, holds
// nothing and has no one waiting.
func zonesEmpty(t *testing.T) bool {
	t.Helper()
	for _, z := range zoneStates(t) {
		if !z.empty() {
			return false
		}
	}
	return true
}

func names(m map[string]ZoneLike) []string {
	var out []string
	for n := range m {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func TestUnnamedDirectivesInTwoSitesHaveTheirOwnCounters(t *testing.T) {
	b := newBackend(t)
	port := freePort(t)
	load(t, fmt.Sprintf(`http://a.test:%[1]d {
	inflight 100
	reverse_proxy %[2]s
}
http://b.test:%[1]d {
	inflight 1
	reverse_proxy %[2]s
}
`, port, b.addr))
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := client("127.0.0.1")

	held := hold(t, b, context.Background(), c, url+"/hold", "Host", "a.test")
	if r := get(context.Background(), c, url+"/", "Host", "b.test"); r.status != 200 {
		t.Fatalf("b.test with one request in flight on a.test: %d %v, want 200", r.status, r.err)
	}
	zs := zoneStates(t)
	if got := names(zs); !slices.Equal(got, []string{"a.test#1", "b.test#1"}) {
		t.Fatalf("zones %v, want a.test#1 and b.test#1", got)
	}
	if n := zs["a.test#1"].Limits[0].Held; n != 1 {
		t.Fatalf("a.test#1 holds %d, want 1", n)
	}
	if got := metric(t, "caddy_inflight_requests", `zone="a.test#1"`); got != 1 {
		t.Fatalf(`caddy_inflight_requests{zone="a.test#1"} = %v, want 1`, got)
	}
	b.open()
	<-held
}

func TestStackedDirectivesCountARequestOnceEach(t *testing.T) {
	b := newBackend(t)
	cfg, url := site(t, b, "\t@held path /hold\n\tinflight @held 2\n\tinflight 3")
	load(t, cfg)
	c := client("127.0.0.1")

	first := hold(t, b, context.Background(), c, url+"/hold")
	second := hold(t, b, context.Background(), c, url+"/hold")
	zs := zoneStates(t)
	if len(zs) != 2 {
		t.Fatalf("zones %v, want two", names(zs))
	}
	for name, z := range zs {
		if z.Limits[0].Held != 2 {
			t.Fatalf("zone %s holds %d, want 2 (each directive counts the request once): %s", name, z.Limits[0].Held, adminGet(t, "/inflight/"))
		}
	}
	if r := get(context.Background(), c, url+"/hold"); r.status != 429 {
		t.Fatalf("third /hold request: %d, want 429 from the @held limit of 2", r.status)
	}
	if r := get(context.Background(), c, url+"/"); r.status != 200 {
		t.Fatalf("a request outside @held with 2 of 3 in flight: %d, want 200", r.status)
	}
	b.open()
	<-first
	<-second
}

// A directive keeps its counters over a reload that edits it, and starts
// fresh ones when it moves to another site; the old zone's requests stay
// visible until they end.
func TestUnnamedZoneAcrossReloads(t *testing.T) {
	b := newBackend(t)
	port := freePort(t)
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	conf := func(aMax, bMax int) string {
		cfg := ""
		for _, s := range []struct {
			host string
			max  int
		}{{"a.test", aMax}, {"b.test", bMax}} {
			dir := ""
			if s.max > 0 {
				dir = fmt.Sprintf("\tinflight %d\n", s.max)
			}
			cfg += fmt.Sprintf("http://%s:%d {\n%s\treverse_proxy %s\n}\n", s.host, port, dir, b.addr)
		}
		return cfg
	}
	load(t, conf(3, 0))
	c := client("127.0.0.1")
	var held []<-chan result
	for range 2 {
		held = append(held, hold(t, b, context.Background(), c, url+"/hold", "Host", "a.test"))
	}

	// Edited max: the 2 in flight count against the new cap of 2.
	if err := tryLoad(conf(2, 0)); err != nil {
		t.Fatal(err)
	}
	c.CloseIdleConnections()
	if r := getReached(context.Background(), c, url+"/", "Host", "a.test"); r.status != 429 {
		t.Fatalf("a.test after lowering its max to 2 with 2 in flight: %d %v, want 429", r.status, r.err)
	}

	// Moved to b.test: fresh counters there; a.test#1 still shows its 2.
	if err := tryLoad(conf(0, 2)); err != nil {
		t.Fatal(err)
	}
	c.CloseIdleConnections()
	for range 2 {
		held = append(held, hold(t, b, context.Background(), c, url+"/hold", "Host", "b.test"))
	}
	if r := get(context.Background(), c, url+"/", "Host", "b.test"); r.status != 429 {
		t.Fatalf("b.test third request: %d, want 429", r.status)
	}
	zs := zoneStates(t)
	if a, ok := zs["a.test#1"]; !ok || !a.Retired || a.Limits[0].Held != 2 {
		t.Fatalf("a.test#1 after the move: %+v (present %v), want retired with 2 held", a, ok)
	}
	if got := metric(t, "caddy_inflight_requests", `zone="a.test#1"`); got != 2 {
		t.Fatalf(`caddy_inflight_requests{zone="a.test#1"} = %v, want 2`, got)
	}
	if p := b.cur.Load(); p != 4 {
		t.Fatalf("backend has %d in flight, want 4 (2 per zone) during the move", p)
	}
	b.open()
	for _, h := range held {
		if r := <-h; r.status != 200 {
			t.Fatalf("held request ended %d, want 200", r.status)
		}
	}
	// A slot is given back when the handler returns, just after the client
	// has read the response.
	eventually(t, "only b.test#1 is left once the requests ended", func() bool { return len(zoneStates(t)) == 1 })
}

func TestUnnamedHandlersInJSONHaveTheirOwnCounters(t *testing.T) {
	b := newBackend(t)
	port := freePort(t)
	handler := `{"handler":"inflight","limits":[{"name":"client","max":%d}]}`
	route := `{"match":[{"path":["%s"]}],"handle":[` + handler + `,{"handler":"reverse_proxy","upstreams":[{"dial":"%s"}]}]}`
	cfg := fmt.Sprintf(`{"admin":{"listen":"%s","config":{"persist":false}},"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"automatic_https":{"disable":true},"routes":[`+route+`,`+route+`]}}}}}`,
		adminAddr, port, "/one/*", 1, b.addr, "/two/*", 1, b.addr)
	if err := caddy.Load([]byte(cfg), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := client("127.0.0.1")
	held := hold(t, b, context.Background(), c, url+"/one/hold")
	if r := get(context.Background(), c, url+"/two/"); r.status != 200 {
		t.Fatalf("/two/ with /one/ full: %d, want 200", r.status)
	}
	want := []string{fmt.Sprintf("127.0.0.1:%d#1", port), fmt.Sprintf("127.0.0.1:%d#2", port)}
	if got := names(zoneStates(t)); !slices.Equal(got, want) {
		t.Fatalf("zones %v, want %v", got, want)
	}
	b.open()
	<-held
}

// With store redis, two unnamed directives keep their counts under keys of
// their own in Redis too.
func TestUnnamedDirectivesHaveTheirOwnRedisKeys(t *testing.T) {
	r := startRedis(t)
	b := newBackend(t)
	port := freePort(t)
	site := func(host string, max int) string {
		return fmt.Sprintf("http://%s:%d {\n\tinflight %d {\n\t\tstore redis {\n\t\t\taddress %s\n\t\t}\n\t}\n\treverse_proxy %s\n}\n", host, port, max, r.addr, b.addr)
	}
	load(t, site("a.test", 100)+site("b.test", 1))
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := client("127.0.0.1")

	held := hold(t, b, context.Background(), c, url+"/hold", "Host", "a.test")
	if r := get(context.Background(), c, url+"/", "Host", "b.test"); r.status != 200 {
		t.Fatalf("b.test with one request in flight on a.test: %d %v, want 200", r.status, r.err)
	}
	b.open()
	<-held
}
