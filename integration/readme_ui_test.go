package integration

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// livePageSnippet returns the one Caddyfile block of a document that mounts
// the live page with inflight_ui.
func livePageSnippet(t *testing.T, doc string) string {
	t.Helper()
	raw, err := os.ReadFile("../" + doc)
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, block := range strings.Split(string(raw), "```caddyfile\n")[1:] {
		block, _, _ = strings.Cut(block, "```")
		if strings.Contains(block, "inflight_ui") {
			found = append(found, block)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s has %d caddyfile blocks with inflight_ui, want 1", doc, len(found))
	}
	return found[0]
}

// TestLivePageSnippetOpensWhileTheZoneIsFull loads the live page's snippet
// of the README and of docs/observability.md as written, on a loopback
// address with a held backend as its upstream, fills the site's own
// inflight cap and opens the page from the client that fills it: the page
// is served (200), behind the snippet's basic_auth (401 without it), and
// takes no slot (a request to the site is still refused).
func TestLivePageSnippetOpensWhileTheZoneIsFull(t *testing.T) {
	for _, doc := range []string{"README.md", "docs/observability.md"} {
		t.Run(doc, func(t *testing.T) {
			snippet := livePageSnippet(t, doc)
			m := regexp.MustCompile(`(?m)^\tinflight (\d+)$`).FindStringSubmatch(snippet)
			if m == nil || !strings.Contains(snippet, "example.com {") || !strings.Contains(snippet, "app:8080") {
				t.Fatalf("the snippet has no site example.com, inflight <max> and upstream app:8080 to run:\n%s", snippet)
			}
			max, _ := strconv.Atoi(m[1])
			b := newBackend(t)
			site := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
			cfg := strings.Replace(strings.Replace(snippet, "example.com {", site+" {", 1), "app:8080", b.addr, 1)
			load(t, cfg)
			c := client("127.0.0.1")
			var held []<-chan result
			for range max {
				held = append(held, hold(t, b, context.Background(), c, site+"/hold"))
			}
			if r := get(context.Background(), c, site+"/"); r.status != 429 {
				t.Fatalf("request %d to the site: %d, want 429 (the zone is full)", max+1, r.status)
			}
			// The password of the snippet's hash (Caddy's documentation's).
			auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("admin:hiccup"))
			if r := get(context.Background(), c, site+"/inflight/", "Authorization", auth); r.status != 200 || !strings.Contains(r.body, "<html") {
				t.Errorf("the live page with the zone full: %d %.80q, want 200 and the page", r.status, r.body)
			}
			if r := get(context.Background(), c, site+"/inflight/"); r.status != 401 {
				t.Errorf("the live page without credentials: %d, want 401", r.status)
			}
			if r := get(context.Background(), c, site+"/"); r.status != 429 {
				t.Errorf("the site after the page was served: %d, want 429 (the page took no slot)", r.status)
			}
			b.open()
			for _, h := range held {
				if r := <-h; r.status != 200 {
					t.Fatalf("held request: %d %v", r.status, r.err)
				}
			}
		})
	}
}
