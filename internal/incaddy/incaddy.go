// Package incaddy runs a real Caddy with the module in a test's process,
// on loopback, for the nested test modules (integration/browser, grpc,
// sdk), which cannot import the integration package's test files. Their
// tests import the module itself (and Caddy's standard modules).
package incaddy

import (
	"net"
	"net/http"
	"os"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// Globals returns a test Caddyfile's global options: the admin API at
// admin (an address, or off), loopback only, no automatic HTTPS, nothing
// written to disk, logs discarded; then extra.
func Globals(admin, extra string) string {
	return "{\n\tadmin " + admin + "\n\tdefault_bind 127.0.0.1\n\tauto_https off\n\tpersist_config off\n\tskip_install_trust\n\tlog {\n\t\toutput discard\n\t}\n" + extra + "}\n"
}

// Load adapts caddyfile (its globals included) and runs it until the test
// ends; an adapter's warning fails the test.
func Load(t testing.TB, caddyfile string) {
	t.Helper()
	cfg, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	if len(warnings) > 0 {
		t.Fatalf("adapt warnings: %v", warnings)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
}

// FreeAddr returns a loopback address whose port was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Serve runs h on a loopback port until the test ends, and returns its
// address.
func Serve(t testing.TB, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// Main runs a test binary's tests with Caddy's storage and autosave
// (XDG_DATA_HOME, XDG_CONFIG_HOME) in a directory of its own, removed
// after them, out of the user's home; call it from TestMain.
func Main(m *testing.M) {
	dir, err := os.MkdirTemp("", "inflight-test")
	if err != nil {
		panic(err)
	}
	os.Setenv("XDG_DATA_HOME", dir)
	os.Setenv("XDG_CONFIG_HOME", dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
