package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/caddy-inflight/caddy-inflight/integration/internal/tenants"
)

// TestTenantExampleFleetThroughCaddy runs the README's tenant example
// (internal/tenants) on a fleet: three Caddy processes with `store redis`
// on one Redis, the clients spread over the three. Over 10 s after 3 s
// of warm-up, the backend holds at least 38 of the total of 40 on average
// and never more than 40. The shares are what fleet-guarantees.md states
// for a fleet, where a tenant whose own cap is near its share of the
// total gets less than that share, the less the busier the machine: each
// tenant at least 0.6 of its max-min share of the request-seconds (acme
// and globex 0.2625 of their 0.4375, anonymous 0.075 of its cap's 0.125),
// anonymous at most 0.145.
func TestTenantExampleFleetThroughCaddy(t *testing.T) {
	rs := startRedis(t)
	backend := tenants.NewBackend()
	addr := serveAt(t, "127.0.0.1:0", backend)
	var urls []string
	for range 3 {
		port := freePort(t)
		startCaddy(t, globalsAt("off", "")+fmt.Sprintf("http://127.0.0.1:%d {\n\t%s%s\n}\n", port,
			tenants.Site(fmt.Sprintf("store redis {\n\t\t\taddress %s\n\t\t}", rs.addr)), addr), port)
		urls = append(urls, fmt.Sprintf("http://127.0.0.1:%d/", port))
	}
	statuses := backend.Drive(urls, 3*time.Second, 10*time.Second)
	held, most, share := backend.Figures()
	t.Logf("the backend held %.2f of 40 on average, at most %d; acme %.3f, globex %.3f, anonymous %.3f; statuses %v",
		held, most, share["acme"], share["globex"], share["anonymous"], statuses)
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
