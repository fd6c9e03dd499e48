package core

import (
	"embed"
	"net/http"
)

// The names of the live page's files, served beside each other so that the
// page finds them, and the state, by relative URLs wherever it is mounted:
// by the admin API and by the HTTP handler inflight_ui.
const (
	PageFile   = "ui"
	ScriptFile = "ui.js"
	StyleFile  = "ui.css"
	StateFile  = "state"
)

//go:embed ui/index.html ui/ui.js ui/ui.css
var uiFiles embed.FS

// uiCSP lets the page load only its own script and style and fetch only
// from its own origin: no inline code, no other host.
const uiCSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// ServePageFile writes one of the page's files (name: ui, ui.js, ui.css).
func ServePageFile(w http.ResponseWriter, name string) {
	file, ctype := "ui/index.html", "text/html; charset=utf-8"
	switch name {
	case ScriptFile:
		file, ctype = "ui/ui.js", "text/javascript; charset=utf-8"
	case StyleFile:
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
