// Package caddyinflight registers the inflight handler and its Caddyfile
// directive, so that `xcaddy build --with github.com/caddy-inflight/caddy-inflight`
// gives a Caddy that has both.
package caddyinflight

import (
	_ "github.com/caddy-inflight/caddy-inflight/caddyfile"
	_ "github.com/caddy-inflight/caddy-inflight/inflight"
)
