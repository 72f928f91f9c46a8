package mcp_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"slices"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/doctest"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/mcp"
	"github.com/better-compute/better-compute/internal/quorum/approval"
	"github.com/better-compute/better-compute/internal/store"
)

// TestMCPProposeCommandBatch: an agent proposes a batch; it stays pending,
// and the agent has no tool to approve or run it (nor may its key).
func TestMCPProposeCommandBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cp := bctest.NewControlPlane(t)
	f := &fixture{cp: cp, admin: cp.Admin()}
	_, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "agent"}))
	require.NoError(t, err)
	agentKey := k.Msg.GetSecret()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	signer, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	_, err = f.admin.CommandBatches.PutApproverSet(ctx, connect.NewRequest(&apiv1.PutApproverSetRequest{Tenant: "acme", Threshold: 1,
		PublicKeys: []string{approval.AuthorizedKey(signer.PublicKey())}}))
	require.NoError(t, err)
	var node string
	require.NoError(t, cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		var tid string
		if err := tx.QueryRow(ctx, `SELECT id FROM tenants WHERE name = 'acme'`).Scan(&tid); err != nil {
			return err
		}
		now := cp.Clock.Now()
		node = envelope.NewID(fleet.NodeIDPrefix, now)
		return fleet.NodeInsert(ctx, tx, &fleet.NodeInsertParams{ID: node, Name: "rd-1", TenantID: tid, ProjectID: "prj_x",
			HardwareKey: "hw-1", State: fleet.NodeActive, Liveness: fleet.LivenessReady, Mode: fleet.RoleRamdisk, CreateTime: now})
	}))

	cs := f.memorySession(t, agentKey)
	tools, err := cs.ListTools(ctx, nil)
	require.NoError(t, err)
	for _, tl := range tools.Tools {
		require.NotContains(t, tl.Name, "approve", "an agent must have no tool that approves a batch")
	}

	var out mcp.BatchOutput
	res := call(t, cs, "propose_command_batch", map[string]any{"description": "wipe rd-1", "ttl": "4h",
		"leaves": []any{map[string]any{"kind": "disk.wipe", "subject": node, "params": map[string]any{"method": "discard"}}}}, &out)
	require.False(t, res.IsError, "%v", res.Content)
	require.Equal(t, "pending", out.Batch.State)
	require.EqualValues(t, 1, out.Batch.Threshold)
	require.Len(t, out.Batch.Leaves, 1)
	require.Len(t, out.Batch.Root, 64)

	// The agent's key may not approve it through the API either.
	b, err := f.admin.CommandBatches.Get(ctx, connect.NewRequest(&apiv1.GetCommandBatchRequest{Tenant: "acme", Id: out.Batch.ID}))
	require.NoError(t, err)
	root, err := approval.ParseRoot(b.Msg.GetBatch().GetRoot())
	require.NoError(t, err)
	sig, err := approval.Sign(signer, approval.BatchMessage(b.Msg.GetBatch().GetTrustDomain(), out.Batch.ID, root, 1))
	require.NoError(t, err)
	_, err = cp.Client(agentKey).CommandBatches.Approve(ctx, connect.NewRequest(&apiv1.ApproveCommandBatchRequest{Tenant: "acme",
		Id: out.Batch.ID, Root: b.Msg.GetBatch().GetRoot(), Approval: &apiv1.KeySignature{Key: approval.AuthorizedKey(signer.PublicKey()), Signature: sig}}))
	require.Error(t, err)

	// A bad leaf is refused with its field.
	r := refused(t, cs, "propose_command_batch", map[string]any{"leaves": []any{map[string]any{"kind": "inventory.refresh", "subject": node}}})
	require.Equal(t, "INVALID_ARGUMENT", r.Code)
	require.Contains(t, r.Message, "leaves[0].kind")
}

// TestMCPDocsListEveryTool keeps docs/mcp.md's tool table equal to the
// tools the server registers.
func TestMCPDocsListEveryTool(t *testing.T) {
	t.Parallel()
	var documented []string
	for _, cells := range doctest.Table(t, doctest.Read(t, "docs/mcp.md"), "| tool | input (besides `tenant`) | output | API call |") {
		documented = append(documented, doctest.Code(cells[0])...)
	}
	slices.Sort(documented)
	require.Equal(t, wantTools, documented)
}
