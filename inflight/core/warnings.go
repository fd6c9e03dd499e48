package core

import "go.uber.org/zap"

// warnIneffective logs the settings that are valid but do nothing in this
// configuration, so an operator is not misled by them.
func (h *Config) warnIneffective(logger *zap.Logger) {
	warn := func(setting, why string) {
		logger.Warn("setting has no effect", zap.String("setting", setting), zap.String("why", why))
	}
	if h.Wait == 0 && h.MaxWaiting != 0 {
		warn("max_waiting", "units never wait without wait")
	}
	if h.Wait == 0 && h.Priority != "" {
		warn("priority", "units never wait without wait")
	}
	if h.Wait == 0 && h.Fair != "" {
		warn("fair", "units never wait without wait")
	}
	if h.Wait == 0 && h.MaxWaitingPerKey != 0 {
		warn("max_waiting_per_key", "units never wait without wait")
	}
	if h.Weight != "" && h.Fair == "" {
		warn("weight", "weights are shares under fair, and fair is not set")
	}
	if h.DryRun && h.Wait != 0 {
		warn("wait", "dry_run never holds a unit back")
	}
	if h.MaxKeys != 0 && len(h.Limits) == 0 {
		warn("max_keys", "there is no keyed limit, only total")
	}
	if h.PlainKeys && !h.PerKeyMetrics {
		warn("plain_keys", "per_key_metrics is off; the admin API shows anonymous keys")
	}
}
