package inflight

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
	"github.com/caddy-inflight/caddy-inflight/inflight/llm"
)

// compileCost checks a fixed cost and compiles a placeholder one, or
// checks cost tokens; h.cost stays nil when every request costs 1 or with
// cost tokens.
func (h *Handler) compileCost() error {
	if h.Cost != "" && h.CostTokens != nil {
		return fmt.Errorf("cost %q and cost tokens are not allowed together: want one of them", h.Cost)
	}
	if t := h.CostTokens; t != nil {
		t.SetDefaults()
		if err := t.Check(); err != nil {
			return err
		}
		return nil
	}
	if h.Cost == "" {
		return nil
	}
	if !strings.Contains(h.Cost, "{") {
		n, err := fixedCost(h.Cost)
		if err != nil {
			return err
		}
		h.cost = func(*http.Request) (int64, error) { return n, nil }
		return nil
	}
	eval := compileTemplate(h.Cost)
	h.cost = func(r *http.Request) (int64, error) { return h.parseCost(eval(r)) }
	return nil
}

// CheckCost refuses a cost that is neither a placeholder nor a positive
// integer up to limiter.MaxCost.
func CheckCost(v string) error {
	if strings.Contains(v, "{") {
		return nil
	}
	_, err := fixedCost(v)
	return err
}

// fixedCost reads a cost without placeholders.
func fixedCost(v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 || n > limiter.MaxCost {
		return 0, fmt.Errorf("cost %q is not allowed: want a positive integer up to %d, or a placeholder such as {http.request.header.X-Cost}", v, int64(limiter.MaxCost))
	}
	return n, nil
}

// parseCost reads a placeholder cost. A value that is not a positive
// integer is a configuration error on the operator's side, as a bad max
// is: 500, logged once per distinct value. One above limiter.MaxCost counts
// as MaxCost (the engine clamps it to the caps anyway).
func (h *Handler) parseCost(v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil && strings.Trim(v, "0123456789") == "" && v != "" {
		n, err = limiter.MaxCost, nil // out of int64's range: a huge cost
	}
	if err == nil && n > 0 {
		return limiter.ClampCost(n), nil
	}
	seen := h.badValues.Log("cost", v, func(seen string) {
		h.logger.Error("cost placeholder did not resolve to a positive integer; answering 500",
			zap.String("cost", h.Cost), zap.String("value", seen))
	})
	return 0, caddyhttp.Error(http.StatusInternalServerError,
		fmt.Errorf("inflight: cost %s resolved to a value that is not a positive integer (%s)", h.Cost, seen))
}

// costed reports whether requests have costs: units are not requests.
func (h *Handler) costed() bool { return h.cost != nil || h.CostTokens != nil }

// costOf returns r's cost: its estimate in tokens with cost tokens, from
// its body read (kept in a for its end), else h.cost's.
func (h *Handler) costOf(r *http.Request, a *admission, body *llm.Body) (int64, error) {
	if h.CostTokens == nil {
		return h.cost(r)
	}
	a.tokens = h.meter.Estimate(r, body)
	return a.tokens.Cost, nil
}
