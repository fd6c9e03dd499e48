package inflight

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
	"github.com/caddy-inflight/caddy-inflight/inflight/internal/bodytest"
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
	"github.com/caddy-inflight/caddy-inflight/inflight/llm"
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
		if slot, _ := z.TryAcquire(&a.req); slot != nil {
			slot.Release()
		}
	}
}

func BenchmarkAdmitReleaseClientIP(b *testing.B) { benchmarkKeyed(b, DefaultKey, 100) }
func BenchmarkAdmitReleaseHeader(b *testing.B) {
	benchmarkKeyed(b, "{http.request.header.X-Api-Key}", 100)
}
func BenchmarkRefuseClientIP(b *testing.B) { benchmarkKeyed(b, DefaultKey, 1) }
func BenchmarkRefuseHeader(b *testing.B)   { benchmarkKeyed(b, "{http.request.header.X-Api-Key}", 1) }

// BenchmarkServeParallel admits and releases requests through the whole
// handler, each goroutine with a key of its own, no cost and no total: the
// per-request cost must not grow with the CPUs (go test -cpu 1,2,4,8).
func BenchmarkServeParallel(b *testing.B) {
	h := provisioned(b, &Handler{Config: core.Config{Zone: "bench-parallel", Limits: []core.Limit{{Name: "client", Key: DefaultKey, Max: core.Max{Fixed: 100}}}}})
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	var clients atomic.Int32
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r, _ := request(fmt.Sprintf("198.51.100.%d:5555", clients.Add(1)))
		var w discardWriter
		for pb.Next() {
			if err := h.ServeHTTP(&w, r, next); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// provisioned provisions h in an in-process Caddy, left running until the
// benchmark or test ends.
func provisioned(b testing.TB, h *Handler) *Handler {
	b.Helper()
	cfg := `{"admin": {"disabled": true}, "logging": {"logs": {"default": {"level": "ERROR"}}}}`
	if err := caddy.Load([]byte(cfg), true); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.ActiveContext())
	b.Cleanup(func() {
		cancel()
		h.Cleanup()
		caddy.Stop()
	})
	if err := h.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	return h
}

// discardWriter is a response writer that keeps nothing.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header {
	if w.h == nil {
		w.h = http.Header{}
	}
	return w.h
}
func (*discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (*discardWriter) WriteHeader(int)             {}

// BenchmarkServeTokens serves an LLM request through the whole handler with
// cost tokens: its 2 KiB body estimated, its 4 KiB JSON answer passed
// through. A POST's answer is read for the usage it reports (and settles
// the request); a GET's is not: their ratio is what reading costs.
func BenchmarkServeTokens(b *testing.B) {
	answer := []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("lorem ipsum ", 330) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":512,"completion_tokens":990,"total_tokens":1502}}`)
	body := bodytest.Chat(2 << 10)
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		b.Run(method, func(b *testing.B) {
			h := provisioned(b, &Handler{Config: core.Config{Zone: "bench-tokens-" + method, Total: 1 << 30}, CostTokens: &llm.TokensCost{LearnOutput: true}})
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
				w.Header().Set("Content-Type", "application/json")
				_, err := w.Write(answer)
				return err
			})
			r, _ := request("198.51.100.7:5555")
			r.Method = method
			reader := bytes.NewReader(body)
			own := io.NopCloser(reader)
			var w discardWriter
			b.SetBytes(int64(len(answer)))
			b.ReportAllocs()
			for b.Loop() {
				reader.Reset(body)
				r.Body, r.ContentLength = own, int64(len(body))
				clear(w.Header())
				if err := h.ServeHTTP(&w, r, next); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
