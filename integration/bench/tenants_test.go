package bench

import (
	"encoding/json"
	"math"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/caddy-inflight/caddy-inflight/integration/internal/tenants"
)

// TestTenantExampleThroughCaddy runs the README's tenant example in a
// built Caddy (INFLIGHT_CADDY): acme capped at 30, globex at 20, requests
// without a key at 5, a total of 40, wait 30s, fair by tenant, in front
// of a backend that holds each request 500 ms; 80 clients each for acme
// and globex and 10 without a key send request after request. After a
// warm-up it measures, over INFLIGHT_TENANTS_DURATION (default 10s), the
// backend's request-seconds: the slots it held on average, and each
// tenant's share. In a full run (not QUICK) the backend holds at least
// 38 of 40, acme and globex at least 0.40 each, anonymous 5/40 ± 0.02.
func TestTenantExampleThroughCaddy(t *testing.T) {
	bin := os.Getenv("INFLIGHT_CADDY")
	if bin == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("INFLIGHT_CADDY is not set: the path of a Caddy built with the module (run.sh sets it; .ci/run runs run.sh)")
		}
		t.Skip("INFLIGHT_CADDY is not set: the path of a Caddy built with the module (run.sh sets it): skipped here, a failure in CI")
	}
	window, warmUp := 10*time.Second, 3*time.Second
	if s := os.Getenv("INFLIGHT_TENANTS_DURATION"); s != "" {
		var err error
		if window, err = time.ParseDuration(s); err != nil {
			t.Fatalf("INFLIGHT_TENANTS_DURATION: %v", err)
		}
		warmUp = min(warmUp, window)
	}
	backend := tenants.NewBackend()
	srv := httptest.NewServer(backend)
	defer srv.Close()
	addr := startCaddy(t, bin, tenants.Site("")+srv.Listener.Addr().String())
	statuses := backend.Drive([]string{"http://" + addr + "/"}, warmUp, window)
	held, _, share := backend.Figures()
	figures, _ := json.Marshal(map[string]any{"seconds": window.Seconds(), "backend_held": math.Round(held*100) / 100,
		"acme": math.Round(share["acme"]*1000) / 1000, "globex": math.Round(share["globex"]*1000) / 1000,
		"anonymous": math.Round(share["anonymous"]*1000) / 1000, "statuses": statuses})
	t.Logf("tenants %s", figures)
	if os.Getenv("QUICK") != "" {
		return // too short to judge
	}
	if held < 38 {
		t.Errorf("the backend held %.2f of 40 on average, want at least 38", held)
	}
	for _, tenant := range []string{"acme", "globex"} {
		if share[tenant] < 0.40 {
			t.Errorf("%s: %.3f of the request-seconds, want at least 0.40", tenant, share[tenant])
		}
	}
	if math.Abs(share["anonymous"]-5.0/40) > 0.02 {
		t.Errorf("anonymous: %.3f of the request-seconds, want 0.125 ± 0.02", share["anonymous"])
	}
}
