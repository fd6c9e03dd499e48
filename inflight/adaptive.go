package inflight

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

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

// ErrAdaptiveWithStore refuses `total adaptive` beside a shared store.
var ErrAdaptiveWithStore = errors.New("total adaptive cannot be used with a shared store (store redis): each instance measures only its own requests' latency, so a fleet-wide adaptive cap is not designed; use a fixed total with the store, or total adaptive without it")

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
		m.h.gate.ObserveFailure(status)
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
	if code != http.StatusSwitchingProtocols {
		m.h.gate.ObserveAnswer(m.admitted, code)
	}
}
