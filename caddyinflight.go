// Package caddyinflight registers the inflight handler, its Caddyfile
// directive and its stores, so that `xcaddy build --with github.com/caddy-inflight/caddy-inflight`
// gives a Caddy that has them all.
package caddyinflight

import (
	_ "github.com/caddy-inflight/caddy-inflight/caddyfile"
	_ "github.com/caddy-inflight/caddy-inflight/inflight"
	_ "github.com/caddy-inflight/caddy-inflight/inflight/redisstore"
)
