package caddyfile

import (
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/caddy-inflight/caddy-inflight/inflight"
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// parseCost reads `cost <n|placeholder>`.
func parseCost(h httpcaddyfile.Helper, hd *inflight.Handler) error {
	v, err := oneArg(h, "cost", "a positive integer, a placeholder such as {http.request.header.X-Cost}, or tokens")
	if err != nil {
		return err
	}
	if !strings.Contains(v, "{") {
		if n, err := strconv.ParseInt(v, 10, 64); err != nil || n <= 0 || n > limiter.MaxCost {
			return h.Errf("inflight: cost %q is not allowed: want a positive integer up to %d, a placeholder such as {http.request.header.X-Cost}, or tokens", v, int64(limiter.MaxCost))
		}
	}
	hd.Cost = v
	return nil
}
