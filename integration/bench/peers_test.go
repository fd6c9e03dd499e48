// Package bench compares the inflight engine with other limiters and drives
// a built Caddy with the module under load. It is a module of its own so
// that the plugin's go.mod never gets these peers as dependencies.
package bench

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vulcand/oxy/v2/connlimit"
	"github.com/vulcand/oxy/v2/utils"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// never is a cap no benchmark reaches: every request is admitted, so all
// limiters do the same work (count up, call next, count down).
const never = 1 << 30

// keyOf is where every limiter reads its key: the client address, which the
// benchmark sets per iteration.
func keyOf(r *http.Request) string { return r.RemoteAddr }

// peer is one limiter under test. build puts a fresh limiter in front of next
// and returns a constructor of handlers that share it, one per goroutine, so
// that a limiter needing per-request scratch space can keep it per
// goroutine.
type peer struct {
	name  string
	build func(next http.Handler) func() http.Handler
}

var peers = []peer{
	{"ours", buildOurs},
	{"oxy", buildOxy},
	{"mutexmap", buildMutexMap},
}

// oursState is one goroutine's admission, padded so that two goroutines'
// states never share a cache line.
type oursState struct {
	req  limiter.Request
	keys [1]string
	max  [1]int64
	_    [64]byte
}

func buildOurs(next http.Handler) func() http.Handler {
	z := limiter.NewZone(1, false, nil)
	lim := &limiter.Limits{Max: []int64{never}}
	return func() http.Handler {
		s := new(oursState)
		s.req = limiter.Request{Keys: s.keys[:], Max: s.max[:], Limits: lim}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.keys[0] = keyOf(r)
			slot, _ := z.TryAcquire(&s.req)
			if slot == nil {
				w.WriteHeader(http.StatusTooManyRequests)
				return
			}
			defer slot.Release()
			next.ServeHTTP(w, r)
		})
	}
}

// buildOxy is Traefik's in-flight limiter (its inFlightReq middleware is
// this handler).
func buildOxy(next http.Handler) func() http.Handler {
	extract := utils.ExtractorFunc(func(r *http.Request) (string, int64, error) { return keyOf(r), 1, nil })
	h, err := connlimit.New(next, extract, never)
	if err != nil { // only for a nil extractor
		panic(err)
	}
	return func() http.Handler { return h }
}

// mutexMap is the obvious baseline: one lock around one map.
type mutexMap struct {
	mu   sync.Mutex
	n    map[string]int
	next http.Handler
}

func buildMutexMap(next http.Handler) func() http.Handler {
	m := &mutexMap{n: make(map[string]int), next: next}
	return func() http.Handler { return m }
}

func (m *mutexMap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := keyOf(r)
	m.mu.Lock()
	if m.n[key] >= never {
		m.mu.Unlock()
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	m.n[key]++
	m.mu.Unlock()
	defer m.release(key)
	m.next.ServeHTTP(w, r)
}

func (m *mutexMap) release(key string) {
	m.mu.Lock()
	if m.n[key]--; m.n[key] == 0 { // keep only keys in flight, as the others do
		delete(m.n, key)
	}
	m.mu.Unlock()
}

// discard is a reusable ResponseWriter. The next handler writes nothing, so
// a status written here is a refusal, which would void the comparison.
type discard struct {
	h       http.Header
	refused bool
}

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             { d.refused = true }

// caller is one goroutine's reusable request and writer.
type caller struct {
	r *http.Request
	w *discard
}

func newCaller() caller {
	return caller{r: httptest.NewRequest(http.MethodGet, "http://127.0.0.1/", nil), w: &discard{h: http.Header{}}}
}

// serve calls h with the client address keys[i].
func (c caller) serve(h http.Handler, keys []string, i int) {
	c.r.RemoteAddr = keys[i]
	h.ServeHTTP(c.w, c.r)
}

func (c caller) check(b *testing.B) {
	if c.w.refused {
		b.Error("a request was refused")
	}
}

// clientAddrs returns n (up to 65,536) distinct client addresses.
func clientAddrs(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("198.51.%d.%d:40000", i/256, i%256)
	}
	return keys
}

// BenchmarkPeers drives each limiter the same way: an http.Handler in front
// of a no-op handler, called directly, key from the client address, cycling
// through 1, 100 or 10,000 keys; from one goroutine (mode=loop) and from
// GOMAXPROCS goroutines (mode=parallel). Compare with
//
//	benchstat -col /impl
func BenchmarkPeers(b *testing.B) {
	noop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for _, mode := range []string{"loop", "parallel"} {
		for _, n := range []int{1, 100, 10_000} {
			keys := clientAddrs(n)
			for _, p := range peers {
				b.Run(fmt.Sprintf("mode=%s/keys=%d/impl=%s", mode, n, p.name), func(b *testing.B) {
					handlers := p.build(noop)
					b.ReportAllocs()
					if mode == "loop" {
						loop(b, handlers(), keys)
					} else {
						parallel(b, handlers, keys)
					}
				})
			}
		}
	}
}

func loop(b *testing.B, h http.Handler, keys []string) {
	c := newCaller()
	i := 0
	for b.Loop() {
		c.serve(h, keys, i)
		if i++; i == len(keys) {
			i = 0
		}
	}
	c.check(b)
}

func parallel(b *testing.B, handlers func() http.Handler, keys []string) {
	var start atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		h, c := handlers(), newCaller()
		// Goroutines start far apart in the key list, so that with many keys
		// they mostly work on different keys, as distinct clients would.
		i := int(start.Add(7919)) % len(keys)
		for pb.Next() {
			c.serve(h, keys, i)
			if i++; i == len(keys) {
				i = 0
			}
		}
		c.check(b)
	})
}
