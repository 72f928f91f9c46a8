package fleetconfig

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseRefusals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, doc, field, reason string
	}{
		{"apiVersion", "apiVersion: v2\nkind: Flavor\nmetadata: {name: a}\nspec: {vcpus: 1, memoryMiB: 1}\n", "apiVersion", `must be bettercompute.io/v1, got "v2"`},
		{"no spec", "apiVersion: bettercompute.io/v1\nkind: Flavor\nmetadata: {name: a}\n", "spec", "is required"},
		{"top-level field", "apiVersion: bettercompute.io/v1\nkind: Flavor\nmetadata: {name: a}\nspec: {}\nstatus: {}\n", "status", "unknown field (line 5)"},
		{"metadata field", "apiVersion: bettercompute.io/v1\nkind: Flavor\nmetadata: {name: a, labels: {}}\nspec: {}\n", "metadata.labels", "unknown field (line 3)"},
		{"wrong type", "apiVersion: bettercompute.io/v1\nkind: Flavor\nmetadata: {name: a}\nspec: {vcpus: many, memoryMiB: 1}\n", "spec", "line 4: cannot unmarshal !!str `many` into int32"},
		{"flavor vcpus", "apiVersion: bettercompute.io/v1\nkind: Flavor\nmetadata: {name: a}\nspec: {memoryMiB: 1}\n", "spec.vcpus", "is required and must be positive"},
		{"ip pool cidr", "apiVersion: bettercompute.io/v1\nkind: IPPool\nmetadata: {name: a}\nspec: {cidr: 10.0.0.0/99}\n", "spec.cidr", `is not a CIDR: netip.ParsePrefix("10.0.0.0/99"): prefix length out of range`},
		{"selector", "apiVersion: bettercompute.io/v1\nkind: Pool\nmetadata: {name: a}\nspec: {selector: 'zone in ('}\n", "spec.selector", ""},
		{"offer all", "apiVersion: bettercompute.io/v1\nkind: Pool\nmetadata: {name: a}\nspec: {offerTo: [all, acme]}\n", "spec.offerTo", `"all" stands alone`},
		{"negative quota", "apiVersion: bettercompute.io/v1\nkind: Quota\nmetadata: {name: a}\nspec: {gpus: -1}\n", "spec.gpus", "must not be negative (leave it out for unlimited)"},
		{"list item", "apiVersion: bettercompute.io/v1\nkind: Pool\nmetadata: {name: a}\nspec: {policy: {health: {xidActions: {48: quarantine}, breaker: 1}}}\n", "spec.policy.health.breaker", "unknown field (line 4)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, errs := Parse("f.yaml", []byte(tc.doc))
			require.Len(t, errs, 1, "%v", errs)
			require.Equal(t, "f.yaml", errs[0].File)
			require.Equal(t, 1, errs[0].Index)
			require.Equal(t, tc.field, errs[0].Field)
			if tc.reason != "" {
				require.Equal(t, tc.reason, errs[0].Reason)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	doc := "apiVersion: bettercompute.io/v1\nkind: Quota\nmetadata: {name: a, tenant: acme}\nspec: {pool: h100, gpus: 0}\n"
	// Empty documents (a leading or trailing ---) are skipped.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("---\n"+doc+"---\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not a document"), 0o600))
	docs, err := Load(dir)
	require.NoError(t, err)
	require.Len(t, docs, 1)
	q := docs[0].Spec.(*QuotaSpec)
	require.NotNil(t, q.GPUs, "gpus: 0 is a limit, not unlimited")
	require.Equal(t, int32(0), *q.GPUs)

	// A second document for the same scope, under another name.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "b.yaml"), []byte("apiVersion: bettercompute.io/v1\nkind: Quota\nmetadata: {name: b, tenant: acme}\nspec: {pool: h100, model: ''}\n"), 0o600))
	_, err = Load(dir)
	var des DocErrors
	require.ErrorAs(t, err, &des)
	require.Len(t, des, 1)
	require.Equal(t, filepath.Join(dir, "b.yaml")+":1: metadata.name: the same Quota as "+filepath.Join(dir, "a.yaml")+":1", des[0].Error())

	_, err = Load(t.TempDir())
	require.ErrorContains(t, err, "no .yaml or .yml files")
}

func TestDiffAndNormalize(t *testing.T) {
	t.Parallel()
	six, eight := int32(6), int32(8)
	require.Equal(t, []FieldDiff{{Path: "spec.gpus", Old: "6", New: "8"}},
		diff(normalize(KindQuota, &QuotaSpec{Pool: "h100", GPUs: &six}), normalize(KindQuota, &QuotaSpec{Pool: "h100", GPUs: &eight})))
	// Defaults the API fills in and spellings it canonicalises compare equal.
	live := normalize(KindPool, &PoolSpec{Selector: "gpu.model in (H100)", OfferTo: []string{"b", "a"},
		Policy: &PoolPolicy{GPUSharing: "exclusive", OnNodeLost: "release", StartHorizonSeconds: 90 * 24 * 3600, HostReserve: &HostReserve{}}})
	require.Empty(t, diff(live, normalize(KindPool, &PoolSpec{Selector: "gpu.model=H100", OfferTo: []string{"a", "b"}})))
	require.Empty(t, diff(normalize(KindIPPool, &IPPoolSpec{CIDR: "10.0.0.0/24"}), normalize(KindIPPool, &IPPoolSpec{CIDR: "10.0.0.7/24"})))
	d := diff(live, normalize(KindPool, &PoolSpec{Selector: "gpu.model=H100", OfferTo: []string{"a", "b"}, Policy: &PoolPolicy{Health: &Health{XIDActions: map[int64]string{48: "rma"}}}}))
	require.Equal(t, []FieldDiff{{Path: "spec.policy.health.xidActions.48", Old: "", New: "rma"}}, d)
}

// TestPlanRefusesADefaultedDuplicate: a pool that names the default tenant
// and one that leaves it out are the same pool, refused before any call
// (the client here has no server: a call would fail otherwise).
func TestPlanRefusesADefaultedDuplicate(t *testing.T) {
	t.Parallel()
	docs, errs := Parse("p.yaml", []byte(`apiVersion: bettercompute.io/v1
kind: Pool
metadata: {name: a, tenant: acme}
spec: {}
---
apiVersion: bettercompute.io/v1
kind: Pool
metadata: {name: a}
spec: {}
`))
	require.Empty(t, errs)
	_, err := MakePlan(t.Context(), nil, docs, Options{DefaultTenant: "acme"})
	var des DocErrors
	require.ErrorAs(t, err, &des)
	require.Equal(t, "p.yaml:2: metadata.name: the same Pool as p.yaml:1", des.Error())
}
