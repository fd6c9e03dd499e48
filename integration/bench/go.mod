module github.com/caddy-inflight/caddy-inflight/integration/bench

go 1.26.0

require (
	github.com/caddy-inflight/caddy-inflight v0.0.0
	github.com/vulcand/oxy/v2 v2.0.0
)

replace github.com/caddy-inflight/caddy-inflight => ../..
