package caddyinflight_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// TestHTTPEdgeGoesThroughTheGate: the HTTP edge (inflight, test files
// aside) reaches the engine's state only through the Gate's own methods.
// No expression of its code is one of the engine's zone, its adaptive
// controller or its compiled caps: it names none of them, gets none back
// from a call, and reads no field or method of one. (It may use the
// engine's vocabulary: outcomes, results, TotalDim, MaxCost.)
func TestHTTPEdgeGoesThroughTheGate(t *testing.T) {
	engine := module + "/inflight/limiter"
	hidden := []string{"Zone", "Adaptive", "Limits"}
	fset, info := typeCheck(t, module+"/inflight")
	var found []string
	for expr, tv := range info.Types {
		typ := tv.Type
		if p, ok := typ.(*types.Pointer); ok {
			typ = p.Elem()
		}
		named, ok := typ.(*types.Named)
		if !ok || named.Obj().Pkg() == nil || named.Obj().Pkg().Path() != engine || !slices.Contains(hidden, named.Obj().Name()) {
			continue
		}
		found = append(found, fmt.Sprintf("%s: %s is a limiter.%s", fset.Position(expr.Pos()), types.ExprString(expr), named.Obj().Name()))
	}
	slices.Sort(found)
	for _, f := range found {
		t.Errorf("%s: the HTTP edge reaches around the Gate: ask one of the Gate's methods", f)
	}
}

// typeCheck type-checks a package of the module, test files aside, against
// its dependencies' export data as go list builds it.
func typeCheck(t *testing.T, path string) (*token.FileSet, *types.Info) {
	t.Helper()
	out, err := exec.Command("go", "list", "-export", "-deps", "-json=ImportPath,Export,Dir,GoFiles", path).Output()
	if err != nil {
		t.Fatalf("go list -export %s: %v", path, err)
	}
	type listed struct {
		ImportPath, Export, Dir string
		GoFiles                 []string
	}
	exports := map[string]string{}
	var self listed
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		exports[p.ImportPath] = p.Export
		if p.ImportPath == path {
			self = p
		}
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range self.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(self.Dir, name), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	lookup := func(path string) (io.ReadCloser, error) { return os.Open(exports[path]) }
	conf := types.Config{Importer: importer.ForCompiler(fset, "gc", lookup)}
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}}
	if _, err := conf.Check(path, fset, files, info); err != nil {
		t.Fatalf("type-checking %s: %v", path, err)
	}
	return fset, info
}
