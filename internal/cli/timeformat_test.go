package cli

import (
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOneTimeFormat keeps every table and message on one time format: a
// time is written only through stamp/ts (output.go), never with a layout
// of its own, so no command drifts back to local time or another shape.
func TestOneTimeFormat(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := gotoken.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 1 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Format" {
				return true
			}
			if name == "output.go" {
				if id, ok := call.Args[0].(*ast.Ident); ok && id.Name == "timeFormat" {
					return true
				}
			}
			if isTimeLayout(call.Args[0]) {
				t.Errorf("%s: a time formatted with its own layout: use stamp or ts (output.go)", fset.Position(call.Pos()))
			}
			return true
		})
	}
}

// isTimeLayout reports whether e is a time layout: a time package constant
// or a literal with the reference year in it.
func isTimeLayout(e ast.Expr) bool {
	switch v := e.(type) {
	case *ast.BasicLit:
		return v.Kind == gotoken.STRING && (strings.Contains(v.Value, "2006") || strings.Contains(v.Value, "15:04"))
	case *ast.SelectorExpr:
		if x, ok := v.X.(*ast.Ident); ok && x.Name == "time" {
			return true
		}
	case *ast.Ident:
		return v.Name == "timeFormat"
	}
	return false
}

func TestStampIsUTC(t *testing.T) {
	at, err := time.Parse(time.RFC3339, "2026-12-05T04:00:00+02:00")
	if err != nil {
		t.Fatal(err)
	}
	ts := stamp(at)
	if ts != "2026-12-05T02:00:00Z" {
		t.Fatalf("stamp = %q, want the UTC time", ts)
	}
}
