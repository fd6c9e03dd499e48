package inflight

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// measuredHandler is a handler with only what serveMeasured uses: a zone
// with a total and its controller, at limit 8, whose windows close as soon
// as they hold 32 responses.
func measuredHandler() *Handler {
	a := limiter.NewAdaptive(limiter.AdaptiveConfig{Min: 1, Max: 1000, Initial: 8, Tolerance: 0.2, Window: time.Nanosecond}, time.Now())
	return &Handler{zone: &zone{Zone: limiter.NewZone(0, true, nil)}, adaptive: a}
}

// serveN serves n requests through serveMeasured with next, and returns the
// error of the last.
func serveN(h *Handler, n int, ctx context.Context, next caddyhttp.HandlerFunc) error {
	var err error
	for range n {
		r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil).WithContext(ctx)
		err = h.serveMeasured(hijackable{httptest.NewRecorder()}, r, next, new(measuredWriter))
	}
	return err
}

type hijackable struct{ *httptest.ResponseRecorder }

func (hijackable) Hijack() (net.Conn, *bufio.ReadWriter, error) { return nil, nil, nil }

func TestAdaptiveFailuresAreDrops(t *testing.T) {
	for name, next := range map[string]caddyhttp.HandlerFunc{
		"503 written": func(w http.ResponseWriter, _ *http.Request) error {
			w.WriteHeader(http.StatusServiceUnavailable)
			return nil
		},
		"504 returned (proxy timeout)": func(http.ResponseWriter, *http.Request) error {
			return caddyhttp.Error(http.StatusGatewayTimeout, errors.New("upstream timed out"))
		},
	} {
		h := measuredHandler()
		serveN(h, 32, context.Background(), next)
		if got := h.adaptive.Limit(); got != 4 {
			t.Errorf("%s: limit %d after a window of failures, want 8 halved to 4", name, got)
		}
	}
}

// Requests that say nothing about the backend's latency are ignored: a
// window of 16 failures among them does not close (it needs 32), so the
// limit stays; had they counted, it would have closed and shrunk.
func TestAdaptiveIgnores(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for name, tc := range map[string]struct {
		ctx  context.Context
		next caddyhttp.HandlerFunc
	}{
		"client cancelled": {cancelled, func(http.ResponseWriter, *http.Request) error {
			return caddyhttp.Error(http.StatusBadGateway, context.Canceled)
		}},
		"upgraded (101)": {context.Background(), func(w http.ResponseWriter, _ *http.Request) error {
			w.WriteHeader(http.StatusSwitchingProtocols)
			return nil
		}},
		"hijacked": {context.Background(), func(w http.ResponseWriter, _ *http.Request) error {
			_, _, err := http.NewResponseController(w).Hijack()
			return err
		}},
		"client error returned": {context.Background(), func(http.ResponseWriter, *http.Request) error {
			return caddyhttp.Error(http.StatusNotFound, errors.New("no such file"))
		}},
	} {
		h := measuredHandler()
		serveN(h, 16, context.Background(), func(w http.ResponseWriter, _ *http.Request) error {
			w.WriteHeader(http.StatusInternalServerError)
			return nil
		})
		serveN(h, 32, tc.ctx, tc.next)
		if got := h.adaptive.Limit(); got != 8 {
			t.Errorf("%s: limit %d, want 8: these requests must not count", name, got)
		}
	}
}

// The latency sample is the time to the response headers: a stream (SSE)
// has given its sample while it still flows.
func TestAdaptiveSamplesAtHeaders(t *testing.T) {
	h := measuredHandler()
	n := 0
	var sampledWhileStreaming time.Duration
	serveN(h, 32, context.Background(), func(w http.ResponseWriter, _ *http.Request) error {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		if n++; n == 32 {
			sampledWhileStreaming = h.adaptive.Sample()
		}
		_, err := w.Write([]byte("data: x\n\n"))
		return err
	})
	if sampledWhileStreaming == 0 {
		t.Error("no latency sample while the 32nd stream was open, want one taken at its headers")
	}
}
