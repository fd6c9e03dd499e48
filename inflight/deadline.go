package inflight

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
)

// A request's deadline bounds its wait (see core.AdmitWithin): the
// grpc-timeout of a gRPC request, and the handler's Deadline placeholder.

// maxGRPCTimeoutDigits is the most digits a grpc-timeout value may have
// (gRPC over HTTP/2: TimeoutValue is at most 8 ASCII digits).
const maxGRPCTimeoutDigits = 8

// parseGRPCTimeout reads a grpc-timeout header value: 1 to 8 digits and a
// unit, H, M, S, m, u or n. A value too long for a time.Duration (over
// 2,562,047 hours) counts as the longest one.
func parseGRPCTimeout(v string) (time.Duration, bool) {
	if len(v) < 2 || len(v) > maxGRPCTimeoutDigits+1 {
		return 0, false
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, false
	}
	var n int64
	for _, c := range []byte(v[:len(v)-1]) {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if n > math.MaxInt64/int64(unit) {
		return time.Duration(math.MaxInt64), true
	}
	return time.Duration(n) * unit, true
}

// parseDeadline reads a deadline: a positive Go duration (300ms, 1.5s) or
// a positive number of seconds (0.3, 30). One too long for a
// time.Duration counts as the longest one.
func parseDeadline(v string) (time.Duration, error) {
	if d, err := time.ParseDuration(v); err == nil {
		if d <= 0 {
			return 0, fmt.Errorf("deadline %q is not allowed: want a positive duration", v)
		}
		return d, nil
	}
	s, err := strconv.ParseFloat(v, 64)
	if errors.Is(err, strconv.ErrRange) { // ±Inf or an underflow to 0
		err = nil
	}
	if err != nil || !(s > 0) {
		return 0, fmt.Errorf("deadline %q is not allowed: want a positive duration (300ms, 1.5s) or a positive number of seconds (0.3)", v)
	}
	if s >= float64(math.MaxInt64)/1e9 {
		return time.Duration(math.MaxInt64), nil
	}
	return time.Duration(s * 1e9), nil
}

// CheckDeadline checks a Deadline option: a placeholder, or else a
// fixed deadline.
func CheckDeadline(v string) error {
	if v == "" || strings.Contains(v, "{") {
		return nil
	}
	if _, err := parseDeadline(v); err != nil {
		return fmt.Errorf("%v, or a placeholder that resolves to one per request, such as {header.X-Request-Timeout}", err)
	}
	return nil
}

// compileDeadline checks the Deadline option and warns when it, or
// early_refusal, does nothing, or when it cuts the wait.
func (h *Handler) compileDeadline() error {
	for _, n := range h.HTTPNotices() {
		n.Log(h.logger)
	}
	return CheckDeadline(h.Deadline)
}

// HTTPNotices returns the settings of the HTTP handler's own that are
// valid but likely a mistake (the shared options' are Config.Notices):
// deadline and early_refusal without wait, and a fixed deadline that cuts
// every wait short.
func (h *Handler) HTTPNotices() []core.Notice {
	const noWait = "requests never wait without wait"
	var out []core.Notice
	wait := time.Duration(h.Wait)
	if wait == 0 && h.Deadline != "" {
		out = append(out, core.Notice{Setting: "deadline", Effect: core.NoEffect, Why: noWait})
	}
	if wait == 0 && h.EarlyRefusal {
		out = append(out, core.Notice{Setting: "early_refusal", Effect: core.NoEffect, Why: noWait})
	}
	if d, err := parseDeadline(h.Deadline); err == nil && wait > 0 && !strings.Contains(h.Deadline, "{") {
		if cut := core.DeadlineWait(wait, d); cut < wait {
			out = append(out, core.Notice{Setting: "deadline", Effect: "cuts the wait",
				Why: fmt.Sprintf("a fixed deadline of %s ends every wait within %s (the deadline less its margin), not wait %s: lower wait instead, or give a placeholder that resolves per request, such as {header.X-Request-Timeout}", d, cut, wait)})
		}
	}
	return out
}

// admit admits r's ticket t through the gate, its wait bounded by its
// deadline if it has one.
func (h *Handler) admit(r *http.Request, t *core.Ticket, class, weight string) core.Verdict {
	if h.waits {
		if left, ok := h.deadlineOf(r); ok {
			return h.gate.AdmitWithin(r.Context(), t, class, weight, left)
		}
	}
	return h.gate.Admit(r.Context(), t, class, weight)
}

// deadlineOf returns the time r's client still waits for an answer, the
// shorter of its grpc-timeout (for a gRPC request) and the Deadline
// placeholder's value, and false when it has neither. A bad value is
// ignored, logged once per value.
func (h *Handler) deadlineOf(r *http.Request) (time.Duration, bool) {
	left, ok := time.Duration(0), false
	if h.deadline != nil {
		if v := h.deadline(r); v != "" {
			d, err := parseDeadline(v)
			if err == nil {
				left, ok = d, true
			} else {
				h.badValues.Log("deadline", v, func(seen string) {
					h.logger.Warn("deadline placeholder did not resolve to a positive duration or number of seconds; ignoring it",
						zap.String("deadline", h.Deadline), zap.String("value", seen))
				})
			}
		}
	}
	if v := r.Header.Get("Grpc-Timeout"); v != "" && grpcContentType(r) != "" {
		d, valid := parseGRPCTimeout(v)
		switch {
		case !valid:
			h.badValues.Log("grpc-timeout", v, func(seen string) {
				h.logger.Debug("malformed grpc-timeout ignored: want 1 to 8 digits and a unit (H, M, S, m, u, n)",
					zap.String("value", seen))
			})
		case !ok || d < left:
			left, ok = d, true
		}
	}
	return left, ok
}
