package caddyinflight_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// markdownLink is a link or an image in a document's prose: its target,
// then an optional title.
var markdownLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// headingAnchors returns the anchors GitHub gives a document's headings:
// the heading's text lowercased, without links' targets and without
// characters other than letters, digits, '_', '-' and spaces, spaces made
// '-'; a repeated anchor gets -1, -2, ...
func headingAnchors(prose string) map[string]bool {
	heading := regexp.MustCompile(`(?m)^#{1,6}[ \t]+(.+?)[ \t#]*$`)
	linkText := regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	dropped := regexp.MustCompile(`[^\p{L}\p{M}\p{N}\p{Pc} -]`)
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(prose, -1) {
		text := linkText.ReplaceAllString(m[1], "$1")
		slug := strings.ReplaceAll(dropped.ReplaceAllString(strings.ToLower(text), ""), " ", "-")
		if n := seen[slug]; n > 0 {
			anchors[slug+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}

// TestDocumentLinksResolve: every relative link of README.md and
// docs/*.md (outside code) names a file or directory of the repository,
// and its #anchor, if any, a heading of the document it names.
func TestDocumentLinksResolve(t *testing.T) {
	docs := readDocuments(t)
	anchors := map[string]map[string]bool{}
	for _, d := range docs {
		anchors[filepath.Clean(d.file)] = headingAnchors(d.prose)
	}
	checked := 0
	for _, d := range docs {
		prose := inlineCode.ReplaceAllStringFunc(d.prose, func(code string) string {
			return strings.Repeat(" ", len(code)) // links inside code are not links
		})
		for _, m := range markdownLink.FindAllStringSubmatchIndex(prose, -1) {
			target := prose[m[2]:m[3]]
			line := 1 + strings.Count(prose[:m[0]], "\n")
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(target, "#")
			file := filepath.Clean(d.file)
			if path != "" {
				file = filepath.Join(filepath.Dir(d.file), path)
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s:%d: link %q: %s does not exist", d.file, line, target, file)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			known, ok := anchors[file]
			if !ok {
				t.Errorf("%s:%d: link %q: an anchor into %s, which is not a document whose headings are known", d.file, line, target, file)
				continue
			}
			if !known[anchor] {
				t.Errorf("%s:%d: link %q: %s has no heading whose anchor is #%s", d.file, line, target, file, anchor)
			}
		}
	}
	// A floor, so that a broken extraction cannot pass by finding nothing.
	if checked < 50 {
		t.Fatalf("checked %d relative links: the extraction is broken", checked)
	}
	t.Logf("checked %d relative links", checked)
}
