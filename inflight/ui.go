package inflight

import (
	"embed"
	"net/http"
	"path"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	caddy.RegisterModule(new(UI))
}

// The live page's files, served beside each other so that the page finds
// them, and the state, by relative URLs wherever it is mounted.
const (
	uiPage   = "ui"
	uiScript = "ui.js"
	uiStyle  = "ui.css"
	uiState  = "state"
)

//go:embed ui/index.html ui/ui.js ui/ui.css
var uiFiles embed.FS

// uiCSP lets the page load only its own script and style and fetch only
// from its own origin: no inline code, no other host.
const uiCSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

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
	case name == uiState:
		return serveState(w)
	case name == uiScript || name == uiStyle:
		serveUIFile(w, name)
	case strings.HasSuffix(p, "/"):
		serveUIFile(w, uiPage)
	default:
		// Relative to the path the browser sees, so it holds behind a
		// stripped prefix too (http.Redirect would resolve it against
		// r.URL.Path).
		w.Header().Set("Location", name+"/")
		w.WriteHeader(http.StatusFound)
	}
	return nil
}

// serveUIFile writes one of the page's files (name: ui, ui.js, ui.css).
func serveUIFile(w http.ResponseWriter, name string) {
	file, ctype := "ui/index.html", "text/html; charset=utf-8"
	switch name {
	case uiScript:
		file, ctype = "ui/ui.js", "text/javascript; charset=utf-8"
	case uiStyle:
		file, ctype = "ui/ui.css", "text/css; charset=utf-8"
	}
	body, err := uiFiles.ReadFile(file)
	if err != nil { // embedded: cannot happen
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", ctype)
	h.Set("Content-Security-Policy", uiCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-cache")
	// Referer must stay: the admin endpoint checks it on browsers' requests.
	h.Set("Referrer-Policy", "same-origin")
	w.Write(body)
}

// Interface guard
var _ caddyhttp.MiddlewareHandler = (*UI)(nil)
