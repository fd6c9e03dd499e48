// Command caddy is Caddy with caddy-l4 and the inflight modules, HTTP and
// layer4, linked in: what the layer4 tests run (go build ./caddy), and
// what `xcaddy build --with github.com/mholt/caddy-l4@v0.1.2 --with
// github.com/caddy-inflight/caddy-inflight/layer4` gives.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/mholt/caddy-l4"

	_ "github.com/caddy-inflight/caddy-inflight"
	_ "github.com/caddy-inflight/caddy-inflight/layer4"
)

func main() {
	caddycmd.Main()
}
