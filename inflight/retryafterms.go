package inflight

import (
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// retryAfterMsField is the header the OpenAI and Anthropic SDKs read
// before Retry-After: milliseconds to wait before retrying.
const retryAfterMsField = "Retry-After-Ms"

// compileRetryAfterMs reads RetryAfterMs: "" (none), "auto", or a
// positive duration up to retry_after.
func (h *Handler) compileRetryAfterMs() error {
	h.retryMs, h.retryAuto = "", false
	switch v := h.RetryAfterMs; v {
	case "":
	case "auto":
		h.retryAuto = true
	default:
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > time.Duration(h.RetryAfter) {
			return fmt.Errorf("retry_after_ms %q is not allowed: want auto or a positive duration up to retry_after (%s)", v, time.Duration(h.RetryAfter))
		}
		h.retryMs = strconv.FormatInt(max(d.Milliseconds(), 1), 10)
	}
	return nil
}

// retryMillis returns, in milliseconds, when a refused request should
// come back: retry_after_ms's value or hint (and true), else retry_after.
func (h *Handler) retryMillis() (string, bool) {
	switch {
	case h.retryMs != "":
		return h.retryMs, true
	case h.retryAuto:
		if d, ok := h.gate.RetryHint(time.Duration(h.RetryAfter)); ok {
			return strconv.FormatInt(max(d.Milliseconds(), 1), 10), true
		}
	}
	return strconv.FormatInt(time.Duration(h.RetryAfter).Milliseconds(), 10), false
}

// setRetryAfterMs sets a refusal's retry-after-ms, if retry_after_ms gives
// one (an auto hint: once the zone has a rate to go by).
func (h *Handler) setRetryAfterMs(w http.ResponseWriter) {
	if ms, ok := h.retryMillis(); ok {
		w.Header().Set(retryAfterMsField, ms)
	}
}
