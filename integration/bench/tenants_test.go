package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/caddy-inflight/caddy-inflight/integration/bench/internal/tenants"
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
	bin, warmUp, window := builtCaddy(t), tenantsWarmUp(t), tenantsWindow(t)
	backend := tenants.NewBackend()
	srv := httptest.NewServer(backend)
	defer srv.Close()
	addr := startCaddy(t, bin, tenants.Site("")+srv.Listener.Addr().String())
	statuses := backend.Drive([]string{"http://" + addr + "/"}, warmUp, window)
	held, _, share := logFigures(t, "tenants", backend, statuses, window)
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

// TestTenantExampleFleetThroughCaddy runs the same example on a fleet:
// three built Caddys (INFLIGHT_CADDY) with `store redis` on a
// redis-server of the test's own, the clients spread over the three. In
// a full run (not QUICK) the backend holds at least 38 of the total of
// 40 on average and never more than 40; the shares are what
// fleet-guarantees.md states for a fleet, where a tenant whose own cap is
// near its share of the total gets less than that share, the less the
// busier the machine: each tenant at least 0.6 of its max-min share
// (acme and globex 0.2625 of their 0.4375, anonymous 0.075 of its cap's
// 0.125), anonymous at most 0.145.
func TestTenantExampleFleetThroughCaddy(t *testing.T) {
	bin, warmUp, window := builtCaddy(t), tenantsWarmUp(t), tenantsWindow(t)
	redisAddr := startRedis(t)
	backend := tenants.NewBackend()
	srv := httptest.NewServer(backend)
	defer srv.Close()
	var urls []string
	for range 3 {
		addr := startCaddy(t, bin, tenants.Site(fmt.Sprintf("store redis {\n\t\t\taddress %s\n\t\t}", redisAddr))+srv.Listener.Addr().String())
		urls = append(urls, "http://"+addr+"/")
	}
	statuses := backend.Drive(urls, warmUp, window)
	held, most, share := logFigures(t, "fleet", backend, statuses, window)
	if os.Getenv("QUICK") != "" {
		return // too short to judge
	}
	if held < 38 {
		t.Errorf("the backend held %.2f of 40 on average, want at least 38", held)
	}
	if most > 40 {
		t.Errorf("the backend held %d requests at once, over the total of 40", most)
	}
	for _, tenant := range []string{"acme", "globex"} {
		if s := share[tenant]; s < 0.6*0.4375 {
			t.Errorf("%s: %.3f of the request-seconds, want at least 0.2625 (0.6 of 0.4375)", tenant, s)
		}
	}
	if s := share["anonymous"]; s < 0.6*0.125 || s > 0.145 {
		t.Errorf("anonymous: %.3f of the request-seconds, want 0.075 (0.6 of 0.125) to 0.145", s)
	}
}

// tenantsWindow is how long the tenant example is measured:
// INFLIGHT_TENANTS_DURATION, 10 s by default; tenantsWarmUp how long it
// runs before, 3 s, or the window if that is shorter.
func tenantsWindow(t *testing.T) time.Duration {
	t.Helper()
	s := os.Getenv("INFLIGHT_TENANTS_DURATION")
	if s == "" {
		return 10 * time.Second
	}
	window, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("INFLIGHT_TENANTS_DURATION: %v", err)
	}
	return window
}

func tenantsWarmUp(t *testing.T) time.Duration { return min(3*time.Second, tenantsWindow(t)) }

// logFigures logs the backend's figures as one JSON line after label, for
// run.sh's tables, and returns them.
func logFigures(t *testing.T, label string, b *tenants.Backend, statuses map[int]int, window time.Duration) (held float64, most int, share map[string]float64) {
	held, most, share = b.Figures()
	figures, _ := json.Marshal(map[string]any{"seconds": window.Seconds(), "backend_held": math.Round(held*100) / 100, "backend_most": most,
		"acme": math.Round(share["acme"]*1000) / 1000, "globex": math.Round(share["globex"]*1000) / 1000,
		"anonymous": math.Round(share["anonymous"]*1000) / 1000, "statuses": statuses})
	t.Logf("%s %s", label, figures)
	return held, most, share
}

// startRedis runs a redis-server of the test's own on a free loopback
// port, and returns its address once it answers; it is killed when the
// test ends.
func startRedis(t *testing.T) string {
	t.Helper()
	addr := freeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatalf("redis-server (apt-get install redis-server): %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not listen on %s", addr)
		}
	}
}
