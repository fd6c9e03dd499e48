package inflight

import (
	"testing"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// benchmarkKeyed is the handler's own path without HTTP around it: evaluate
// the key from a prepared request, admit, release.
func benchmarkKeyed(b *testing.B, tmpl string, max int64) {
	r, _ := request("198.51.100.7:5555", "X-Api-Key", "key-0123456789")
	key := compileKey(tmpl)
	z := limiter.NewZone(1, false, nil)
	a := struct{ req limiter.Request }{limiter.Request{Keys: make([]string, 1), Max: make([]int64, 1)}}
	a.req.Limits = &limiter.Limits{Max: []int64{max}}
	if max == 1 { // occupy the only slot: every iteration is refused
		a.req.Keys[0] = key(r)
		z.TryAcquire(&a.req)
	}
	b.ReportAllocs()
	for b.Loop() {
		a.req.Keys[0] = key(r)
		if ok, _ := z.TryAcquire(&a.req); ok {
			z.Release(&a.req)
		}
	}
}

func BenchmarkAdmitReleaseClientIP(b *testing.B) { benchmarkKeyed(b, DefaultKey, 100) }
func BenchmarkAdmitReleaseHeader(b *testing.B) {
	benchmarkKeyed(b, "{http.request.header.X-Api-Key}", 100)
}
func BenchmarkRefuseClientIP(b *testing.B) { benchmarkKeyed(b, DefaultKey, 1) }
func BenchmarkRefuseHeader(b *testing.B)   { benchmarkKeyed(b, "{http.request.header.X-Api-Key}", 1) }
