package caddyfile

import (
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/caddy-inflight/caddy-inflight/inflight"
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// parseCost reads `cost <n|placeholder>` or `cost tokens [{ ... }]`.
func parseCost(h httpcaddyfile.Helper, hd *inflight.Handler) error {
	v, err := oneArg(h.Dispenser, "cost", "a positive integer, a placeholder such as {http.request.header.X-Cost}, or tokens")
	if err != nil {
		return err
	}
	if v == "tokens" {
		return parseTokens(h, hd)
	}
	if !strings.Contains(v, "{") {
		if n, err := strconv.ParseInt(v, 10, 64); err != nil || n <= 0 || n > limiter.MaxCost {
			return h.Errf("inflight: cost %q is not allowed: want a positive integer up to %d, a placeholder such as {http.request.header.X-Cost}, or tokens", v, int64(limiter.MaxCost))
		}
	}
	hd.Cost = v
	return nil
}

// parseTokens reads the block of `cost tokens`:
//
//	cost tokens {
//		bytes_per_token <n>     # 4
//		default_output  <n>     # 1024
//		max_body        <size>  # 1MiB
//	}
func parseTokens(h httpcaddyfile.Helper, hd *inflight.Handler) error {
	t := &inflight.TokensCost{}
	for nesting := h.Nesting(); h.NextBlock(nesting); {
		opt := h.Val()
		var err error
		switch opt {
		case "bytes_per_token":
			var n int
			n, err = positiveInt(h.Dispenser, "cost tokens: "+opt)
			t.BytesPerToken = int64(n)
		case "default_output":
			var n int
			n, err = positiveInt(h.Dispenser, "cost tokens: "+opt)
			t.DefaultOutput = int64(n)
		case "max_body":
			var n int
			n, err = byteSize(h, "cost tokens: "+opt)
			t.MaxBody = int64(n)
		default:
			return h.Errf("inflight: cost tokens: unknown option %q: want bytes_per_token, default_output or max_body", opt)
		}
		if err != nil {
			return err
		}
		if err := t.Check(); err != nil { // at the option's line
			return h.Errf("%v", err)
		}
	}
	hd.CostTokens = t
	return nil
}
