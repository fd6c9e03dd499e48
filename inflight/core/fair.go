package core

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// compileFair resolves `fair` to its limit and the per-key options of the
// queue. A bad name is a configuration error.
func (h *Handler) compileFair() error {
	if h.MaxWaitingPerKey < 0 {
		return fmt.Errorf("max_waiting_per_key %d is not allowed: want a positive integer (0 for none)", h.MaxWaitingPerKey)
	}
	h.waitOpt.MaxWaitingPerKey = h.MaxWaitingPerKey
	if h.Fair == "" {
		return nil
	}
	d := slices.IndexFunc(h.Limits, func(l Limit) bool { return l.Name == h.Fair })
	if d < 0 {
		return fmt.Errorf("fair %q is not allowed: want the name of one of this handler's limits %q", h.Fair, names(h.Limits))
	}
	h.waitOpt.Fair, h.waitOpt.KeyDim = true, d
	if h.Weight == "" {
		return nil
	}
	if !strings.Contains(h.Weight, "{") {
		if w, err := strconv.ParseFloat(h.Weight, 64); err != nil || !(w >= limiter.MinWeight && w <= limiter.MaxWeight) {
			return fmt.Errorf("weight %q is not allowed: want a number from %v to %v, or a placeholder such as {tenant_weight}", h.Weight, limiter.MinWeight, limiter.MaxWeight)
		}
	}
	h.weight = compileTemplate(h.Weight)
	return nil
}

// resolveWeight evaluates the weight placeholder: a positive number
// within limiter.MinWeight to MaxWeight; one outside counts as the nearest
// bound, anything else as 1, each logged once per distinct value.
func (h *Handler) resolveWeight(r *http.Request) float64 {
	return h.parseWeight(h.weight(r))
}

// parseWeight reads a weight placeholder's value, as resolveWeight.
func (h *Handler) parseWeight(v string) float64 {
	w, err := strconv.ParseFloat(v, 64)
	if errors.Is(err, strconv.ErrRange) { // ±Inf: out of range, not invalid
		err = nil
	}
	if err != nil || !(w > 0) {
		h.logBadValue("weight", v, func(seen string) {
			h.logger.Warn("weight placeholder did not resolve to a positive number; counting 1",
				zap.String("weight", h.Weight), zap.String("value", seen))
		})
		return 1
	}
	if c := min(max(w, limiter.MinWeight), limiter.MaxWeight); c != w {
		h.logBadValue("weight", v, func(seen string) {
			h.logger.Warn("weight placeholder resolved to a number out of range; counting the nearest bound",
				zap.String("weight", h.Weight), zap.String("value", seen), zap.Float64("counted", c),
				zap.Float64("min", limiter.MinWeight), zap.Float64("max", limiter.MaxWeight))
		})
		return c
	}
	return w
}
