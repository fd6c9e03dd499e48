package integration

import (
	"os"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// loadExample adapts and runs a Caddyfile from examples/ as it is.
func loadExample(t *testing.T, name string) {
	t.Helper()
	src, err := os.ReadFile("../examples/" + name)
	if err != nil {
		t.Fatal(err)
	}
	cfg, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(src, map[string]any{"filename": name})
	if err != nil {
		t.Fatalf("adapt %s: %v", name, err)
	}
	for _, w := range warnings {
		t.Errorf("adapt %s: warning: %s", name, w.String())
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("run %s: %v", name, err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
}

// TestExampleCaddyfile runs the README's demonstration: six concurrent
// requests from one client against `inflight 3` and a slow backend.
func TestExampleCaddyfile(t *testing.T) {
	loadExample(t, "Caddyfile")
	got := countStatus(burst(client("127.0.0.1"), 6, "http://127.0.0.1:8080/"))
	if got[200] != 3 || got[429] != 3 {
		t.Fatalf("six concurrent requests: %v, want 3 × 200 and 3 × 429", got)
	}
}
