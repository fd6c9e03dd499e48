package integration

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// discard is a reusable ResponseWriter, so the benchmark measures Caddy and
// the handler, not a recorder.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}

func init() {
	caddy.RegisterModule(new(passThrough))
	httpcaddyfile.RegisterHandlerDirective("pass_through", func(httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		return new(passThrough), nil
	})
	httpcaddyfile.RegisterDirectiveOrder("pass_through", httpcaddyfile.After, "forward_auth")
}

// passThrough is a middleware that does nothing: what any handler costs
// Caddy's chain (a closure per middleware per request) before doing any
// work of its own.
type passThrough struct{}

func (*passThrough) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.pass_through", New: func() caddy.Module { return new(passThrough) }}
}

func (*passThrough) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	return next.ServeHTTP(w, r)
}

// BenchmarkCaddyRoute serves requests through a real, provisioned Caddy
// server (route matching, request preparation, handler chain,
// static_response): without any middleware, with a middleware that does
// nothing, with `inflight 100000`, and with it and `total adaptive`, in one
// process and one run. with_inflight − without is what a user pays;
// with_inflight − pass_through is inflight's own work; with_adaptive −
// with_inflight is what the adaptive total adds (its writer wrapper, two
// clock reads and the controller's lock per request).
func BenchmarkCaddyRoute(b *testing.B) {
	for _, tc := range []struct{ name, directive string }{
		{"without", ""},
		{"pass_through", "\tpass_through\n"},
		{"with_inflight", "\tinflight 100000\n"},
		{"with_adaptive", "\tinflight 100000 {\n\t\ttotal adaptive\n\t}\n"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			srv, req, w := routeServer(b, tc.directive)
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				srv.ServeHTTP(w, req)
			}
		})
	}
}

// BenchmarkStoreLatency serves requests through a real Caddy route with
// the counts in this process and with them in Redis on loopback, and
// reports each request's p50 and p99 latency: the difference is what a
// fleet-wide cap costs per request (one round trip to admit, one to
// release).
func BenchmarkStoreLatency(b *testing.B) {
	r := startRedis(b)
	for _, tc := range []struct{ name, store string }{
		{"in_process", ""},
		{"redis", "\t\tstore redis {\n\t\t\taddress " + r.addr + "\n\t\t}\n"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			srv, req, w := routeServer(b, "\tinflight {\n\t\tlimit client {client_ip} 100000\n"+tc.store+"\t}\n")
			latencies := make([]time.Duration, 0, b.N)
			for b.Loop() {
				clear(w.h)
				start := time.Now()
				srv.ServeHTTP(w, req)
				latencies = append(latencies, time.Since(start))
			}
			slices.Sort(latencies)
			b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds()), "p99-µs")
		})
	}
}

// routeServer loads a site with the directives before `respond "ok"` and
// returns its provisioned server, a request to it from a fixed client, and
// a reusable writer; Caddy stops when the benchmark ends.
func routeServer(b *testing.B, directives string) (*caddyhttp.Server, *http.Request, *discard) {
	port := freePort(b)
	if err := tryLoad(fmt.Sprintf("http://127.0.0.1:%d {\n%s\trespond \"ok\"\n}\n", port, directives)); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { caddy.Stop() })
	app, err := caddy.ActiveContext().App("http")
	if err != nil {
		b.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/", port), nil)
	req.RemoteAddr = "198.51.100.7:40000"
	return app.(*caddyhttp.App).Servers["srv0"], req, &discard{h: http.Header{}}
}

// BenchmarkWaitRouteQueued serves requests from many goroutines through
// `inflight 1` with `wait`, so that nearly every request waits for the one
// slot: the wait path, without and with per-key metrics (which add, per
// wait, a key's label, a lock and an observation in its histogram).
func BenchmarkWaitRouteQueued(b *testing.B) {
	for _, tc := range []struct{ name, metrics string }{
		{"per_key_off", ""},
		{"per_key_on", "\t\tmetrics per_key\n"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			srv, req, _ := routeServer(b, "\tinflight 1 {\n\t\twait 30s\n"+tc.metrics+"\t}\n")
			b.ReportAllocs()
			b.SetParallelism(4)
			b.RunParallel(func(pb *testing.PB) {
				r, w := req.Clone(req.Context()), &discard{h: http.Header{}}
				for pb.Next() {
					clear(w.h)
					srv.ServeHTTP(w, r)
				}
			})
		})
	}
}
