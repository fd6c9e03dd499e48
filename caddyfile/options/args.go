package options

import (
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-inflight/caddy-inflight/inflight/core"
	"github.com/caddy-inflight/caddy-inflight/inflight/limiter"
)

// Reader reads the arguments of one option, and refuses them at their line
// with a message that names the option, the value and what is allowed.
type Reader struct {
	// Show writes a placeholder template as the user wrote it, for
	// messages (the HTTP Caddyfile expands its shorthands before a
	// directive sees its tokens); nil: as it is.
	Show func(tmpl string) string
}

// OneArg reads the option's one argument; want says what it may be.
func (r Reader) OneArg(d *caddyfile.Dispenser, opt, want string) (string, error) {
	args := d.RemainingArgs()
	if len(args) != 1 {
		return "", d.Errf("inflight: %s %q: want one argument, %s", opt, r.Shown(args), want)
	}
	return args[0], nil
}

// PositiveInt reads the option's one argument, a positive integer.
func (r Reader) PositiveInt(d *caddyfile.Dispenser, opt string) (int, error) {
	v, err := r.OneArg(d, opt, "a positive integer")
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, d.Errf("inflight: %s %q is not allowed: want a positive integer", opt, v)
	}
	return n, nil
}

// Duration reads a Caddy duration (such as 1s, 1m30s or 1d); zero is
// allowed only where it means "off".
func (r Reader) Duration(d *caddyfile.Dispenser, opt string, zeroOK bool) (time.Duration, error) {
	v, err := r.OneArg(d, opt, "a duration such as 30s")
	if err != nil {
		return 0, err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil || dur < 0 || (dur == 0 && !zeroOK) {
		want := "a positive duration such as 30s"
		if zeroOK {
			want = "a duration such as 30s, or 0"
		}
		return 0, d.Errf("inflight: %s %q is not allowed: want %s", opt, v, want)
	}
	return dur, nil
}

// Shown writes arguments as the user wrote them (see Show).
func (r Reader) Shown(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = r.show(a)
	}
	return out
}

func (r Reader) show(tmpl string) string {
	if r.Show == nil {
		return tmpl
	}
	return r.Show(tmpl)
}

// checked reads one argument and refuses it, at its line, if check does.
func (r Reader) checked(d *caddyfile.Dispenser, opt, want string, check func(string) error) (string, error) {
	v, err := r.OneArg(d, opt, want)
	if err == nil {
		if err = check(v); err != nil {
			err = d.Errf("inflight: %v", err)
		}
	}
	return v, err
}

// capInt reads a fixed cap: an integer within the units' range.
func (r Reader) capInt(d *caddyfile.Dispenser, opt string) (int, error) {
	v, err := r.OneArg(d, opt, core.CapRange)
	if err != nil {
		return 0, err
	}
	n, ok := FixedCap(v)
	if !ok {
		return 0, d.Errf("inflight: %s %q is not allowed: want %s", opt, v, core.CapRange)
	}
	return n, nil
}

// FixedCap reads v as a fixed cap, within core.CapRange.
func FixedCap(v string) (int, bool) {
	n, err := strconv.Atoi(v)
	return n, err == nil && n > 0 && n <= limiter.MaxCost
}
