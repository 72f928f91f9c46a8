package reporules

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/better-compute/better-compute"

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	return root
}

// goPackages maps each package directory (relative, excluding generated code
// and tools) to its parsed non-test files.
func goPackages(t *testing.T) map[string][]*ast.File {
	t.Helper()
	root := repoRoot(t)
	fset := token.NewFileSet()
	pkgs := map[string][]*ast.File{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch rel {
			case "gen", "tools", "bin", ".git", ".better-compute":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		pkgs[filepath.Dir(rel)] = append(pkgs[filepath.Dir(rel)], f)
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, pkgs)
	return pkgs
}

func TestEveryPackageHasADocComment(t *testing.T) {
	t.Parallel()
	for dir, files := range goPackages(t) {
		documented := false
		for _, f := range files {
			if f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "" {
				documented = true
			}
		}
		require.True(t, documented, "package %s has no doc comment (say what it is for and what it must never do)", dir)
	}
}

// clockRE matches SQL that reads the database's own clock.
var clockRE = regexp.MustCompile(`(?i)\b(now\s*\(\s*\)|current_timestamp|current_date|current_time|localtimestamp|localtime|statement_timestamp|clock_timestamp|transaction_timestamp|datetime\s*\(\s*'now'|strftime\s*\([^)]*'now'|julianday\s*\(\s*'now')`)

func TestSQLReadsTimeOnlyThroughComputeNow(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	var offenders []string
	// .sql files: every line but the one that defines compute_now itself.
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".sql") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			code, _, _ := strings.Cut(line, "--")
			if strings.Contains(line, "-- clock-source") {
				continue
			}
			if clockRE.MatchString(code) {
				offenders = append(offenders, filepath.Base(path)+":"+strconv.Itoa(i+1)+": "+strings.TrimSpace(line))
			}
		}
		return nil
	})
	require.NoError(t, err)
	// Go string literals: where module SQL lives.
	for dir, files := range goPackages(t) {
		for _, f := range files {
			ast.Inspect(f, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				s, err := strconv.Unquote(lit.Value)
				if err == nil && clockRE.MatchString(s) {
					offenders = append(offenders, dir+": "+s)
				}
				return true
			})
		}
	}
	require.Empty(t, offenders, "SQL must read time through compute_now(), so one settable clock drives the whole system")
}

func TestSQLRuleCatchesOffenders(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"SELECT now()", "WHERE t < CURRENT_TIMESTAMP", "datetime('now')", "strftime('%s', 'now')", "statement_timestamp()"} {
		require.True(t, clockRE.MatchString(bad), bad)
	}
	for _, good := range []string{"SELECT compute_now()", "expire_time > compute_now()", "WHERE known_time > $1"} {
		require.False(t, clockRE.MatchString(good), good)
	}
}

// layer ranks packages: a package may import only packages of a lower
// layer or its own module's subpackages.
func layer(pkg string) int {
	switch {
	case strings.HasPrefix(pkg, "cmd/"), strings.HasPrefix(pkg, "bench/"):
		return 7
	case pkg == "internal/cli":
		return 6
	case pkg == "internal/devrig":
		return 5 // dev's process: serve's pieces plus the simulated fleet and machines
	case pkg == "internal/server":
		return 4 // the serve process: wires an app from options; no command tree
	case pkg == "internal/app":
		return 3
	case pkg == "internal/clock", strings.HasPrefix(pkg, "internal/tracing"), strings.HasPrefix(pkg, "gen/"):
		return -1
	case strings.HasPrefix(pkg, "internal/store"), pkg == "internal/iam":
		return 0
	case pkg == "internal/envelope", pkg == "internal/jobs", pkg == "client":
		return 1
	case strings.HasPrefix(pkg, "bctest"):
		return 8 // the test kit may reach everything; nothing may import it
	default:
		return 2 // modules
	}
}

// capacityRank orders the capacity packages that must import one way: the
// leaves (shared types and pure or single-table packages), then the atoms
// reconciler, the pool's placer, and the reservation API and lifecycle. It
// is -1 for packages outside that chain.
func capacityRank(pkg string) int {
	switch pkg {
	case "internal/capacity/capmodel", "internal/capacity/placement", "internal/capacity/booking",
		"internal/capacity/pool", "internal/capacity/quota", "internal/capacity/gpumodel":
		return 0
	case "internal/capacity/atoms":
		return 1
	case "internal/capacity/placer":
		return 2
	case "internal/capacity/reservation":
		return 3
	}
	return -1
}

func TestDependencyDirection(t *testing.T) {
	t.Parallel()
	for dir, files := range goPackages(t) {
		from := filepath.ToSlash(dir)
		for _, f := range files {
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				to, ok := strings.CutPrefix(path, module+"/")
				if !ok {
					continue
				}
				if rf, rt := capacityRank(from), capacityRank(to); rf >= 0 && rt >= 0 {
					require.LessOrEqual(t, rt, rf, "%s must not import %s: capacity imports one way, capmodel/placement/booking/pool/quota/gpumodel → atoms → placer → reservation", from, to)
					require.False(t, from == "internal/capacity/capmodel", "capmodel is the capacity leaf; it imports %s", to)
				}
				switch {
				case strings.HasPrefix(to, "bctest"):
					// Only the test kit itself, and dev's rig, whose --sim-nodes
					// and --sim-machines run the kit's FleetSim and SimSite by
					// design.
					require.True(t, strings.HasPrefix(from, "bctest") || from == "internal/devrig", "%s imports the test kit %s", from, to)
				case strings.HasPrefix(to, "internal/store") && strings.HasPrefix(from, "internal/store"):
					// A dialect and the store core belong together.
				case layer(to) == layer(from) && layer(from) == 2:
					// Modules may use each other's exported lookups (tenancy),
					// but never a program or the wiring.
				default:
					require.Less(t, layer(to), layer(from), "%s (layer %d) must not import %s (layer %d): cmd → cli → devrig → server → app → modules → store/iam/clock", from, layer(from), to, layer(to))
				}
			}
		}
	}
}

// sqlRE matches a string literal that is a SQL statement.
var sqlRE = regexp.MustCompile(`(?s)^\s*(SELECT|INSERT|UPDATE|DELETE|SAVEPOINT|ROLLBACK|RELEASE|LOCK)\s`)

// TestSQLOnlyInStoreFiles: every module keeps its SQL in store.go,
// store_*.go or *_store.go files, so a reader finds every statement of a
// package in one place and the logic files read as logic. internal/store
// (the store layer itself: dialects, migrations) is the exception.
func TestSQLOnlyInStoreFiles(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	fset := token.NewFileSet()
	var offenders []string
	err := filepath.WalkDir(filepath.Join(root, "internal"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == filepath.Join(root, "internal", "store") || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		if !strings.HasSuffix(name, ".go") || name == "store.go" || strings.HasPrefix(name, "store_") ||
			strings.HasSuffix(name, "_store.go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			if s, err := strconv.Unquote(lit.Value); err == nil && sqlRE.MatchString(s) {
				offenders = append(offenders, fset.Position(lit.Pos()).String())
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, offenders, "SQL belongs in store.go, store_*.go or *_store.go")
}

func TestStoreFileRuleCatchesOffenders(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"SELECT id FROM atoms", "\n\t\tINSERT INTO x VALUES ($1)", "SAVEPOINT place", "DELETE FROM bookings"} {
		require.True(t, sqlRE.MatchString(bad), bad)
	}
	for _, good := range []string{"select a node", "delete the rows", "pool %s would share %s", "Selected"} {
		require.False(t, sqlRE.MatchString(good), good)
	}
}
