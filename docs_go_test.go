package caddyinflight_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// goDeclaredIn are the packages whose types the documents' go blocks
// show: the engine's and the fleet calls' (docs/design.md shows the
// Ledger interface and the calls a zone makes). No two of them declare a
// type of the same name, so a block's unqualified type is one of them.
var goDeclaredIn = []string{"inflight/limiter", "inflight/fleet"}

// checkGoBlock checks a fenced block tagged go: it must parse as Go
// declarations, and each type it shows must exist in goDeclaredIn with
// every field and method the block names, so the docs cannot drift from
// the code.
func checkGoBlock(t *testing.T, file string, line int, text string) {
	t.Helper()
	doc, err := parser.ParseFile(token.NewFileSet(), file, "package doc\n"+text, 0)
	if err != nil {
		t.Errorf("%s:%d: go block does not parse: %v", file, line, err)
		return
	}
	code := declaredMembers(t)
	for name, members := range typeMembers(doc) {
		have, ok := code[name]
		if !ok {
			t.Errorf("%s:%d: go block shows type %s, which none of %v declares", file, line, name, goDeclaredIn)
			continue
		}
		for m := range members {
			if !have[m] {
				t.Errorf("%s:%d: go block shows %s.%s, which %s lacks", file, line, name, m, name)
			}
		}
	}
}

// declaredMembers returns the types of the goDeclaredIn packages (test
// files left out) and the fields and methods each declares.
func declaredMembers(t *testing.T) map[string]map[string]bool {
	t.Helper()
	out := map[string]map[string]bool{}
	from := map[string]string{} // type name → its package
	for _, pkg := range goDeclaredIn {
		paths, err := filepath.Glob(filepath.Join(pkg, "*.go"))
		if err != nil || len(paths) == 0 {
			t.Fatalf("no Go files in %s: %v", pkg, err)
		}
		for _, p := range paths {
			if strings.HasSuffix(p, "_test.go") {
				continue
			}
			src, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			f, err := parser.ParseFile(token.NewFileSet(), p, src, 0)
			if err != nil {
				t.Fatal(err)
			}
			for name, members := range typeMembers(f) {
				if other, ok := from[name]; ok && other != pkg {
					t.Fatalf("type %s is declared in %s and in %s: a go block could not say which it shows", name, other, pkg)
				}
				out[name], from[name] = members, pkg
			}
		}
	}
	return out
}

// typeMembers returns the struct and interface types of f and the names of
// their fields and methods.
func typeMembers(f *ast.File) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok {
			return true
		}
		members := map[string]bool{}
		var fields *ast.FieldList
		switch typ := ts.Type.(type) {
		case *ast.StructType:
			fields = typ.Fields
		case *ast.InterfaceType:
			fields = typ.Methods
		}
		if fields != nil {
			for _, fld := range fields.List {
				for _, id := range fld.Names {
					members[id.Name] = true
				}
			}
		}
		out[ts.Name.Name] = members
		return false
	})
	return out
}
