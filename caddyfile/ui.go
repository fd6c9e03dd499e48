package caddyfile

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-inflight/caddy-inflight/inflight"
)

// parseUI reads the inflight_ui directive, which takes no arguments and no
// block (a matcher before it is the wrapper's):
//
//	inflight_ui [<matcher>]
func parseUI(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	h.Next() // the directive's name
	if h.NextArg() {
		return nil, h.Errf("inflight_ui: unexpected argument %q: it takes none (put it in a handle block, or give a matcher such as /inflight/*)", h.Val())
	}
	if h.NextBlock(0) {
		return nil, h.Errf("inflight_ui: unexpected option %q: it takes no block", h.Val())
	}
	return new(inflight.UI), nil
}
