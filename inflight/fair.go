package inflight

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"

	"go.uber.org/zap"
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
	if h.Weight != "" {
		h.weight = compileTemplate(h.Weight)
	}
	return nil
}

// resolveWeight evaluates the weight placeholder: a positive number, or 1
// for anything else, logged once per distinct value.
func (h *Handler) resolveWeight(r *http.Request) float64 {
	v := h.weight(r)
	if w, err := strconv.ParseFloat(v, 64); err == nil && w > 0 && !math.IsInf(w, 0) {
		return w
	}
	h.logBadValue("weight", v, func(seen string) {
		h.logger.Warn("weight placeholder did not resolve to a positive number; counting 1",
			zap.String("weight", h.Weight), zap.String("value", seen))
	})
	return 1
}
