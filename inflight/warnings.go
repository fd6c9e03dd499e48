package inflight

import "go.uber.org/zap"

// warnIneffective logs the settings that are valid but do nothing in this
// configuration, so an operator is not misled by them.
func (h *Handler) warnIneffective() {
	warn := func(setting, why string) {
		h.logger.Warn("setting has no effect", zap.String("setting", setting), zap.String("why", why))
	}
	if h.Wait == 0 && h.MaxWaiting != 0 {
		warn("max_waiting", "requests never wait without wait")
	}
	if h.Wait == 0 && h.Priority != "" {
		warn("priority", "requests never wait without wait")
	}
	if h.Wait == 0 && h.Fair != "" {
		warn("fair", "requests never wait without wait")
	}
	if h.Wait == 0 && h.MaxWaitingPerKey != 0 {
		warn("max_waiting_per_key", "requests never wait without wait")
	}
	if h.Weight != "" && h.Fair == "" {
		warn("weight", "weights are shares under fair, and fair is not set")
	}
	if h.DryRun && h.Wait != 0 {
		warn("wait", "dry_run never holds a request back")
	}
	if h.MaxKeys != 0 && len(h.Limits) == 0 {
		warn("max_keys", "there is no keyed limit, only total")
	}
	// StoreRaw is cleared once the store is loaded; compileLimitHeaders
	// drops the levels when there is one.
	if len(h.LimitHeaders) > 0 && h.levels == nil {
		warn("limit_headers", "it is ignored with a store: no RateLimit fields are sent (this instance's counts are not the fleet's)")
	}
	if h.PlainKeys && !h.PerKeyMetrics {
		warn("plain_keys", "per_key_metrics is off; the admin API shows anonymous keys")
	}
}
