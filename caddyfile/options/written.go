package options

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"
)

// Written records where each option of a block was written, for the
// checks that need the whole block: their errors and warnings then name
// the option's line, not the block's end.
type Written struct {
	at   map[string]caddyfile.Dispenser
	end  caddyfile.Dispenser
	warn func(caddyconfig.Warning)
}

// mark records that opt is written where d stands, if it was not already.
func (w *Written) mark(d *caddyfile.Dispenser, opt string) {
	if w.at == nil {
		w.at = map[string]caddyfile.Dispenser{}
	}
	if _, ok := w.at[opt]; !ok {
		w.at[opt] = *d
	}
}

// Has reports whether opt is written.
func (w Written) Has(opt string) bool {
	_, ok := w.at[opt]
	return ok
}

// At returns a dispenser on opt's name, or on the block's end if it is not
// written: its Errf names that line.
func (w Written) At(opt string) *caddyfile.Dispenser {
	d, ok := w.at[opt]
	if !ok {
		d = w.end
	}
	return &d
}

// Warn reports, at opt's line, a setting that adapts but is likely a
// mistake.
func (w Written) Warn(opt, msg string) {
	d := w.At(opt)
	w.warn(caddyconfig.Warning{File: d.File(), Line: d.Line(), Message: msg})
}

// logWarning reports a warning of the adapter. httpcaddyfile.Helper
// keeps the adapter's list of warnings to itself (Caddy v2.11 gives a
// directive no way to add one), so the warning is logged as Caddy logs
// that list: at WARN, with the file and line, by `caddy adapt`, `caddy
// run`, `caddy validate` and the admin API's /load, whichever adapts the
// Caddyfile.
func logWarning(w caddyconfig.Warning) {
	caddy.Log().Named("caddyfile").Warn(w.Message, zap.String("file", w.File), zap.Int("line", w.Line))
}
