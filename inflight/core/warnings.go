package core

import "go.uber.org/zap"

// Notice is a setting that is allowed but likely a mistake: it has no
// effect in its configuration, or quietly changes another. The Caddyfile
// warns of it at the setting's line when it is adapted; Provision logs it,
// for JSON configs as well.
type Notice struct {
	// Setting is the option, as the Caddyfile and the JSON name it.
	Setting string
	// Effect is what it does: "has no effect", or what it changes.
	Effect string
	// Why says why, and what to do.
	Why string
}

// Log logs the notice as a warning.
func (n Notice) Log(logger *zap.Logger) {
	logger.Warn("setting "+n.Effect, zap.String("setting", n.Setting), zap.String("why", n.Why))
}

// String reads as an adapter warning.
func (n Notice) String() string { return "inflight: " + n.Setting + " " + n.Effect + ": " + n.Why }

// NoEffect is the Effect of a setting that does nothing.
const NoEffect = "has no effect"

// Notices returns the settings that are valid but do nothing in this
// configuration, so an operator is not misled by them.
func (c *Config) Notices() []Notice {
	var out []Notice
	warn := func(setting, why string) { out = append(out, Notice{setting, NoEffect, why}) }
	if c.Wait == 0 && c.MaxWaiting != 0 {
		warn("max_waiting", "units never wait without wait")
	}
	if c.Wait == 0 && c.Priority != "" {
		warn("priority", "units never wait without wait")
	}
	if c.Wait == 0 && c.Fair != "" {
		warn("fair", "units never wait without wait")
	}
	if c.Wait == 0 && c.MaxWaitingPerKey != 0 {
		warn("max_waiting_per_key", "units never wait without wait")
	}
	if c.Weight != "" && c.Fair == "" {
		warn("weight", "weights are shares under fair, and fair is not set")
	}
	if c.DryRun && c.Wait != 0 {
		warn("wait", "dry_run never holds a unit back")
	}
	if c.MaxKeys != 0 && len(c.Limits) == 0 {
		warn("max_keys", "there is no keyed limit, only total")
	}
	if c.PlainKeys && !c.PerKeyMetrics {
		warn("plain_keys", "per_key_metrics is off; the admin API shows anonymous keys")
	}
	return out
}
