package layer4

import (
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestLinksNoHTTPEdge: a build with the layer4 handler links, of this
// module, only what every protocol shares: the core, the engine, the
// fleet's call and table types, the metric declarations, the Redis store
// and the Caddyfile reading of the shared options. Never the HTTP
// edge (inflight, and caddyfile, whose import registers the HTTP
// directive) nor the LLM token and usage code it uses.
func TestLinksNoHTTPEdge(t *testing.T) {
	const module = "github.com/caddy-inflight/caddy-inflight"
	shared := map[string]bool{
		module + "/inflight/core":        true,
		module + "/inflight/fleet":       true,
		module + "/inflight/limiter":     true,
		module + "/inflight/metric":      true,
		module + "/inflight/storestatus": true,
		module + "/inflight/redisstore":  true,
		module + "/caddyfile/options":    true,
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	self := false
	for _, pkg := range strings.Fields(string(out)) {
		switch {
		case strings.HasPrefix(pkg, module+"/layer4"):
			self = true
		case (pkg == module || strings.HasPrefix(pkg, module+"/")) && !shared[pkg]:
			t.Errorf("the layer4 handler links %s: it may link only %s of this module", pkg, strings.Join(slices.Sorted(maps.Keys(shared)), ", "))
		}
	}
	if !self {
		t.Fatalf("go list -deps does not list the layer4 package:\n%s", out)
	}
}
