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
				case strings.HasPrefix(from, "bench/") && to == "bench/fleetload":
					// The benchmarks' shared synthetic fleet loader (the
					// health simulation's tests use it too).
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

// tableRefRE finds the tables a SQL text reads or writes. Keywords are upper
// case and table names lower case, as everywhere in this repository's SQL,
// so prose ("copied from nodes") does not match.
var tableRefRE = regexp.MustCompile(`\b(FROM|JOIN|INTO|UPDATE|REFERENCES|ALTER TABLE)\s+(?:IF EXISTS\s+|ONLY\s+)?([a-z_][a-z0-9_]*)\b`)

// createTableRE finds the tables a migration creates.
var createTableRE = regexp.MustCompile(`(?i)\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?([a-z_][a-z0-9_]*)`)

// moduleOf is the module a path under internal/ belongs to: its top-level
// directory (internal/capacity/atoms is capacity), or "" outside internal/.
func moduleOf(rel string) string {
	parts := strings.Split(filepath.ToSlash(rel), "/")
	if len(parts) < 3 || parts[0] != "internal" {
		return ""
	}
	switch parts[1] {
	case "gateway":
		// The gateway is fleet's session half (the agent end of the same
		// nodes); it owns no tables and works on fleet's.
		return "fleet"
	}
	return parts[1]
}

// tableOwners maps every table a migration creates to the module that owns
// it, from the migrations' .sql files, which each package's Migrations()
// embeds.
func tableOwners(t *testing.T, root string) map[string]string {
	t.Helper()
	owners := map[string]string{}
	err := filepath.WalkDir(filepath.Join(root, "internal"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".sql") {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if !strings.Contains(filepath.ToSlash(rel), "/migrations/") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		mod := moduleOf(rel)
		for _, m := range createTableRE.FindAllStringSubmatch(stripSQLComments(string(b)), -1) {
			if prev, ok := owners[m[1]]; ok && prev != mod {
				t.Errorf("table %s is created by both %s and %s (%s)", m[1], prev, mod, rel)
			}
			owners[m[1]] = mod
		}
		return nil
	})
	require.NoError(t, err)
	return owners
}

// stripSQLComments drops -- comments, which may name anything.
func stripSQLComments(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i], _, _ = strings.Cut(l, "--")
	}
	return strings.Join(lines, "\n")
}

// foreignRef is a statement's use of another module's table.
type foreignRef struct{ keyword, table, owner string }

func (r foreignRef) String() string { return r.keyword + " " + r.table + " (owned by " + r.owner + ")" }

// foreignTables lists the tables that sql, written in module mod, names
// although another module owns them. migration is true for a migration's
// own SQL, where a REFERENCES (a foreign key) to another module's table is
// allowed: the database checks the key, and no code reads the other table.
func foreignTables(owners map[string]string, mod, sql string, migration bool) []foreignRef {
	var out []foreignRef
	for _, m := range tableRefRE.FindAllStringSubmatch(sql, -1) {
		owner, ok := owners[m[2]]
		if !ok || owner == mod || (migration && m[1] == "REFERENCES") {
			continue
		}
		out = append(out, foreignRef{keyword: m[1], table: m[2], owner: owner})
	}
	return out
}

// foreignTableDebt lists, by file and table, the statements that still name
// another module's table, each with why it is not yet moved (issue 21,
// item 12: fleet's tables are done; these are the second half). The test
// fails when an entry is no longer needed, so the list only shrinks.
var foreignTableDebt = map[string]string{
	"internal/capacity/pool/store.go tenants":  "a pool row carries its owner's name (a subquery in every pool read)",
	"internal/capacity/views/store.go tenants": "per-consumer sums group by the tenant's name in one statement",
	"internal/fleet/store_nodes.go node_pools": "a node's member pool (Node.MemberPool); fleet cannot import capacity, which imports fleet",
	"internal/fleet/store_nodes.go pools":      "as node_pools",
	"internal/sandbox/store.go instances":      "a warm claim locks the sandbox row (SKIP LOCKED) only while its instance runs, in one statement",
	// Applied migrations are history: forward-only, never rewritten.
	"internal/vps/migrations/sqlite/0003_sealed_user_data.sql commands":   "drops sealed secrets from old instance.create commands",
	"internal/vps/migrations/postgres/0003_sealed_user_data.sql commands": "drops sealed secrets from old instance.create commands",
}

// TestTablesReadOnlyThroughTheirModule: a module reads and writes another
// module's tables only by calling that module's store functions, so a table's
// owner can change its shape knowing every statement over it. A module is
// the top-level directory under internal/; ownership comes from the
// migrations that create the tables. Test files are exempt (fixtures set up
// any table), and so is internal/store, the store layer itself. Known debt
// is listed in foreignTableDebt.
func TestTablesReadOnlyThroughTheirModule(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	owners := tableOwners(t, root)
	require.Contains(t, owners, "nodes", "no migration creates nodes: the ownership scan is broken")
	offenders, usedDebt := foreignTableUses(t, root, owners)
	require.Empty(t, offenders, "a module reads another's tables only through that module's store functions")
	for key := range foreignTableDebt {
		require.True(t, usedDebt[key], "foreignTableDebt lists %q, which no longer names that table: remove the entry", key)
	}
}

// foreignTableUses scans root's internal/ tree (migrations and Go string
// literals) for statements naming another module's table: the offenders,
// and the foreignTableDebt entries that excused one.
func foreignTableUses(t *testing.T, root string, owners map[string]string) (offenders []string, usedDebt map[string]bool) {
	t.Helper()
	usedDebt = map[string]bool{}
	report := func(rel, where string, refs []foreignRef) {
		for _, r := range refs {
			key := filepath.ToSlash(rel) + " " + r.table
			if _, ok := foreignTableDebt[key]; ok {
				usedDebt[key] = true
				continue
			}
			offenders = append(offenders, where+": "+r.String())
		}
	}
	fset := token.NewFileSet()
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
		rel, _ := filepath.Rel(root, path)
		mod := moduleOf(rel)
		switch {
		case strings.HasSuffix(path, ".sql"):
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			report(rel, rel, foreignTables(owners, mod, stripSQLComments(string(b)), true))
		case strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go"):
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			ast.Inspect(f, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					return true
				}
				report(rel, fset.Position(lit.Pos()).String(), foreignTables(owners, mod, s, false))
				return true
			})
		}
		return nil
	})
	require.NoError(t, err)
	return offenders, usedDebt
}

// TestTableRulePlantedOffender runs the whole scan over a small tree: a
// fleet migration, a capacity migration with a foreign key to it (allowed),
// and a capacity store file that reads fleet's table (caught).
func TestTableRulePlantedOffender(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	write := func(rel, text string) {
		path := filepath.Join(root, filepath.FromSlash(rel))
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
	}
	write("internal/fleet/migrations/sqlite/0001_fleet.sql", "CREATE TABLE nodes (id TEXT PRIMARY KEY);\n")
	write("internal/capacity/atoms/migrations/sqlite/0001_atoms.sql",
		"CREATE TABLE atoms (id TEXT PRIMARY KEY, node_id TEXT NOT NULL REFERENCES nodes(id));\n")
	write("internal/capacity/atoms/store.go", "package atoms\n\nconst q = `SELECT a.id FROM atoms a JOIN nodes n ON n.id = a.node_id`\n")
	write("internal/gateway/store.go", "package gateway\n\nconst q = `SELECT id FROM nodes`\n")
	owners := tableOwners(t, root)
	require.Equal(t, map[string]string{"nodes": "fleet", "atoms": "capacity"}, owners)
	offenders, _ := foreignTableUses(t, root, owners)
	require.Len(t, offenders, 1, "%v", offenders)
	require.Contains(t, offenders[0], "internal/capacity/atoms/store.go")
	require.Contains(t, offenders[0], "JOIN nodes (owned by fleet)")
}

func TestTableRuleCatchesOffenders(t *testing.T) {
	t.Parallel()
	owners := map[string]string{"nodes": "fleet", "gpus": "fleet", "atoms": "capacity"}
	for _, bad := range []string{
		"SELECT a.id FROM atoms a JOIN nodes n ON n.id = a.node_id",
		"SELECT id FROM gpus WHERE node_id = $1",
		"\n\t\tINSERT INTO nodes (id) VALUES ($1)",
		"UPDATE nodes SET state = $1",
		"DELETE FROM gpus WHERE node_id = $1",
		"CREATE TABLE x (node_id TEXT REFERENCES nodes(id))",
		"ALTER TABLE nodes ADD COLUMN pool TEXT",
	} {
		require.NotEmpty(t, foreignTables(owners, "capacity", bad, false), bad)
	}
	for _, good := range []string{
		"SELECT id FROM atoms WHERE node_id = $1",
		"copied from nodes",
		"INSERT INTO atoms (id) VALUES ($1) ON CONFLICT (id) DO UPDATE SET node_id = excluded.node_id",
		"SELECT id FROM nodes", // fleet's own
	} {
		mod := "capacity"
		if strings.Contains(good, "FROM nodes") {
			mod = "fleet"
		}
		require.Empty(t, foreignTables(owners, mod, good, false), good)
	}
	// A migration's foreign key to another module's table is allowed.
	require.Empty(t, foreignTables(owners, "capacity", "CREATE TABLE atoms (node_id TEXT NOT NULL REFERENCES nodes(id))", true))
	require.Equal(t, "capacity", moduleOf("internal/capacity/atoms/store.go"))
	require.Equal(t, "fleet", moduleOf("internal/gateway/session.go"))
}
