package layer4

import (
	"reflect"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/mholt/caddy-l4/layer4"
)

// siteOf names where an unnamed handler stands, for its zone's automatic
// name (`layer4 :5432#1`, numbered among the unnamed handlers there): the
// listen addresses of its layer4 server, or of the HTTP server whose
// listener wrapper it is in. The layer4 app provisions its servers in map
// order, so a count across servers would not name a handler the same way
// on every load.
func siteOf(ctx caddy.Context) string {
	if srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok {
		return "layer4 " + strings.Join(srv.Listen, ",")
	}
	for _, m := range ctx.Modules() {
		if app, ok := m.(*layer4.App); ok {
			if s := provisioning(app); s != nil {
				return "layer4 " + strings.Join(s.Listen, ",")
			}
		}
	}
	return "layer4"
}

// provisioning returns the server of app whose routes are being
// provisioned: it has parsed its listen addresses but not yet compiled
// its routes (caddy-l4 v0.1.2, Server.Provision; unexported fields, read
// only). TestCapClosesExcess fails if that changes.
func provisioning(app *layer4.App) *layer4.Server {
	for _, s := range app.Servers {
		v := reflect.ValueOf(s).Elem()
		addrs, route := v.FieldByName("listenAddrs"), v.FieldByName("compiledRoute")
		if !addrs.IsValid() || !route.IsValid() {
			return nil
		}
		if addrs.Len() > 0 && route.IsNil() {
			return s
		}
	}
	return nil
}
