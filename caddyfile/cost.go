package caddyfile

import (
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/caddy-inflight/caddy-inflight/inflight"
	"github.com/caddy-inflight/caddy-inflight/inflight/llm"
)

// parseCost reads `cost <n|placeholder>` or `cost tokens [{ ... }]`.
func parseCost(h httpcaddyfile.Helper, hd *inflight.Handler) error {
	v, err := read.OneArg(h.Dispenser, "cost", "a positive integer, a placeholder such as {http.request.header.X-Cost}, or tokens")
	if err != nil {
		return err
	}
	if v == "tokens" {
		return parseTokens(h, hd)
	}
	if err := inflight.CheckCost(v); err != nil {
		return h.Errf("inflight: %v, or tokens", err)
	}
	if probe := *h.Dispenser; probe.NextBlock(probe.Nesting()) {
		return h.Errf("inflight: cost %s takes no block { }: a block of options goes only with cost tokens { … }", inflight.ShortForm(v))
	}
	hd.Cost = v
	return nil
}

// parseTokens reads the block of `cost tokens`:
//
//	cost tokens {
//		bytes_per_token <n>                 # 4
//		default_output  <n>|auto [<n>]      # 1024; auto: learned, at most <n> (1024)
//		max_body        <size>              # 1MiB
//		include_usage                       # ask OpenAI streams for their usage
//	}
func parseTokens(h httpcaddyfile.Helper, hd *inflight.Handler) error {
	t := &llm.TokensCost{}
	for nesting := h.Nesting(); h.NextBlock(nesting); {
		opt := h.Val()
		var err error
		switch opt {
		case "bytes_per_token":
			var n int
			n, err = read.PositiveInt(h.Dispenser, "cost tokens: "+opt)
			t.BytesPerToken = int64(n)
		case "default_output":
			t.DefaultOutput, t.LearnOutput, err = parseDefaultOutput(h)
		case "max_body":
			var n int
			n, err = byteSize(h, "cost tokens: "+opt)
			t.MaxBody = int64(n)
		case "include_usage":
			if h.NextArg() {
				return h.Errf("inflight: cost tokens: include_usage takes no arguments, got %q: write include_usage alone to turn it on, or leave it out", h.Val())
			}
			t.IncludeUsage = true
		default:
			return h.Errf("inflight: cost tokens: unknown option %q: want bytes_per_token, default_output, max_body or include_usage", opt)
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

// parseDefaultOutput reads `default_output <n>` or `default_output auto
// [<ceiling>]`.
func parseDefaultOutput(h httpcaddyfile.Helper) (n int64, learn bool, err error) {
	const allowed = "a positive integer, or auto with an optional ceiling (default_output auto 2048)"
	all := h.RemainingArgs()
	args := all
	learn = len(args) > 0 && args[0] == "auto"
	if learn {
		args = args[1:]
	}
	switch {
	case len(args) == 0 && learn:
		return 0, true, nil
	case len(args) != 1:
		return 0, false, h.Errf("inflight: cost tokens: default_output %q is not allowed: want %s", strings.Join(all, " "), allowed)
	}
	v, perr := strconv.ParseInt(args[0], 10, 64)
	if perr != nil || v <= 0 {
		return 0, false, h.Errf("inflight: cost tokens: default_output %q is not allowed: want %s", args[0], allowed)
	}
	return v, learn, nil
}
