package caddyinflight_test

// How the snippets of README.md and docs/*.md (the documents) are checked.
// Every snippet is one of these; none is skipped silently.
//
// Fenced blocks must carry one of these tags (an untagged block, or another
// tag, fails TestREADMESnippets):
//
//	caddyfile           a whole Caddyfile (global options and/or sites):
//	                    adapted as written.
//	caddyfile-fragment  directives of one site: wrapped in
//	                    `example.com { ... }` and adapted.
//	caddyfile-syntax    the directive's grammar (docs/reference.md): not
//	                    adapted, but every option it lists must be one the
//	                    directive knows, and those names decide which
//	                    inline code is checked, in every document.
//	json                must parse as JSON. An object with "handler" is a
//	                    handler: placed in a route and validated; one
//	                    with "apps" is a whole config: validated.
//	yaml                Docker labels: integration/labels_test.go converts
//	                    the one in docs/docker-labels.md as
//	                    caddy-docker-proxy does and compares it with the
//	                    caddyfile block after.
//	go                  engine types as docs/design.md shows them: must
//	                    parse, and every type, field and method shown must
//	                    exist in inflight/limiter or inflight/fleet
//	                    (docs_go_test.go).
//	sh                  commands and their output: not checked here.
//	packages            the package graph (docs/design.md): checked
//	                    against go list by layout_test.go.
//	caddyfile-layer4    a whole Caddyfile with caddy-l4's layer4 app, which
//	                    this module does not build: adapted and validated
//	                    by a Caddy built with caddy-l4
//	                    (layer4/integration/docs_test.go).
//
// Inline code (`...`):
//
//   - `inflight ...` with at least one argument is wrapped in a site and
//     adapted;
//   - an option listed in the caddyfile-syntax block, with at least one
//     argument (`total 50`), is wrapped in
//     `inflight { limit snippet {client_ip} 1000; <option> }` in a site and
//     adapted;
//   - `"<field>": <value>` naming a JSON field of the handler is put in a
//     handler (with a limit) and validated;
//   - `caddy.<path>: <value>` is a caddy-docker-proxy label:
//     integration/labels_test.go (TestREADMELabelSnippets) converts it and
//     adapts the result;
//   - anything else (placeholders, metric names, `dry_run` alone, a store's
//     options such as `on_error closed`, shell commands, other servers'
//     settings) is prose.
//
// Adapting must succeed with no warning, so every Caddyfile snippet is also
// `caddy fmt` clean. Every snippet and every config in examples/ must then
// pass what `caddy validate` does (validate_test.go) with no warning logged.
// `rate_limit` (caddy-ratelimit, which the module proxy here does not serve)
// is a stand-in directive that accepts any block, so the snippet combining
// it with `inflight` is adapted too.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/caddyauth"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddy-inflight/caddy-inflight"
	"github.com/caddy-inflight/caddy-inflight/inflight"
)

// snippet is one piece of a document to adapt.
type snippet struct {
	file      string // the document
	line      int    // where it starts in it
	kind      string // the fence tag, or "inline"
	text      string // as written
	caddyfile string // what is adapted, or
	json      []byte // the JSON config to validate
}

// where names a snippet's place: file:line.
func (s snippet) where() string { return fmt.Sprintf("%s:%d", s.file, s.line) }

// readmeBlock is a fenced block of a document.
type readmeBlock struct {
	file string
	line int
	tag  string
	text string
}

var fence = regexp.MustCompile("^(\\s*)(```+)\\s*(\\S*)\\s*$")

// documents returns README.md and docs/*.md, whose snippets are checked.
func documents(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("docs/*.md")
	if err != nil || len(docs) < 5 {
		t.Fatalf("docs/*.md: %d found, %v", len(docs), err)
	}
	return append([]string{"README.md"}, docs...)
}

// splitREADME returns the fenced blocks of a document and its prose with
// the blocks blanked out (line numbers kept).
func splitREADME(t *testing.T, file, readme string) ([]readmeBlock, string) {
	t.Helper()
	var blocks []readmeBlock
	var prose []string
	lines := strings.Split(readme, "\n")
	for i := 0; i < len(lines); i++ {
		m := fence.FindStringSubmatch(lines[i])
		if m == nil {
			prose = append(prose, lines[i])
			continue
		}
		indent, ticks, tag := m[1], m[2], m[3]
		b := readmeBlock{file: file, line: i + 1, tag: tag}
		prose = append(prose, "")
		var body []string
		for i++; ; i++ {
			if i == len(lines) {
				t.Fatalf("%s:%d: the fenced block never closes", file, b.line)
			}
			prose = append(prose, "")
			if strings.TrimSpace(lines[i]) == ticks {
				break
			}
			body = append(body, strings.TrimPrefix(lines[i], indent))
		}
		b.text = strings.Join(body, "\n") + "\n"
		blocks = append(blocks, b)
	}
	return blocks, strings.Join(prose, "\n")
}

// syntaxOptions returns the option names listed in the grammar block.
func syntaxOptions(t *testing.T, blocks []readmeBlock) []string {
	t.Helper()
	var opts []string
	for _, b := range blocks {
		if b.tag != "caddyfile-syntax" {
			continue
		}
		for _, l := range strings.Split(b.text, "\n")[1:] {
			if f := strings.Fields(l); len(f) > 0 && f[0] != "}" {
				opts = append(opts, f[0])
			}
		}
	}
	if len(opts) == 0 {
		t.Fatal("no document has a caddyfile-syntax block listing the directive's options")
	}
	return opts
}

func indent(text, prefix string) string {
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "\n") + "\n"
}

func inSite(directives string) string {
	return "example.com {\n" + indent(directives, "\t") + "}\n"
}

var inlineCode = regexp.MustCompile("`([^`]+)`")

// document is one document split into its fenced blocks and its prose.
type document struct {
	file   string
	blocks []readmeBlock
	prose  string
}

// readDocuments reads and splits every document.
func readDocuments(t *testing.T) []document {
	t.Helper()
	var docs []document
	for _, file := range documents(t) {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		blocks, prose := splitREADME(t, file, string(raw))
		docs = append(docs, document{file: file, blocks: blocks, prose: prose})
	}
	return docs
}

// readmeSnippets extracts every Caddyfile snippet of the documents by the
// rules at the top of this file.
func readmeSnippets(t *testing.T) []snippet {
	t.Helper()
	docs := readDocuments(t)
	var all []readmeBlock
	for _, d := range docs {
		all = append(all, d.blocks...)
	}
	options := map[string]bool{}
	for _, o := range syntaxOptions(t, all) {
		options[o] = true
	}
	var out []snippet
	for _, d := range docs {
		out = append(out, documentSnippets(t, d, options)...)
	}
	return out
}

// documentSnippets extracts the snippets of one document.
func documentSnippets(t *testing.T, d document, options map[string]bool) []snippet {
	t.Helper()
	var out []snippet
	for _, b := range d.blocks {
		s := snippet{file: d.file, line: b.line, kind: b.tag, text: b.text}
		switch b.tag {
		case "caddyfile":
			s.caddyfile = b.text
		case "caddyfile-fragment":
			s.caddyfile = inSite(b.text)
		case "json":
			s.json = readmeJSONConfig(t, b)
			if s.json == nil {
				continue
			}
		case "go":
			checkGoBlock(t, d.file, b.line, b.text)
			continue
		case "caddyfile-syntax", "sh", "yaml", "caddyfile-layer4", "packages":
			continue
		default:
			t.Errorf("%s:%d: fenced block tagged %q: tag it caddyfile, caddyfile-fragment, caddyfile-syntax, caddyfile-layer4, json, go, packages, sh or yaml (see readme_test.go)", d.file, b.line, b.tag)
			continue
		}
		out = append(out, s)
	}

	handlerFields := handlerJSONFields()
	prose := d.prose
	for _, m := range inlineCode.FindAllStringSubmatchIndex(prose, -1) {
		text := strings.Join(strings.Fields(prose[m[2]:m[3]]), " ")
		words := strings.Fields(text)
		if len(words) < 2 {
			continue
		}
		s := snippet{file: d.file, line: 1 + strings.Count(prose[:m[0]], "\n"), kind: "inline", text: text}
		switch {
		case words[0] == "inflight":
			s.caddyfile = inSite(text)
		case options[words[0]]:
			s.caddyfile = inSite("inflight {\n\tlimit snippet {client_ip} 1000\n\t" + text + "\n}")
		case handlerFields[strings.TrimSuffix(words[0], ":")]:
			s.kind = "inline json"
			s.json = []byte(`{"apps": {"http": {"servers": {"readme": {"listen": ["127.0.0.1:0"], "routes": [{"handle": [{"handler": "inflight", "limits": [{"name": "snippet", "max": 1000}], ` + text + `}]}]}}}}}`)
		default:
			continue
		}
		out = append(out, s)
	}
	return out
}

// handlerJSONFields returns the handler's JSON field names, quoted.
func handlerJSONFields() map[string]bool {
	fields := map[string]bool{}
	ht := reflect.TypeFor[inflight.Handler]()
	for i := range ht.NumField() {
		if name, _, _ := strings.Cut(ht.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			fields[`"`+name+`"`] = true
		}
	}
	return fields
}

// readmeJSONConfig returns a json block as a config to validate: a whole
// config as is, a handler in a route; nil for other JSON.
func readmeJSONConfig(t *testing.T, b readmeBlock) []byte {
	t.Helper()
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(b.text), &fields); err != nil {
		t.Errorf("%s:%d: json block does not parse: %v\n%s", b.file, b.line, err, b.text)
		return nil
	}
	switch {
	case fields["apps"] != nil:
		return []byte(b.text)
	case fields["handler"] != nil:
		return []byte(`{"apps": {"http": {"servers": {"readme": {"listen": ["127.0.0.1:0"], "routes": [{"handle": [` + b.text + `]}]}}}}}`)
	}
	return nil
}

// TestREADMESnippets adapts every Caddyfile snippet of the documents.
func TestREADMESnippets(t *testing.T) {
	snippets := readmeSnippets(t)
	inline := 0
	for _, s := range snippets {
		if s.kind == "inline" {
			inline++
		}
		if s.json != nil {
			if !json.Valid(s.json) {
				t.Errorf("%s: %s snippet is not JSON:\n%s", s.where(), s.kind, s.text)
			}
			continue
		}
		_, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(s.caddyfile), nil)
		if err != nil {
			t.Errorf("%s: %s snippet does not adapt: %v\n%s", s.where(), s.kind, err, s.text)
			continue
		}
		for _, w := range warnings {
			t.Errorf("%s: %s snippet: warning: %s\n%s", s.where(), s.kind, w.String(), s.text)
		}
	}
	// A floor, so that a broken extraction cannot pass by finding nothing.
	if len(snippets)-inline < 8 || inline < 10 {
		t.Fatalf("found %d fenced and %d inline snippets: the extraction is broken", len(snippets)-inline, inline)
	}
	t.Logf("adapted %d fenced and %d inline snippets", len(snippets)-inline, inline)
}

// TestREADMESyntaxOptionsExist checks that every option the documented
// grammar lists is one the directive accepts.
func TestREADMESyntaxOptionsExist(t *testing.T) {
	var blocks []readmeBlock
	for _, d := range readDocuments(t) {
		blocks = append(blocks, d.blocks...)
	}
	for _, opt := range syntaxOptions(t, blocks) {
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(inSite("inflight 1 {\n\t"+opt+"\n}")), nil)
		if err != nil && strings.Contains(err.Error(), "unknown subdirective") {
			t.Errorf("the README's grammar lists %q, which the directive does not know: %v", opt, err)
		}
	}
}

// rateLimitStandIn takes caddy-ratelimit's place in the README's rate_limit
// snippet: it accepts any block and does nothing.
type rateLimitStandIn struct{}

func (rateLimitStandIn) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.rate_limit", New: func() caddy.Module { return new(rateLimitStandIn) }}
}

func (rateLimitStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	return next.ServeHTTP(w, r)
}

func init() {
	caddy.RegisterModule(rateLimitStandIn{})
	httpcaddyfile.RegisterHandlerDirective("rate_limit", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		for h.Next() { // the whole segment, block included
		}
		return new(rateLimitStandIn), nil
	})
	// As caddy-ratelimit does itself (caddyfile.go, since July 2024).
	httpcaddyfile.RegisterDirectiveOrder("rate_limit", httpcaddyfile.Before, "basic_auth")
}

// TestLivePagePasswordMatchesItsHash: each document whose live-page example
// puts basic_auth in front of the page says the example's password, and
// the hash in the example is that password's, as Caddy's basic_auth
// compares it (bcrypt).
func TestLivePagePasswordMatchesItsHash(t *testing.T) {
	said := regexp.MustCompile("its password is `([^`]+)`")
	hashed := regexp.MustCompile(`(?m)^\t\tadmin (\$2a\$\S+)$`)
	compared := map[string]bool{}
	for _, doc := range []string{"README.md", "docs/observability.md"} {
		raw, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		password, hash := said.FindSubmatch(raw), hashed.FindSubmatch(raw)
		if password == nil || hash == nil {
			t.Errorf("%s: the live page's example says its password %q, hash %q: want both", doc, password, hash)
			continue
		}
		if compared[string(hash[1])+" "+string(password[1])] {
			continue // the same example: compared once
		}
		compared[string(hash[1])+" "+string(password[1])] = true
		if ok, err := (caddyauth.BcryptHash{}).Compare(hash[1], password[1]); !ok || err != nil {
			t.Errorf("%s: the hash %s is not that of the password %q the document gives (%v)", doc, hash[1], password[1], err)
		}
	}
}
