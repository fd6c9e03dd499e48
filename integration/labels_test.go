package integration

import (
	"cmp"
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

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.yaml.in/yaml/v3"
)

// This file emulates how caddy-docker-proxy (v2.13) turns container labels
// into a Caddyfile, as read in its caddyfile/fromlabels.go, marshal.go,
// caddyfile.go, generator/labels.go and generator.go, and checked against
// its caddyfile/testdata/labels. It implements:
//
//   - labels `caddy` and `caddy_N` (each a root block: a site, a snippet, or
//     global options when it has no value), and below them dotted paths,
//     `\.` escaping a dot;
//   - a path segment `N_name` (ordered by N) or `name_N` (kept apart from
//     other `name`s, like any distinct label); segments otherwise merge;
//   - values as Caddyfile tokens (quotes group words; YAML has already
//     removed a trailing ` # comment` and its own quoting);
//   - `{{upstreams}}` and `{{upstreams PORT}}`;
//   - the converter's order: global options, snippets, matchers (`@name`),
//     then by N_, then by words, and its quoting of words with spaces,
//     quotes or newlines.
//
// Anything else is an error naming the label: other templates, list
// labels (`- caddy=...`), null or non-text values, and the same root block
// in two services (the converter merges them; this does not).

// labelBlock is one line of the generated Caddyfile and what nests in it.
type labelBlock struct {
	words    []string
	order    int
	children []*labelBlock
}

func (b *labelBlock) isGlobal() bool  { return len(b.words) == 0 }
func (b *labelBlock) isSnippet() bool { return len(b.words) == 1 && strings.HasPrefix(b.words[0], "(") }
func (b *labelBlock) isMatcher() bool { return len(b.words) > 0 && strings.HasPrefix(b.words[0], "@") }

// compareLabelBlocks is the converter's order of sibling blocks.
func compareLabelBlocks(a, b *labelBlock) int {
	first := func(fa, fb bool) int {
		switch {
		case fa && !fb:
			return -1
		case fb && !fa:
			return 1
		}
		return 0
	}
	if c := first(a.isGlobal(), b.isGlobal()); c != 0 {
		return c
	}
	if c := first(a.isSnippet(), b.isSnippet()); c != 0 {
		return c
	}
	if c := first(a.isMatcher(), b.isMatcher()); c != 0 {
		return c
	}
	if c := cmp.Compare(a.order, b.order); c != 0 {
		return c
	}
	if c := slices.Compare(a.words, b.words); c != 0 {
		return c
	}
	return slices.CompareFunc(a.children, b.children, compareLabelBlocks)
}

func writeLabelBlocks(out *strings.Builder, blocks []*labelBlock, depth int) {
	slices.SortStableFunc(blocks, compareLabelBlocks)
	for _, b := range blocks {
		words := make([]string, len(b.words))
		for i, w := range b.words {
			switch {
			case strings.ContainsAny(w, "\n\""):
				w = "`" + strings.ReplaceAll(w, "`", "\\`") + "`"
			case strings.Contains(w, " "):
				w = `"` + w + `"`
			}
			words[i] = w
		}
		out.WriteString(strings.Repeat("\t", depth) + strings.Join(words, " "))
		if len(b.children) > 0 {
			if len(words) > 0 {
				out.WriteString(" ")
			}
			out.WriteString("{\n")
			writeLabelBlocks(out, b.children, depth+1)
			out.WriteString(strings.Repeat("\t", depth) + "}")
		}
		out.WriteString("\n")
	}
}

var (
	caddyLabel   = regexp.MustCompile(`^caddy(_\d+)?(\.|$)`)
	labelSegment = regexp.MustCompile(`^(?:(\d+)_)?(.+?)(?:_\d+)?$`)
	templateCall = regexp.MustCompile(`\{\{.*?\}\}`)
	upstreamsArg = regexp.MustCompile(`^\{\{\s*upstreams(?:\s+(\d+))?\s*\}\}$`)
)

// label is one container label.
type label struct{ name, value string }

// labelsToBlocks converts one service's labels to its root blocks;
// upstream is the container's address for {{upstreams}}.
func labelsToBlocks(service string, labels []label, upstream string) ([]*labelBlock, error) {
	root := &labelBlock{}
	byPath := map[string]*labelBlock{"": root}
	var blockAt func(path string) *labelBlock
	blockAt = func(path string) *labelBlock {
		if b := byPath[path]; b != nil {
			return b
		}
		parent, segment := "", path
		if i := lastUnescapedDot(path); i >= 0 {
			parent, segment = path[:i], path[i+1:]
		}
		m := labelSegment.FindStringSubmatch(segment)
		b := &labelBlock{order: math.MaxInt32}
		if m[1] != "" {
			b.order, _ = strconv.Atoi(m[1])
		}
		if parent != "" {
			b.words = []string{strings.ReplaceAll(m[2], `\.`, ".")}
		}
		p := blockAt(parent)
		p.children = append(p.children, b)
		byPath[path] = b
		return b
	}
	for _, l := range labels {
		if !caddyLabel.MatchString(l.name) {
			continue
		}
		var err error
		value := templateCall.ReplaceAllStringFunc(l.value, func(call string) string {
			m := upstreamsArg.FindStringSubmatch(call)
			if m == nil {
				err = fmt.Errorf("service %s, label %s: template %s is not emulated (only {{upstreams}} and {{upstreams PORT}})", service, l.name, call)
				return call
			}
			if m[1] != "" {
				return upstream + ":" + m[1]
			}
			return upstream
		})
		if err != nil {
			return nil, err
		}
		b := blockAt(l.name)
		if value == "" {
			continue // no arguments
		}
		tokens, err := caddyfile.Tokenize([]byte(value), "")
		if err != nil {
			return nil, fmt.Errorf("service %s, label %s: value %q: %v", service, l.name, value, err)
		}
		for _, tok := range tokens {
			b.words = append(b.words, tok.Text)
		}
	}
	return root.children, nil
}

// lastUnescapedDot returns the index of the last '.' not written `\.`.
func lastUnescapedDot(path string) int {
	for i := len(path) - 1; i >= 0; i-- {
		if path[i] == '.' && (i == 0 || path[i-1] != '\\') {
			return i
		}
	}
	return -1
}

// caddyfileFromCompose converts the caddy labels of every service of a
// docker-compose file (YAML) into the Caddyfile caddy-docker-proxy
// generates; upstreams gives each service's container address.
func caddyfileFromCompose(compose []byte, upstreams map[string]string) (string, error) {
	var doc struct {
		Services yaml.Node `yaml:"services"`
	}
	if err := yaml.Unmarshal(compose, &doc); err != nil {
		return "", fmt.Errorf("compose file: %v", err)
	}
	if doc.Services.Kind != yaml.MappingNode {
		return "", fmt.Errorf("compose file: no services")
	}
	var blocks []*labelBlock
	seen := map[string]string{}
	for i := 0; i+1 < len(doc.Services.Content); i += 2 {
		service := doc.Services.Content[i].Value
		var labels []label
		spec := doc.Services.Content[i+1]
		for j := 0; j+1 < len(spec.Content); j += 2 {
			if spec.Content[j].Value != "labels" {
				continue
			}
			list := spec.Content[j+1]
			if list.Kind != yaml.MappingNode {
				return "", fmt.Errorf("service %s: labels as a list (- key=value) are not emulated: write them as a map", service)
			}
			for k := 0; k+1 < len(list.Content); k += 2 {
				name, value := list.Content[k].Value, list.Content[k+1]
				if value.Kind != yaml.ScalarNode || value.Tag == "!!null" {
					return "", fmt.Errorf("service %s, label %s: a value that is not text (null, list or map) is not emulated: write \"\" for no arguments", service, name)
				}
				labels = append(labels, label{name, value.Value})
			}
		}
		roots, err := labelsToBlocks(service, labels, upstreams[service])
		if err != nil {
			return "", err
		}
		for _, b := range roots {
			key := strings.Join(b.words, " ")
			if other, dup := seen[key]; dup {
				return "", fmt.Errorf("services %s and %s both define %q: the converter merges them, which is not emulated", other, service, key)
			}
			seen[key] = service
			blocks = append(blocks, b)
		}
	}
	var out strings.Builder
	writeLabelBlocks(&out, blocks, 0)
	return out.String(), nil
}

// mustConvert is caddyfileFromCompose failing the test on an error.
func mustConvert(t *testing.T, compose []byte, upstreams map[string]string) string {
	t.Helper()
	caddyfile, err := caddyfileFromCompose(compose, upstreams)
	if err != nil {
		t.Fatal(err)
	}
	return caddyfile
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

// TestLabelForms converts the label forms people write, each checked
// against the converter's source and test data.
func TestLabelForms(t *testing.T) {
	for _, tc := range []struct{ name, labels, want string }{{
		"suffixes keep repeated options apart",
		`
      caddy: a.example.com
      caddy.inflight.limit_0: "client {client_ip} 20"
      caddy.inflight.limit_1: "key {header.X-Api-Key} 5"`,
		`a.example.com {
	inflight {
		limit client {client_ip} 20
		limit key {header.X-Api-Key} 5
	}
}`,
	}, {
		"prefixes order, before unnumbered options; the rest sorts by name",
		`
      caddy: a.example.com
      caddy.reverse_proxy: "{{upstreams 8080}}"
      caddy.1_inflight: 3
      caddy.0_header: X-Limited yes`,
		`a.example.com {
	header X-Limited yes
	inflight 3
	reverse_proxy 10.0.0.7:8080
}`,
	}, {
		"a matcher comes first",
		`
      caddy: a.example.com
      caddy.@slow.path: /slow/*
      caddy.inflight: "@slow 2"
      caddy.reverse_proxy: "{{upstreams}}"`,
		`a.example.com {
	@slow {
		path /slow/*
	}
	inflight @slow 2
	reverse_proxy 10.0.0.7
}`,
	}, {
		"YAML comments and quoting",
		`
      caddy: a.example.com # the site
      caddy.inflight.limit: 'tenant {header.X-Tenant} 4' # per tenant
      caddy.inflight.dry_run: ""
      caddy.respond: '"over the limit" 200'`,
		`a.example.com {
	inflight {
		dry_run
		limit tenant {header.X-Tenant} 4
	}
	respond "over the limit" 200
}`,
	}, {
		"caddy_0 and caddy_1 are separate sites; global options come first",
		`
      caddy_1: b.example.com
      caddy_1.inflight: 2
      caddy_0: a.example.com
      caddy_0.inflight: 1
      caddy_2.debug: ""`,
		`{
	debug
}
a.example.com {
	inflight 1
}
b.example.com {
	inflight 2
}`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			compose := "services:\n  web:\n    labels:" + tc.labels + "\n"
			got := mustConvert(t, []byte(compose), map[string]string{"web": "10.0.0.7"})
			if strings.TrimSpace(got) != tc.want {
				t.Fatalf("labels%s\nconvert to\n%s\nwant\n%s", tc.labels, got, tc.want)
			}
			if _, err := adaptOnly(got); err != nil {
				t.Fatalf("adapt:\n%s\n%v", got, err)
			}
		})
	}
}

// TestLabelFormsNotEmulatedAreRefused: a label form the emulation does not
// implement fails the conversion, naming what is wrong, instead of being
// converted wrongly.
func TestLabelFormsNotEmulatedAreRefused(t *testing.T) {
	for _, tc := range []struct{ name, compose, want string }{
		{"template", "services:\n  web:\n    labels:\n      caddy: a.example.com\n      caddy.respond: '{{ index .Labels \"x\" }}'\n", "template"},
		{"list labels", "services:\n  web:\n    labels:\n      - caddy=a.example.com\n", "as a list"},
		{"null value", "services:\n  web:\n    labels:\n      caddy: a.example.com\n      caddy.inflight.dry_run:\n", "not text"},
		{"merged sites", "services:\n  web:\n    labels:\n      caddy: a.example.com\n  api:\n    labels:\n      caddy: a.example.com\n", "merges"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := caddyfileFromCompose([]byte(tc.compose), map[string]string{"web": "10.0.0.7", "api": "10.0.0.8"})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("conversion of\n%s\ngave %v and\n%s\nwant an error mentioning %q", tc.compose, err, got, tc.want)
			}
		})
	}
}

// TestREADMELabelSnippets converts every label the README shows in inline
// code (`caddy.inflight: 10`), as the labels of a container whose site is
// example.com, with a limit of its own (so that an option alone makes a
// whole inflight block), and adapts the result.
func TestREADMELabelSnippets(t *testing.T) {
	raw, err := os.ReadFile("../docs/docker-labels.md")
	if err != nil {
		t.Fatal(err)
	}
	snippets := regexp.MustCompile("`(caddy(?:_\\d+)?(?:\\.[^`:\\s]+)*: [^`]*)`").FindAllStringSubmatch(string(raw), -1)
	if len(snippets) < 4 {
		t.Fatalf("only %d label snippets found in the README", len(snippets))
	}
	for _, m := range snippets {
		compose := "services:\n  web:\n    labels:\n      caddy: example.com\n      caddy.inflight.limit_99: \"snippet {client_ip} 1000\"\n      " + m[1] + "\n"
		got, err := caddyfileFromCompose([]byte(compose), map[string]string{"web": "10.0.0.7"})
		if err != nil {
			t.Errorf("the README's label %s: %v", m[1], err)
			continue
		}
		if _, err := adaptOnly(got); err != nil {
			t.Errorf("the README's label %s gives\n%s\nwhich does not adapt: %v", m[1], got, err)
		}
	}
}

// TestDockerLabels checks that examples/docker-labels.Caddyfile is what the
// labels in examples/docker-compose.yml produce, and the README's labels
// what the README says they produce; then adapts and runs the example
// against loopback backends standing in for the containers.
func TestDockerLabels(t *testing.T) {
	want, err := os.ReadFile("../examples/docker-labels.Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	compose, err := os.ReadFile("../examples/docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	containers := map[string]string{"app": "172.20.0.3", "api": "172.20.0.4"}
	got := mustConvert(t, compose, containers)
	if siteBlocks(got) != siteBlocks(string(want)) {
		t.Fatalf("the labels produce\n%s\nbut docker-labels.Caddyfile says\n%s", got, want)
	}
	section := readmeSection(t, "docs/docker-labels.md", "## Docker labels (caddy-docker-proxy)")
	_, rest, _ := strings.Cut(section, "```yaml\n")
	readmeLabels, rest, _ := strings.Cut(rest, "```")
	_, rest, _ = strings.Cut(rest, "```caddyfile\n")
	readmeCaddyfile, _, _ := strings.Cut(rest, "```")
	if got := mustConvert(t, []byte("services:\n"+readmeLabels), containers); siteBlocks(got) != siteBlocks(readmeCaddyfile) {
		t.Fatalf("the README's labels produce\n%s\nbut the README says\n%s", got, readmeCaddyfile)
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
