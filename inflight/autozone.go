package inflight

import (
	"cmp"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// A handler that names no zone gets one of its own, named after where it
// stands: the site (the host matcher of its top-level route, else the
// server's listen addresses) and its position among that site's unnamed
// inflight handlers, as in "api.example.com#2". The same config loaded again
// gives every handler the same name, so its counts carry over a reload, and
// two handlers never share one by chance.
//
// Caddy provisions a server's routes in order, depth first, and drops a
// route's raw handler JSON once all its handlers are loaded; so while a
// handler is being provisioned, the first top-level route that still has its
// raw handlers is the one it belongs to.

// siteOf names the site of the handler being provisioned.
func siteOf(ctx caddy.Context) string {
	srv, _ := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if srv == nil {
		return "inflight"
	}
	listen := strings.Join(srv.Listen, ",")
	if hosts, ok := hostsOfCurrent(srv.Routes); ok {
		return cmp.Or(hosts, listen)
	}
	if srv.Errors != nil {
		if hosts, ok := hostsOfCurrent(srv.Errors.Routes); ok {
			return cmp.Or(hosts, listen) + " errors"
		}
	}
	return listen
}

// hostsOfCurrent returns the hosts matched by the route whose handlers are
// being provisioned, and whether that route is in routes.
func hostsOfCurrent(routes caddyhttp.RouteList) (string, bool) {
	for _, r := range routes {
		if r.HandlersRaw == nil {
			continue
		}
		var hosts []string
		for _, set := range r.MatcherSets {
			for _, m := range set {
				switch h := m.(type) {
				case caddyhttp.MatchHost:
					hosts = append(hosts, h...)
				case *caddyhttp.MatchHost:
					hosts = append(hosts, *h...)
				}
			}
		}
		return strings.Join(hosts, ","), true
	}
	return "", false
}
