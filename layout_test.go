package caddyinflight_test

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// layoutDoc is where the package graph is drawn, in its one block tagged
// packages: a line per package, from the bottom layer up, each with what
// it imports of the module after an arrow.
const layoutDoc = "docs/design.md"

// module is the module's path, which go list prefixes its packages with.
const module = "github.com/caddy-inflight/caddy-inflight"

// TestPackageGraphMatchesDesign: the package graph docs/design.md draws is
// the one `go list` reads from the code, in this module and in layer4's,
// and it is layered: every package imports only packages listed before
// it, the layers below it, so none imports one above it. Commands
// (examples, layer4/caddy) and the integration tests are left out.
func TestPackageGraphMatchesDesign(t *testing.T) {
	drawn, order := drawnGraph(t)
	listed := listedGraph(t, ".")
	for pkg, imports := range listedGraph(t, "layer4") {
		listed[pkg] = imports
	}
	for _, pkg := range slices.Sorted(maps.Keys(listed)) {
		imports, ok := drawn[pkg]
		switch {
		case !ok:
			t.Errorf("%s: package %s (imports %v) is not drawn", layoutDoc, pkg, listed[pkg])
		case !slices.Equal(imports, listed[pkg]):
			t.Errorf("%s: %s is drawn importing %v; go list says %v", layoutDoc, pkg, imports, listed[pkg])
		}
	}
	for pkg := range drawn {
		if _, ok := listed[pkg]; !ok {
			t.Errorf("%s: %s is drawn, but go list has no such package", layoutDoc, pkg)
		}
	}
	for i, pkg := range order {
		for _, imp := range listed[pkg] {
			if !slices.Contains(order[:i], imp) {
				t.Errorf("%s: %s imports %s, which is not listed before it: a package imports only the layers below it", layoutDoc, pkg, imp)
			}
		}
	}
}

// drawnGraph reads the packages block of layoutDoc: each package's
// imports, sorted, and the packages in the order drawn.
func drawnGraph(t *testing.T) (map[string][]string, []string) {
	t.Helper()
	raw, err := os.ReadFile(layoutDoc)
	if err != nil {
		t.Fatal(err)
	}
	blocks, _ := splitREADME(t, layoutDoc, string(raw))
	var text string
	found := 0
	for _, b := range blocks {
		if b.tag == "packages" {
			text, found = b.text, found+1
		}
	}
	if found != 1 {
		t.Fatalf("%s has %d blocks tagged packages, want one", layoutDoc, found)
	}
	graph := map[string][]string{}
	var order []string
	for line := range strings.Lines(text) {
		pkg, imports, _ := strings.Cut(line, "→")
		pkg = strings.TrimSpace(pkg)
		if pkg == "" {
			continue
		}
		if _, dup := graph[pkg]; dup {
			t.Errorf("%s: %s is drawn twice", layoutDoc, pkg)
		}
		graph[pkg] = slices.Sorted(slices.Values(strings.Fields(imports)))
		order = append(order, pkg)
	}
	return graph, order
}

// listedGraph runs go list in dir and returns, for each package but
// commands and integration tests, what it imports of the module (test
// files aside), relative to the module's path ("." for its root).
func listedGraph(t *testing.T, dir string) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", "{{.Name}} {{.ImportPath}} {{join .Imports \" \"}}", "./...")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list in %s: %v", dir, err)
	}
	graph := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		name, pkg := fields[0], relative(fields[1])
		if name == "main" || slices.Contains(strings.Split(pkg, "/"), "integration") {
			continue
		}
		imports := []string{}
		for _, imp := range fields[2:] {
			if imp == module || strings.HasPrefix(imp, module+"/") {
				imports = append(imports, relative(imp))
			}
		}
		slices.Sort(imports)
		graph[pkg] = imports
	}
	if len(graph) == 0 {
		t.Fatalf("go list in %s lists no package:\n%s", dir, out)
	}
	return graph
}

// relative returns a package's path within the module.
func relative(pkg string) string {
	if pkg == module {
		return "."
	}
	if rel, ok := strings.CutPrefix(pkg, module+"/"); ok {
		return rel
	}
	panic(fmt.Sprintf("package %s is not in %s", pkg, module))
}
