package app_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/audit"
)

// auditEntryOf returns the id of the newest audit entry of action in
// tenant's log.
func auditEntryOf(t *testing.T, c *client.Client, tenant, action string) string {
	t.Helper()
	resp, err := c.Audit.List(t.Context(), connect.NewRequest(&apiv1.ListAuditRequest{Tenant: tenant, Action: action}))
	require.NoError(t, err)
	require.NotEmpty(t, resp.Msg.GetEntries(), "%s in %s", action, tenant)
	return resp.Msg.GetEntries()[0].GetId()
}

// TestAuditProofsAcrossTenants: a tenant proves its own entries and gets
// checkpoints and consistency proofs; another tenant's entry id answers
// exactly as a missing one; the full check is the platform's; bad input
// names its field.
func TestAuditProofsAcrossTenants(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := t.Context()
	admin := cp.Admin()
	keys := map[string]*client.Client{}
	for _, name := range []string{"acme", "globex"} {
		_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
		require.NoError(t, err)
		_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: name, Name: "web"}))
		require.NoError(t, err)
		k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: name, Role: "member"}))
		require.NoError(t, err)
		keys[name] = cp.Client(k.Msg.GetSecret())
	}
	acmeEntry := auditEntryOf(t, admin, "acme", "projects.create")
	globexEntry := auditEntryOf(t, admin, "globex", "projects.create")
	first, err := cp.App.AuditLog.CheckpointNow(ctx)
	require.NoError(t, err)

	acme := keys["acme"]
	keyResp, err := acme.Audit.GetLogKey(ctx, connect.NewRequest(&apiv1.GetAuditLogKeyRequest{}))
	require.NoError(t, err)
	vkey := keyResp.Msg.GetVerifierKey()
	require.True(t, strings.HasPrefix(vkey, "better-compute.local/audit+"), vkey)

	// Its own entry: proved and verified offline with the published key.
	p, err := acme.Audit.ProveInclusion(ctx, connect.NewRequest(&apiv1.ProveAuditInclusionRequest{EntryId: acmeEntry}))
	require.NoError(t, err)
	require.Equal(t, acmeEntry, p.Msg.GetEntry().GetId())
	v, err := audit.VerifyBundle(audit.Bundle{Kind: audit.BundleInclusion, Checkpoint: p.Msg.GetCheckpoint().GetNote(),
		LeafIndex: p.Msg.GetLeafIndex(), Leaf: p.Msg.GetLeaf(), Proof: p.Msg.GetProof()}, vkey)
	require.NoError(t, err)
	require.Equal(t, "projects.create", v.Entry.Action)
	require.Equal(t, first.Size, v.Checkpoint.Size)

	// Another tenant's entry is told exactly as a missing one.
	_, errOther := acme.Audit.ProveInclusion(ctx, connect.NewRequest(&apiv1.ProveAuditInclusionRequest{EntryId: globexEntry}))
	missing := "aud_" + strings.Repeat("0", 26)
	_, errMissing := acme.Audit.ProveInclusion(ctx, connect.NewRequest(&apiv1.ProveAuditInclusionRequest{EntryId: missing}))
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(errOther))
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(errMissing))
	require.Equal(t, strings.ReplaceAll(errMissing.Error(), missing, "ID"), strings.ReplaceAll(errOther.Error(), globexEntry, "ID"))
	_, err = keys["globex"].Audit.ProveInclusion(ctx, connect.NewRequest(&apiv1.ProveAuditInclusionRequest{EntryId: globexEntry}))
	require.NoError(t, err, "globex proves its own")
	_, err = admin.Audit.ProveInclusion(ctx, connect.NewRequest(&apiv1.ProveAuditInclusionRequest{EntryId: globexEntry}))
	require.NoError(t, err, "the platform proves any")

	// An entry written after the checkpoint is not provable yet.
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "api"}))
	require.NoError(t, err)
	late := auditEntryOf(t, admin, "acme", "projects.create")
	_, err = acme.Audit.ProveInclusion(ctx, connect.NewRequest(&apiv1.ProveAuditInclusionRequest{EntryId: late}))
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err), "%v", err)
	second, err := cp.App.AuditLog.CheckpointNow(ctx)
	require.NoError(t, err)
	require.Greater(t, second.Size, first.Size)

	// Checkpoints and consistency proofs for a tenant's principal.
	latest, err := acme.Audit.GetCheckpoint(ctx, connect.NewRequest(&apiv1.GetAuditCheckpointRequest{}))
	require.NoError(t, err)
	require.Equal(t, second.Size, latest.Msg.GetCheckpoint().GetSize())
	cons, err := acme.Audit.ProveConsistency(ctx, connect.NewRequest(&apiv1.ProveAuditConsistencyRequest{FromSize: first.Size}))
	require.NoError(t, err)
	_, err = audit.VerifyBundle(audit.Bundle{Kind: audit.BundleConsistency, FromCheckpoint: string(first.Note),
		Checkpoint: cons.Msg.GetCheckpoint().GetNote(), Proof: cons.Msg.GetProof()}, vkey)
	require.NoError(t, err)

	// The full check is the platform's.
	_, err = acme.Audit.CheckLog(ctx, connect.NewRequest(&apiv1.CheckAuditLogRequest{}))
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err))
	rep, err := admin.Audit.CheckLog(ctx, connect.NewRequest(&apiv1.CheckAuditLogRequest{}))
	require.NoError(t, err)
	require.Empty(t, rep.Msg.GetProblems())
	require.GreaterOrEqual(t, rep.Msg.GetEntries(), second.Size)

	// Bad input: the field, the reason, the code.
	for _, tc := range []struct {
		name, field, reason string
		call                func() error
	}{
		{"no entry id", "entry_id", "is required", func() error {
			_, err := acme.Audit.ProveInclusion(ctx, connect.NewRequest(&apiv1.ProveAuditInclusionRequest{}))
			return err
		}},
		{"not an entry id", "entry_id", "is not a valid aud id", func() error {
			_, err := acme.Audit.ProveInclusion(ctx, connect.NewRequest(&apiv1.ProveAuditInclusionRequest{EntryId: "prj_" + strings.Repeat("0", 26)}))
			return err
		}},
		{"no from size", "from_size", "is required", func() error {
			_, err := acme.Audit.ProveConsistency(ctx, connect.NewRequest(&apiv1.ProveAuditConsistencyRequest{}))
			return err
		}},
		{"from past to", "from_size", "must be at most to_size", func() error {
			_, err := acme.Audit.ProveConsistency(ctx, connect.NewRequest(&apiv1.ProveAuditConsistencyRequest{FromSize: 9, ToSize: 3}))
			return err
		}},
		{"from past the latest", "from_size", "past the checkpoint's size", func() error {
			_, err := acme.Audit.ProveConsistency(ctx, connect.NewRequest(&apiv1.ProveAuditConsistencyRequest{FromSize: second.Size + 1}))
			return err
		}},
		{"size out of range", "size", "must be at most", func() error {
			_, err := acme.Audit.GetCheckpoint(ctx, connect.NewRequest(&apiv1.GetAuditCheckpointRequest{Size: 1 << 63}))
			return err
		}},
	} {
		err := tc.call()
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%s: %v", tc.name, err)
		d := client.Detail(err)
		require.NotNil(t, d, tc.name)
		require.Equal(t, "INVALID_ARGUMENT", d.GetCode(), tc.name)
		require.Equal(t, tc.field, d.GetViolations()[0].GetField(), tc.name)
		require.Contains(t, d.GetViolations()[0].GetReason(), tc.reason, tc.name)
	}
	_, err = acme.Audit.GetCheckpoint(ctx, connect.NewRequest(&apiv1.GetAuditCheckpointRequest{Size: second.Size + 100}))
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
}

// TestAuditSequencerJob: the River job sequences new entries and signs a
// checkpoint once the checkpoint interval has passed on the clock.
func TestAuditSequencerJob(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := t.Context()
	before, err := cp.App.AuditLog.CheckpointNow(ctx)
	require.NoError(t, err)
	_, err = cp.Admin().Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	// Past the sequence interval (the periodic job's tick) and the
	// checkpoint interval (1m by default).
	cp.Clock.Advance(time.Minute + cp.App.AuditLog.Config().SequenceInterval)
	bctest.WaitFor(t, "a checkpoint past the tenant's creation", func() bool {
		c, err := cp.App.AuditLog.Checkpoint(context.Background(), 0)
		require.NoError(t, err)
		return c.Size > before.Size
	})
}
