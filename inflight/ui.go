package inflight

import (
	"net/http"
	"path"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
)

func init() {
	caddy.RegisterModule(new(UI))
}

// UI serves the live page of every zone's state, as the admin API does at
// `GET /inflight/ui`, on a site's route, so that it can be put behind the
// site's own authentication (as Caddy's `metrics` handler serves
// `/metrics`). It answers every request it gets: a path ending in `/state`
// with the state as JSON (what `GET /inflight/` answers), `/ui.js` and
// `/ui.css` with the page's files, a path ending in `/` with the page, and
// any other path with a redirect to it with a `/` appended.
//
// The page shows keys as the admin API does: hashed unless the zone's
// handler has `plain_keys`.
type UI struct{}

// CaddyModule returns the Caddy module information.
func (*UI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.inflight_ui",
		New: func() caddy.Module { return new(UI) },
	}
}

// ServeHTTP serves the page, its files or the state; it never calls next.
func (*UI) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return caddyhttp.Error(http.StatusMethodNotAllowed, nil)
	}
	// The path the browser sees, which strip_prefix may have shortened.
	p := r.URL.Path
	if orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok && orig.URL != nil {
		p = orig.URL.Path
	}
	switch name := path.Base(p); {
	case name == core.StateFile:
		return core.ServeState(w)
	case name == core.ScriptFile || name == core.StyleFile:
		core.ServePageFile(w, name)
	case strings.HasSuffix(p, "/"):
		core.ServePageFile(w, core.PageFile)
	default:
		// Relative to the path the browser sees, so it holds behind a
		// stripped prefix too (http.Redirect would resolve it against
		// r.URL.Path).
		w.Header().Set("Location", name+"/")
		w.WriteHeader(http.StatusFound)
	}
	return nil
}

// Interface guard
var _ caddyhttp.MiddlewareHandler = (*UI)(nil)
