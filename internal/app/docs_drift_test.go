package app_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/internal/doctest"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/providers"
)

// procedureParts splits "/bettercompute.api.v1.TenantService/Create" into
// "TenantService" and "Create".
func procedureParts(p string) (service, method string) {
	full, method, _ := strings.Cut(strings.TrimPrefix(p, "/"), "/")
	return full[strings.LastIndex(full, ".")+1:], method
}

// TestDocsAPIListsEveryProcedure holds docs/api.md's services table to the
// catalog: every procedure with its action and kind, and no row for a
// procedure the API does not serve.
func TestDocsAPIListsEveryProcedure(t *testing.T) {
	t.Parallel()
	type key struct{ service, method string }
	type row struct{ action, kind string }
	documented := map[key]row{}
	service := ""
	for _, cells := range doctest.Table(t, doctest.Read(t, "docs/api.md"), "| service | method | action | kind |") {
		if len(cells) != 4 {
			t.Fatalf("docs/api.md services table: row %q does not have 4 cells", cells)
		}
		if s := doctest.Code(cells[0]); len(s) > 0 {
			service = s[0]
		}
		for _, m := range doctest.Code(cells[1]) {
			documented[key{service, m}] = row{cells[2], cells[3]}
		}
	}
	served := map[key]bool{}
	for _, m := range envelope.Catalog() {
		svc, method := procedureParts(m.Procedure)
		served[key{svc, method}] = true
		got, ok := documented[key{svc, method}]
		if !ok {
			t.Errorf("docs/api.md: %s.%s is missing from the services table", svc, method)
			continue
		}
		if m.Action != "" && !slices.Contains(doctest.Code(got.action), m.Action) {
			t.Errorf("docs/api.md: %s.%s should name the action %q, has %q", svc, method, m.Action, got.action)
		}
		var want string
		switch m.Kind {
		case envelope.KindMutation:
			want = "mutation"
		case envelope.KindRead:
			want = "read"
		case envelope.KindSelf:
			want = "authentication only"
		}
		if !strings.Contains(got.kind, want) {
			t.Errorf("docs/api.md: %s.%s is a %s, the table says %q", svc, method, want, got.kind)
		}
		if m.Create != strings.Contains(got.kind, "idempotent create") {
			t.Errorf("docs/api.md: %s.%s idempotent create is %v, the table says %q", svc, method, m.Create, got.kind)
		}
	}
	for k := range documented {
		if !served[k] {
			t.Errorf("docs/api.md lists %s.%s, which the API does not serve", k.service, k.method)
		}
	}
}

// TestDocsAPIListsEveryErrorCode holds the error table to the machine codes
// and the Connect code each travels as.
func TestDocsAPIListsEveryErrorCode(t *testing.T) {
	t.Parallel()
	documented := map[string]string{}
	for _, cells := range doctest.Table(t, doctest.Read(t, "docs/api.md"), "| machine code | Connect code (HTTP) | when |") {
		if c := doctest.Code(cells[0]); len(c) == 1 {
			documented[c[0]] = cells[1]
		}
	}
	for code, cc := range envelope.Codes() {
		cell, ok := documented[string(code)]
		if !ok {
			t.Errorf("docs/api.md: machine code %s is missing from the error table", code)
			continue
		}
		if !slices.Contains(doctest.Code(cell), cc.String()) {
			t.Errorf("docs/api.md: %s travels as %s, the table says %q", code, cc, cell)
		}
	}
	for code := range documented {
		if _, ok := envelope.Codes()[envelope.Code(code)]; !ok {
			t.Errorf("docs/api.md lists machine code %s, which the API never sends", code)
		}
	}
}

// TestDocsIAMRoleTable holds docs/iam.md's role table to the catalog (every
// action is in it) and to the authorization matrix (what each role gets on
// each mutation is what the table says).
func TestDocsIAMRoleTable(t *testing.T) {
	t.Parallel()
	rows := doctest.Table(t, doctest.Read(t, "docs/iam.md"), "| action | platform-admin | admin | member | operator | viewer | agent |")
	marks := map[string][]string{}
	for _, cells := range rows {
		if len(cells) != 1+len(matrixPrincipals) {
			t.Fatalf("docs/iam.md role table: row %q does not have %d cells", cells, 1+len(matrixPrincipals))
		}
		for _, a := range doctest.Code(cells[0]) {
			if _, dup := marks[a]; dup {
				t.Errorf("docs/iam.md role table names %s twice", a)
			}
			marks[a] = cells[1:]
		}
	}
	for _, m := range envelope.Catalog() {
		if m.Action != "" && marks[m.Action] == nil {
			t.Errorf("docs/iam.md: action %s is missing from the role table", m.Action)
		}
	}
	for action, want := range matrixExpect {
		got := marks[action]
		if got == nil {
			continue // reported above
		}
		for i, role := range matrixPrincipals {
			mark := got[i]
			var says string
			switch {
			case strings.HasPrefix(mark, "✓ quorum"):
				// Authorized, then sent to a command batch: the matrix's
				// tenant has approvers.
				says = "QUORUM_REQUIRED"
			case strings.HasPrefix(mark, "✓ if"):
				continue // conditional on the principal's kind: TestAuthzMatrix covers it
			case strings.HasPrefix(mark, "✓"):
				says = "OK"
			case strings.HasPrefix(mark, "—"):
				says = "PERMISSION_DENIED"
			case strings.HasPrefix(mark, "confirmation"):
				says = "CONFIRMATION_REQUIRED"
			default:
				t.Errorf("docs/iam.md: %s for %s has an unknown mark %q", action, role, mark)
				continue
			}
			if says != want[role] {
				t.Errorf("docs/iam.md: %s for %s says %s (%q); the matrix gets %s", action, role, says, mark, want[role])
			}
		}
	}
}

// TestDocsProvidersListEveryType holds docs/providers.md to the provider
// registry: every type the app links has its section, and the section
// names every field of its manifest.
func TestDocsProvidersListEveryType(t *testing.T) {
	t.Parallel()
	doc := doctest.Read(t, "docs/providers.md")
	types := providers.Types()
	if len(types) == 0 {
		t.Fatal("the app links no provider type")
	}
	for _, typ := range types {
		head := "(`" + typ + "`)\n"
		i := strings.Index(doc, head)
		if i < 0 {
			t.Errorf("docs/providers.md: no section for provider type %s (a heading ending in %q)", typ, strings.TrimSpace(head))
			continue
		}
		section := doc[i:]
		if j := strings.Index(section[len(head):], "\n## "); j >= 0 {
			section = section[:len(head)+j]
		}
		f, _ := providers.Lookup(typ)
		for _, fd := range f.Manifest.Fields {
			if !strings.Contains(section, "`"+fd.Name+"`") {
				t.Errorf("docs/providers.md: the %s section does not name its manifest field %s", typ, fd.Name)
			}
		}
	}
}
