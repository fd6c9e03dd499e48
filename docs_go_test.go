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

// goDeclaredIn is the package whose types the documents' go blocks show:
// the engine's (docs/design.md shows its Ledger interface).
const goDeclaredIn = "inflight/limiter"

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
			t.Errorf("%s:%d: go block shows type %s, which %s does not declare", file, line, name, goDeclaredIn)
			continue
		}
		for m := range members {
			if !have[m] {
				t.Errorf("%s:%d: go block shows %s.%s, which %s's %s lacks", file, line, name, m, goDeclaredIn, name)
			}
		}
	}
}

// declaredMembers returns the types of goDeclaredIn (test files left out)
// and the fields and methods each declares.
func declaredMembers(t *testing.T) map[string]map[string]bool {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(goDeclaredIn, "*.go"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no Go files in %s: %v", goDeclaredIn, err)
	}
	out := map[string]map[string]bool{}
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
			out[name] = members
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
