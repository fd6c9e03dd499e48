package inflight

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// request returns a request as Caddy's server prepares it, from remoteAddr.
func request(remoteAddr string, header ...string) (*http.Request, *caddy.Replacer) {
	r := httptest.NewRequest(http.MethodGet, "http://example.com/path", nil)
	r.RemoteAddr = remoteAddr
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	repl := caddy.NewReplacer()
	r = caddyhttp.PrepareRequest(r, repl, httptest.NewRecorder(), &caddyhttp.Server{})
	repl.Set("tenant", "acme")
	return r, repl
}

// The fast paths must give exactly what Caddy's replacer gives.
func TestCompiledTemplatesMatchTheReplacer(t *testing.T) {
	r, repl := request("192.0.2.7:5555", "X-Api-Key", "k1", "X-Api-Key", "k2", "X-Other", "o")
	for _, tmpl := range []string{
		DefaultKey,
		"{http.request.header.X-Api-Key}",
		"{http.request.header.x-other}",
		"{http.request.header.Missing}",
		"{tenant}",
		"{missing}",
		"static",
		"{http.request.header.X-Other}/{tenant}",
		"{http.request.host}",
	} {
		want := repl.ReplaceAll(tmpl, "")
		if got := compileTemplate(tmpl)(r); got != want {
			t.Errorf("%s: compiled %q, replacer %q", tmpl, got, want)
		}
	}
}

func TestKeyNormalisation(t *testing.T) {
	mapped, _ := request("[::ffff:192.0.2.7]:5555")
	plain, _ := request("192.0.2.7:5555")
	key := compileKey(DefaultKey)
	if a, b := key(mapped), key(plain); a != b || a != "192.0.2.7" {
		t.Fatalf("IPv4-mapped %q and IPv4 %q must be one key, 192.0.2.7", a, b)
	}
	v6, _ := request("[2001:db8::1]:5555")
	if got := key(v6); got != "2001:db8::1" {
		t.Fatalf("IPv6 key %q", got)
	}
	// Other keys are compared exactly as evaluated.
	header := compileKey("{http.request.header.X-Key}")
	mappedHeader, _ := request("192.0.2.7:5555", "X-Key", "::ffff:1.2.3.4")
	plainHeader, _ := request("192.0.2.7:5555", "X-Key", "1.2.3.4")
	if a, b := header(mappedHeader), header(plainHeader); a == b {
		t.Fatalf("header keys ::ffff:1.2.3.4 and 1.2.3.4 both evaluated to %q, want two keys", a)
	}
}
