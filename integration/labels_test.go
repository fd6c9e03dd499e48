package integration

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// labelTree is caddy-docker-proxy's reading of labels: dots nest, an `N_`
// prefix orders (unnumbered last), then names sort alphabetically; a value
// is the directive's arguments, an empty one none.
type labelTree struct {
	name     string
	order    int
	args     string
	children []*labelTree
}

var orderPrefix = regexp.MustCompile(`^(\d+)_(.+)$`)

func (n *labelTree) child(segment string) *labelTree {
	order, name := math.MaxInt32, segment
	if m := orderPrefix.FindStringSubmatch(segment); m != nil {
		order, _ = strconv.Atoi(m[1])
		name = m[2]
	}
	for _, c := range n.children {
		if c.name == name && c.order == order {
			return c
		}
	}
	c := &labelTree{name: name, order: order}
	n.children = append(n.children, c)
	return c
}

func (n *labelTree) write(b *strings.Builder, depth int) {
	slices.SortStableFunc(n.children, func(a, b *labelTree) int {
		if a.order != b.order {
			return a.order - b.order
		}
		return strings.Compare(a.name, b.name)
	})
	for _, c := range n.children {
		b.WriteString(strings.Repeat("\t", depth) + strings.TrimSpace(c.name+" "+c.args))
		if len(c.children) > 0 {
			b.WriteString(" {\n")
			c.write(b, depth+1)
			b.WriteString(strings.Repeat("\t", depth) + "}")
		}
		b.WriteString("\n")
	}
}

// caddyfileFromCompose converts the caddy labels of each service in a
// docker-compose file into the site blocks caddy-docker-proxy generates,
// `{{upstreams P}}` becoming the service's address from upstreams.
func caddyfileFromCompose(t *testing.T, path string, upstreams map[string]string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	service := regexp.MustCompile(`^  ([a-z0-9_-]+):\s*$`)
	label := regexp.MustCompile(`^      (caddy[a-z0-9_.]*):\s*(.*)$`)
	upstream := regexp.MustCompile(`\{\{upstreams (\d+)\}\}`)
	var sites []string
	var current string
	var site *labelTree
	var address string
	flush := func() {
		if site != nil {
			var b strings.Builder
			b.WriteString(address + " {\n")
			site.write(&b, 1)
			b.WriteString("}\n")
			sites = append(sites, b.String())
		}
		site = nil
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := service.FindStringSubmatch(sc.Text()); m != nil {
			flush()
			current = m[1]
			continue
		}
		m := label.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		value := strings.Trim(m[2], `"`)
		value = upstream.ReplaceAllString(value, upstreams[current]+":$1")
		if m[1] == "caddy" {
			site, address = &labelTree{}, value
			continue
		}
		node := site
		for _, segment := range strings.Split(strings.TrimPrefix(m[1], "caddy."), ".") {
			node = node.child(segment)
		}
		node.args = value
	}
	flush()
	return strings.Join(sites, "\n")
}

// siteBlocks drops comments and blank lines, for comparing Caddyfiles.
func siteBlocks(caddyfile string) string {
	var out []string
	for _, line := range strings.Split(caddyfile, "\n") {
		if trimmed := strings.TrimSpace(line); trimmed != "" && !strings.HasPrefix(trimmed, "#") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestDockerLabels checks that examples/docker-labels.Caddyfile is what the
// labels in examples/docker-compose.yml produce, then adapts and runs it
// against loopback backends standing in for the containers.
func TestDockerLabels(t *testing.T) {
	want, err := os.ReadFile("../examples/docker-labels.Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	got := caddyfileFromCompose(t, "../examples/docker-compose.yml", map[string]string{"app": "172.20.0.3", "api": "172.20.0.4"})
	if siteBlocks(got) != siteBlocks(string(want)) {
		t.Fatalf("the labels produce\n%s\nbut docker-labels.Caddyfile says\n%s", got, want)
	}

	// Adapt it exactly as written (HTTPS sites) ...
	if _, err := adaptOnly(string(want)); err != nil {
		t.Fatalf("adapt docker-labels.Caddyfile: %v", err)
	}
	// ... and run it over plain HTTP on loopback, the containers being
	// loopback backends.
	app, api := newBackend(t), newBackend(t)
	caddyfile := strings.NewReplacer(
		"172.20.0.3:80", app.addr, "172.20.0.4:80", api.addr,
		"app.example.com {", "http://app.example.com {", "api.example.com {", "http://api.example.com {",
	).Replace(string(want))
	port := freePort(t)
	loadWith(t, fmt.Sprintf("\thttp_port %d", port), caddyfile)
	c := client("127.0.0.1")
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	do := func(host, path string) result {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, base+path, nil)
		req.Host = host
		resp, err := c.Do(req)
		if err != nil {
			return result{err: err}
		}
		resp.Body.Close()
		return result{status: resp.StatusCode}
	}

	// app: inflight 20 per client.
	held := make(chan result, 20)
	for range 20 {
		go func() { held <- do("app.example.com", "/hold") }()
	}
	eventually(t, "20 requests reach the app", func() bool { return app.cur.Load() == 20 })
	if r := do("app.example.com", "/"); r.status != 429 {
		t.Fatalf("21st request to the app: %d, want 429", r.status)
	}
	if r := do("api.example.com", "/"); r.status != 200 {
		t.Fatalf("the api site while the app is full: %d, want 200", r.status)
	}
	app.open()
	for range 20 {
		if r := <-held; r.status != 200 {
			t.Fatalf("held app request: %d %v", r.status, r.err)
		}
	}
}
