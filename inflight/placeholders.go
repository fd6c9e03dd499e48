package inflight

import (
	"net/http"
	"net/textproto"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// DefaultKey is the key of a limit that names none: the client's IP address
// as Caddy determined it, honouring the server's trusted_proxies.
const DefaultKey = "{http.vars.client_ip}"

// shorthands are the long forms of the Caddyfile's placeholder shorthands
// that keys use most, so messages can show a key as the user wrote it.
var shorthands = strings.NewReplacer(
	"{http.vars.client_ip}", "{client_ip}",
	"{http.request.remote.host}", "{remote_host}",
	"{http.request.header.", "{header.",
	"{http.request.cookie.", "{cookie.",
	"{http.request.uri.query.", "{query.",
	"{http.vars.", "{vars.",
)

// ShortForm writes a placeholder template with the Caddyfile's shorthands,
// for messages: `{http.request.header.X-Key}` is shown as `{header.X-Key}`.
func ShortForm(tmpl string) string { return shorthands.Replace(tmpl) }

// valueFunc evaluates a placeholder template for one request.
type valueFunc func(r *http.Request) string

// compileTemplate returns the fastest evaluation of tmpl that gives the same
// value as repl.ReplaceAll(tmpl, ""): a constant, the client IP variable, a
// header read, or a single placeholder looked up without template parsing.
func compileTemplate(tmpl string) valueFunc {
	name, single := singlePlaceholder(tmpl)
	switch {
	case !strings.Contains(tmpl, "{"):
		return func(*http.Request) string { return tmpl }
	case tmpl == DefaultKey:
		return func(r *http.Request) string {
			ip, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
			return ip
		}
	case single && strings.HasPrefix(name, "http.request.header."):
		field := textproto.CanonicalMIMEHeaderKey(strings.TrimPrefix(name, "http.request.header."))
		return func(r *http.Request) string {
			if v := r.Header[field]; len(v) > 0 {
				return strings.Join(v, ",") // as the replacer joins repeated fields
			}
			return ""
		}
	case single:
		return func(r *http.Request) string {
			v, _ := replacer(r).GetString(name)
			return v
		}
	}
	return func(r *http.Request) string { return replacer(r).ReplaceAll(tmpl, "") }
}

// replacer returns the request's replacer. Only templates that need it look
// it up: it is a walk up the request's context chain.
func replacer(r *http.Request) *caddy.Replacer {
	return r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
}

// singlePlaceholder reports whether tmpl is exactly one placeholder, and its
// name.
func singlePlaceholder(tmpl string) (string, bool) {
	if len(tmpl) < 3 || tmpl[0] != '{' || tmpl[len(tmpl)-1] != '}' {
		return "", false
	}
	name := tmpl[1 : len(tmpl)-1]
	if strings.ContainsAny(name, "{}\\") {
		return "", false
	}
	return name, true
}

// compileKey evaluates a limit's key. A key that is the client's address
// counts its IPv4-mapped IPv6 form as the IPv4 address (one client, two
// spellings, depending on the listener); any other key is compared exactly
// as evaluated. The zone keeps only a fixed-size hash of the key, so a huge
// key costs no memory.
func compileKey(tmpl string) valueFunc {
	eval := compileTemplate(tmpl)
	if !keyIsAddress(tmpl) {
		return eval
	}
	return func(r *http.Request) string {
		key := eval(r)
		if rest, ok := strings.CutPrefix(key, "::ffff:"); ok && strings.Contains(rest, ".") {
			key = rest
		}
		return key
	}
}

// addressKeys are the key templates that yield a client address, which may
// be logged at debug level; any other key may carry a secret (an API key, a
// cookie) and is logged only as a hash.
var addressKeys = []string{DefaultKey, "{http.request.remote.host}"}

// keyIsAddress reports whether a key template yields a client address.
func keyIsAddress(tmpl string) bool { return slices.Contains(addressKeys, tmpl) }
