package integration

import (
	"context"
	"os"
	"strings"
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

// TestExampleLLMGateway streams from a fake model: the batch tenant (cap 2)
// opens three streams; two stream, the third waits, and all three finish
// once the model ends the first two.
func TestExampleLLMGateway(t *testing.T) {
	model := newBackendAt(t, "127.0.0.1:11434")
	loadExample(t, "llm-gateway.Caddyfile")
	c := client("127.0.0.1")
	done := make(chan result, 3)
	for range 3 {
		go func() {
			done <- get(context.Background(), c, "http://127.0.0.1:8090/stream", "Authorization", "Bearer key-batch")
		}()
	}
	eventually(t, "two streams run and one waits", func() bool {
		return model.cur.Load() == 2 && metricAt(t, "127.0.0.1:2019", "caddy_inflight_waiting", `zone="model"`) == 1
	})
	if p := model.peak.Load(); p != 2 {
		t.Fatalf("model saw %d batch streams at once, want 2", p)
	}
	// The interactive tenant has its own cap and is not held up.
	if r := get(context.Background(), c, "http://127.0.0.1:8090/", "Authorization", "Bearer key-interactive"); r.status != 200 {
		t.Fatalf("interactive tenant: %d, want 200", r.status)
	}
	model.open()
	for range 3 {
		if r := <-done; r.status != 200 || !strings.Contains(r.body, "data: end") {
			t.Fatalf("stream: %d %q", r.status, r.body)
		}
	}
}
