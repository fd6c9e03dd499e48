// Command caddy is Caddy with the inflight module linked in, so that a
// checkout runs without xcaddy:
//
//	go run ./examples/caddy run --config examples/Caddyfile
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddy-inflight/caddy-inflight"
)

func main() {
	caddycmd.Main()
}
