package inflight

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/textproto"
	"strings"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

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

// keyIsAddress reports whether a key template yields a client address, which
// may be logged at debug level; any other key may carry a secret (an API key,
// a cookie) and is logged only as a hash.
func keyIsAddress(tmpl string) bool {
	return tmpl == DefaultKey || tmpl == "{http.request.remote.host}"
}

// redact returns a short stable stand-in for a key that may be secret.
func redact(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "h:" + hex.EncodeToString(sum[:6])
}

// labelValue returns key as a metric label value, which must be valid
// UTF-8, one to one: a byte that is not valid UTF-8 is written as \xNN and
// a backslash as \\, so no key reads as another; a key that reads as
// overflowKey is written \x5foverflow.
func labelValue(key string) string {
	if key == overflowKey {
		return `\x5f` + key[1:]
	}
	if utf8.ValidString(key) && !strings.Contains(key, `\`) {
		return key
	}
	var b strings.Builder
	for i := 0; i < len(key); {
		r, size := utf8.DecodeRuneInString(key[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, key[i])
		case r == '\\':
			b.WriteString(`\\`)
		default:
			b.WriteString(key[i : i+size])
		}
		i += size
	}
	return b.String()
}
