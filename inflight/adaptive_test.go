package inflight

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
)

// measuredHandler provisions a handler with only an adaptive total, in a
// zone of its own, at limit 8, whose windows close as soon as they hold 4
// responses (a window of 1ns is always long past), with the overload
// statuses of at.
func measuredHandler(t *testing.T, at AdaptiveTotal) *Handler {
	at.Min, at.Max, at.Initial, at.Tolerance, at.Window = 1, 1000, 8, 0.2, caddy.Duration(time.Nanosecond)
	measuredZones++
	zone := fmt.Sprintf("measured-%d", measuredZones)
	return provisioned(t, &Handler{Config: core.Config{Zone: zone}, TotalAdaptive: &at})
}

var measuredZones int

// adaptiveState returns the adaptive total of h's zone, as the admin API
// shows it.
func adaptiveState(t *testing.T, h *Handler) core.AdaptiveState {
	t.Helper()
	for _, z := range core.States() {
		if z.Zone == h.Zone && z.Adaptive != nil {
			return *z.Adaptive
		}
	}
	t.Fatalf("zone %s shows no adaptive total", h.Zone)
	return core.AdaptiveState{}
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

// Overload statuses shrink the limit, written by the upstream or returned
// by the proxy; an application's 500 does not, unless configured.
func TestAdaptiveOverloadSignals(t *testing.T) {
	written := func(code int) caddyhttp.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) error {
			w.WriteHeader(code)
			return nil
		}
	}
	returned := func(code int) caddyhttp.HandlerFunc {
		return func(http.ResponseWriter, *http.Request) error {
			return caddyhttp.Error(code, errors.New("upstream failed"))
		}
	}
	for _, tc := range []struct {
		name     string
		overload []int
		next     caddyhttp.HandlerFunc
		want     int64
	}{
		{"503 written", nil, written(http.StatusServiceUnavailable), 4},
		{"429 written by the upstream", nil, written(http.StatusTooManyRequests), 4},
		{"504 returned (proxy timeout)", nil, returned(http.StatusGatewayTimeout), 4},
		{"502 returned (connection error)", nil, returned(http.StatusBadGateway), 4},
		{"500 written (application error)", nil, written(http.StatusInternalServerError), 8},
		{"500 returned", nil, returned(http.StatusInternalServerError), 8},
		{"plain error returned (500)", nil, func(http.ResponseWriter, *http.Request) error { return errors.New("boom") }, 8},
		{"500 written, overload_status 500", []int{500}, written(http.StatusInternalServerError), 4},
		{"503 written, overload_status 500", []int{500}, written(http.StatusServiceUnavailable), 8},
	} {
		h := measuredHandler(t, AdaptiveTotal{OverloadStatus: tc.overload})
		serveN(h, 4, context.Background(), tc.next)
		if got := adaptiveState(t, h).Limit; got != tc.want {
			t.Errorf("%s: limit %d after a window of them, want %d", tc.name, got, tc.want)
		}
	}
}

// Requests that say nothing about the backend's latency are ignored: a
// window of 3 overload failures among them does not close (it needs 4),
// so the limit stays; had they counted, it would have closed and shrunk.
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
		h := measuredHandler(t, AdaptiveTotal{})
		serveN(h, 3, context.Background(), func(w http.ResponseWriter, _ *http.Request) error {
			w.WriteHeader(http.StatusServiceUnavailable)
			return nil
		})
		serveN(h, 32, tc.ctx, tc.next)
		if got := adaptiveState(t, h).Limit; got != 8 {
			t.Errorf("%s: limit %d, want 8: these requests must not count", name, got)
		}
	}
}

// The latency sample is the time to the response headers: a stream (SSE)
// has given its sample while it still flows.
func TestAdaptiveSamplesAtHeaders(t *testing.T) {
	h := measuredHandler(t, AdaptiveTotal{})
	n := 0
	var sampledWhileStreaming float64
	serveN(h, 32, context.Background(), func(w http.ResponseWriter, _ *http.Request) error {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		if n++; n == 32 {
			sampledWhileStreaming = adaptiveState(t, h).SampleSeconds
		}
		_, err := w.Write([]byte("data: x\n\n"))
		return err
	})
	if sampledWhileStreaming == 0 {
		t.Error("no latency sample while the 32nd stream was open, want one taken at its headers")
	}
}

// A bad overload status in JSON is refused with what is allowed.
func TestAdaptiveOverloadStatusChecked(t *testing.T) {
	for raw, want := range map[string]string{
		`{"overload_status": [503, 200]}`: "total adaptive: overload_status 200 is not allowed: want status codes 400-599",
		`{"overload_status": [600]}`:      "total adaptive: overload_status 600 is not allowed",
		`{"overload_status": [500, 503]}`: "",
	} {
		var at AdaptiveTotal
		if err := json.Unmarshal([]byte(raw), &at); err != nil {
			t.Fatal(err)
		}
		err := at.Check()
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: Check() = %v, want %q", raw, err, want)
		}
	}
}
