module github.com/caddy-inflight/caddy-inflight

go 1.26.0
