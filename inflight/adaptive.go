package inflight

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// AdaptiveTotal makes the zone-wide total find the backend's capacity by
// itself, from the time each admitted request takes to get its response
// headers (time to first byte): the limit comes down when the backend
// starts queueing (its answers slow down beyond a baseline learned from
// its fastest windows, or it answers with an overload status: a timeout,
// a connection error, 429, 502, 503, 504) and goes up while it does not.
// Streams (SSE) count by their headers only; other 5xx (an application's
// errors), upgraded connections (WebSocket) and requests the client
// cancelled are ignored.
type AdaptiveTotal struct {
	// Min is the lowest the limit goes. Default: 1.
	Min int `json:"min,omitempty"`

	// Max is the highest the limit goes. Default: 1000.
	Max int `json:"max,omitempty"`

	// Initial is the limit of a zone that has learned nothing yet; it then
	// doubles every window while the backend shows no queue. Give a value
	// at or below the backend's capacity: the baseline is learned from the
	// first windows. Default: 4 (within min and max).
	Initial int `json:"initial,omitempty"`

	// Tolerance is how much slower than its baseline the backend may answer
	// (the median of a window) before the limit comes down, as a fraction:
	// 0.2 is 20 %. Default: 0.2.
	Tolerance float64 `json:"tolerance,omitempty"`

	// Window is the shortest time between two changes of the limit; a
	// window also waits for 32 responses, or, after 4 × window, for 4.
	// Default: 250ms.
	Window caddy.Duration `json:"window,omitempty"`

	// OverloadStatus are the statuses that mean the backend is
	// overloaded: a response with one, written by the upstream or returned
	// by the proxy (502 for a connection error, 504 for a timeout, 503
	// with no upstream available), shrinks the limit. Another 5xx is an
	// application's error and is ignored; another status is a latency
	// sample. Each 400-599. Default: 429, 502, 503, 504.
	OverloadStatus []int `json:"overload_status,omitempty"`
}

func (at *AdaptiveTotal) setDefaults() {
	if at.Min == 0 {
		at.Min = 1
	}
	if at.Max == 0 {
		at.Max = 1000
	}
	if at.Initial == 0 {
		at.Initial = min(max(4, at.Min), at.Max)
	}
	if at.Tolerance == 0 {
		at.Tolerance = 0.2
	}
	if at.Window == 0 {
		at.Window = caddy.Duration(250 * time.Millisecond)
	}
}

// Check reports the first value that is not allowed, defaults applied.
func (at AdaptiveTotal) Check() error {
	at.setDefaults()
	switch {
	case at.Min < 0:
		return fmt.Errorf("total adaptive: min %d is not allowed: want a positive integer", at.Min)
	case at.Max < at.Min || at.Max > limiter.MaxCost:
		return fmt.Errorf("total adaptive: max %d is not allowed: want an integer from min (%d) to %d (2^40-1)", at.Max, at.Min, int64(limiter.MaxCost))
	case at.Initial < at.Min || at.Initial > at.Max:
		return fmt.Errorf("total adaptive: initial %d is not allowed: want an integer from min (%d) to max (%d)", at.Initial, at.Min, at.Max)
	case at.Tolerance < 0 || at.Tolerance > 10:
		return fmt.Errorf("total adaptive: tolerance %g is not allowed: want a fraction such as 0.2 (20 %%), above 0 and at most 10", at.Tolerance)
	case at.Window < 0:
		return fmt.Errorf("total adaptive: window %s is not allowed: want a positive duration such as 250ms", time.Duration(at.Window))
	}
	for _, code := range at.OverloadStatus {
		if code < 400 || code > 599 {
			return fmt.Errorf("total adaptive: overload_status %d is not allowed: want status codes 400-599, such as 429 502 503 504", code)
		}
	}
	return nil
}

func (at *AdaptiveTotal) config() limiter.AdaptiveConfig {
	return limiter.AdaptiveConfig{
		Min: int64(at.Min), Max: int64(at.Max), Initial: int64(at.Initial),
		Tolerance: at.Tolerance, Window: time.Duration(at.Window), Overload: at.OverloadStatus,
	}
}

// checkAdaptive sets the adaptive total's defaults and checks it, and its
// combination with the rest of the handler.
func (h *Handler) checkAdaptive() error {
	at := h.TotalAdaptive
	if at == nil {
		return nil
	}
	switch {
	case h.Total != 0:
		return fmt.Errorf("total %d and total_adaptive are both given: give one", h.Total)
	case h.StoreRaw != nil:
		return ErrAdaptiveWithStore
	}
	at.setDefaults()
	return at.Check()
}

// adaptiveState is a zone's adaptive controller, made by the first handler
// that wants one and kept across reloads with what it learned.
type adaptiveState struct {
	mu    sync.Mutex
	a     *limiter.Adaptive
	users int // handlers using it; a reload overlaps the old and the new
}

// adaptive returns the zone's controller with cfg applied, for one more
// handler.
func (s *adaptiveState) adaptive(cfg limiter.AdaptiveConfig) *limiter.Adaptive {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users++
	if s.a == nil {
		s.a = limiter.NewAdaptive(cfg, time.Now())
	} else {
		s.a.Configure(cfg)
	}
	return s.a
}

// leave drops a handler's use of the controller.
func (s *adaptiveState) leave() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users--
}

// current returns the zone's controller, nil if no handler uses one (a
// reload replaced total adaptive with a fixed total: its gauges go).
func (s *adaptiveState) current() *limiter.Adaptive {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.users == 0 {
		return nil
	}
	return s.a
}

// joinAdaptive binds the handler to its zone's controller; in dry_run the
// controller learns and is exported but the zone does not enforce it.
func (h *Handler) joinAdaptive() {
	if h.TotalAdaptive == nil {
		return
	}
	h.adaptive = h.zone.adaptive.adaptive(h.TotalAdaptive.config())
	if !h.DryRun {
		h.limits.Adaptive = h.adaptive
	}
}

// serveMeasured runs the rest of the chain through a writer that reports
// the response's time to first byte, or its failure, to the controller.
func (h *Handler) serveMeasured(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, m *measuredWriter) error {
	*m = measuredWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, h: h, admitted: time.Now()}
	if r.Method == http.MethodConnect {
		m.done = true // an extended CONNECT tunnel (WebSocket over HTTP/2)
	}
	err := next.ServeHTTP(m, r)
	if err != nil && !m.done && r.Context().Err() == nil {
		status := http.StatusInternalServerError // what Caddy answers an error without one
		if he, ok := errors.AsType[caddyhttp.HandlerError](err); ok && he.StatusCode != 0 {
			status = he.StatusCode
		}
		m.h.adaptive.Fail(time.Now(), status, m.h.zone.Held(limiter.TotalDim))
	}
	m.ResponseWriter = nil
	return err
}

// measuredWriter sees the response headers go out.
type measuredWriter struct {
	caddyhttp.ResponseWriterWrapper
	h        *Handler
	admitted time.Time
	done     bool // reported, or not to be
}

func (m *measuredWriter) WriteHeader(code int) {
	if !m.done && (code >= 200 || code == http.StatusSwitchingProtocols) {
		m.answered(code)
	}
	m.ResponseWriter.WriteHeader(code)
}

func (m *measuredWriter) Write(b []byte) (int, error) {
	if !m.done {
		m.answered(http.StatusOK)
	}
	return m.ResponseWriter.Write(b)
}

func (m *measuredWriter) ReadFrom(r io.Reader) (int64, error) {
	if !m.done {
		m.answered(http.StatusOK)
	}
	return m.ResponseWriterWrapper.ReadFrom(r)
}

func (m *measuredWriter) Flush() {
	if !m.done {
		m.answered(http.StatusOK)
	}
	_ = http.NewResponseController(m.ResponseWriter).Flush()
}

// answered reports the response headers to the controller, which tells a
// latency sample from an overload or an application's error; an upgrade
// is none of them.
func (m *measuredWriter) answered(code int) {
	m.done = true
	if code != http.StatusSwitchingProtocols && m.h.adaptive.Observe(time.Now(), m.admitted, code, m.h.zone.Held(limiter.TotalDim)) {
		m.h.zone.Kick()
	}
}

var (
	adaptiveLimitDesc = prometheus.NewDesc("caddy_inflight_adaptive_limit",
		"The adaptive total's current limit, by zone (the first zone of a name that has one).",
		[]string{"zone"}, nil)
	adaptiveBaselineDesc = prometheus.NewDesc("caddy_inflight_adaptive_baseline_seconds",
		"The adaptive total's baseline: the backend's time to first byte without a queue, as learned, by zone.",
		[]string{"zone"}, nil)
	adaptiveSampleDesc = prometheus.NewDesc("caddy_inflight_adaptive_sample_seconds",
		"The adaptive total's latest sample: the median time to first byte of its last window, by zone.",
		[]string{"zone"}, nil)
	adaptiveDescs = []*prometheus.Desc{adaptiveLimitDesc, adaptiveBaselineDesc, adaptiveSampleDesc}
)

func collectAdaptive(ch chan<- prometheus.Metric, label string, a *limiter.Adaptive) {
	ch <- prometheus.MustNewConstMetric(adaptiveLimitDesc, prometheus.GaugeValue, float64(a.Limit()), label)
	ch <- prometheus.MustNewConstMetric(adaptiveBaselineDesc, prometheus.GaugeValue, a.Baseline().Seconds(), label)
	ch <- prometheus.MustNewConstMetric(adaptiveSampleDesc, prometheus.GaugeValue, a.Sample().Seconds(), label)
}
