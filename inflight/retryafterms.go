package inflight

import (
	"cmp"
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
	d, err := h.retryAfterMs()
	h.retryMs, h.retryAuto = "", h.RetryAfterMs == "auto"
	if d > 0 {
		h.retryMs = strconv.FormatInt(max(d.Milliseconds(), 1), 10)
	}
	return err
}

// CheckRetryAfterMs refuses a RetryAfterMs that is neither auto nor a
// positive duration up to retry_after (its default if not set): the SDKs
// that read it read it instead of Retry-After, which it refines.
func (h *Handler) CheckRetryAfterMs() error {
	_, err := h.retryAfterMs()
	return err
}

// retryAfterMs returns RetryAfterMs as a duration: 0 for none or auto.
func (h *Handler) retryAfterMs() (time.Duration, error) {
	v := h.RetryAfterMs
	if v == "" || v == "auto" {
		return 0, nil
	}
	limit := cmp.Or(time.Duration(h.RetryAfter), DefaultRetryAfter)
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 || d > limit {
		return 0, fmt.Errorf("retry_after_ms %q is not allowed: want auto or a positive duration up to retry_after (%s), such as 250ms", v, limit)
	}
	return d, nil
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
