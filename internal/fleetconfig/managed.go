package fleetconfig

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// specJSON is the spec a mark records: the document's spec with the API's
// defaults filled in, as JSON (the same bytes for the same spec).
func specJSON(spec any) string {
	b, err := json.Marshal(spec)
	if err != nil {
		return ""
	}
	return string(b)
}

// markName is the name an object's mark is kept under: its key's name (a
// quota's scope in words, a webhook's url), as docKey and readScope make
// it.
func markName(ch Change) string {
	if ch.doc == nil {
		return ch.live.name
	}
	return strings.TrimPrefix(docKey(*ch.doc), ch.Kind+"/")
}

// readMarks reads the scope's managed marks and hangs each on its live
// object. A mark of another owner is not the scope's (a tenant key's
// platform read answers its own tenant's).
func readMarks(ctx context.Context, c *client.Client, s *scope) error {
	marks, err := listAll(ctx, func(ctx context.Context, tok string) ([]*apiv1.ManagedMark, string, error) {
		r, err := c.FleetConfig.ListMarks(ctx, connect.NewRequest(&apiv1.ListManagedMarksRequest{Tenant: s.name, PageToken: tok}))
		return msg(r).GetMarks(), msg(r).GetNextPageToken(), err
	})
	if err != nil {
		return fmt.Errorf("list managed marks: %w", err)
	}
	s.marks = map[string]*apiv1.ManagedMark{}
	for _, m := range marks {
		if m.GetTenantId() != s.id {
			continue
		}
		key := objKey(m.GetKind(), m.GetName())
		s.marks[key] = m
		if l, ok := s.live[key]; ok {
			l.mark = m
			s.live[key] = l
		}
	}
	return nil
}

// setMark records that apply applied the change's document.
func setMark(ctx context.Context, c *client.Client, ch Change) error {
	_, err := c.FleetConfig.SetMark(ctx, mutation(&apiv1.SetManagedMarkRequest{Tenant: ch.Tenant, Kind: ch.Kind, Name: markName(ch),
		SpecJson: specJSON(normalize(ch.Kind, ch.doc.Spec))}, false))
	return err
}

// Drift is a managed object whose live state is not what apply last
// applied to it: changed by hand (Fields, applied → live) or gone.
type Drift struct {
	Kind string
	// Tenant is the tenant's name; empty for the platform's.
	Tenant, Name string
	Gone         bool
	// Fields: Old is the value applied, New the live one.
	Fields    []FieldDiff
	AppliedAt time.Time
	AppliedBy string
}

// Object names the drifted object as a change would.
func (d Drift) Object() string {
	return Change{Kind: d.Kind, Tenant: d.Tenant, Name: d.Name}.Object()
}

// DetectDrift reads the live state and the managed marks of each scope (a
// tenant's name, "" for the platform's) and lists every managed object
// whose live state differs from the spec its mark records.
func DetectDrift(ctx context.Context, c *client.Client, scopes []string) ([]Drift, error) {
	var out []Drift
	for _, name := range scopes {
		s := &scope{name: name}
		if err := readScope(ctx, c, s); err != nil {
			return nil, err
		}
		keys := make([]string, 0, len(s.marks))
		for k := range s.marks {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			m := s.marks[k]
			d := Drift{Kind: m.GetKind(), Tenant: name, Name: m.GetName(), AppliedAt: m.GetApplyTime().AsTime(), AppliedBy: m.GetAppliedBy()}
			spec := newSpec(m.GetKind())
			if spec == nil {
				continue // a kind this version does not manage
			}
			if err := json.Unmarshal([]byte(m.GetSpecJson()), spec); err != nil {
				return nil, fmt.Errorf("the mark of %s: %w", d.Object(), err)
			}
			applied := normalize(m.GetKind(), spec)
			live, ok := s.live[k]
			if !ok {
				d.Gone = true
				out = append(out, d)
				continue
			}
			if d.Fields = diff(withLiveDefaults(applied, live.spec), live.spec); len(d.Fields) > 0 {
				out = append(out, d)
			}
		}
	}
	return out, nil
}

// WriteDrift prints drift for humans.
func WriteDrift(w io.Writer, drift []Drift) {
	if len(drift) == 0 {
		fmt.Fprintln(w, "No drift: every managed object is as apply last left it.")
		return
	}
	changed, gone := 0, 0
	for _, d := range drift {
		when := fmt.Sprintf("applied %s by %s", d.AppliedAt.UTC().Format(time.RFC3339), d.AppliedBy)
		if d.Gone {
			gone++
			fmt.Fprintf(w, "- gone %s  (%s; no longer live)\n", d.Object(), when)
			continue
		}
		changed++
		fmt.Fprintf(w, "~ drift %s  (%s)\n", d.Object(), when)
		for _, f := range d.Fields {
			fmt.Fprintf(w, "    %s: %s → %s\n", f.Path, unsetOr(f.Old), unsetOr(f.New))
		}
	}
	fmt.Fprintf(w, "Drift: %d changed by hand, %d gone (applied → live).\n", changed, gone)
}

// Scopes lists the scopes the documents name, in first-seen order: a
// tenant's name, or "" for the platform's.
func Scopes(docs []Document, defaultTenant string) []string {
	seen := map[string]bool{}
	var out []string
	for _, d := range docs {
		t := docTenant(d, defaultTenant)
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	return out
}
