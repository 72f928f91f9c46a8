package quorum_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/quorum/approval"
	"github.com/better-compute/better-compute/internal/store"
)

type fixture struct {
	cp    *bctest.ControlPlane
	acme  *apiv1.Tenant
	other *apiv1.Tenant
	// keys of acme's roles, and "evil": the admin of tenant other.
	keys map[string]string
	// ramdisk nodes of acme and of other.
	node, node2, otherNode fleet.Node
	// approvers: three SSH signers (two Ed25519, one ECDSA P-256).
	approvers []ssh.Signer
}

func (f *fixture) client(role string) *client.Client { return f.cp.Client(f.keys[role]) }

func setup(t *testing.T) *fixture {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	f := &fixture{cp: cp, keys: map[string]string{}}
	admin := cp.Admin()
	acme, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	f.acme = acme.Msg.GetTenant()
	other, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "other"}))
	require.NoError(t, err)
	f.other = other.Msg.GetTenant()
	for _, role := range []string{"admin", "member", "agent"} {
		k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: role}))
		require.NoError(t, err)
		f.keys[role] = k.Msg.GetSecret()
	}
	k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "other", Role: "admin"}))
	require.NoError(t, err)
	f.keys["evil"] = k.Msg.GetSecret()
	f.node = f.insertNode(t, f.acme.GetId(), "rd-1")
	f.node2 = f.insertNode(t, f.acme.GetId(), "rd-2")
	f.otherNode = f.insertNode(t, f.other.GetId(), "rd-x")
	for i := range 3 {
		f.approvers = append(f.approvers, newSigner(t, i == 2))
	}
	return f
}

func newSigner(t *testing.T, ecdsaKey bool) ssh.Signer {
	t.Helper()
	var (
		s   ssh.Signer
		err error
	)
	if ecdsaKey {
		k, kerr := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, kerr)
		s, err = ssh.NewSignerFromKey(k)
	} else {
		_, k, kerr := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, kerr)
		s, err = ssh.NewSignerFromKey(k)
	}
	require.NoError(t, err)
	return s
}

// insertNode adds a commissioning ramdisk node, as a ramdisk's join would.
func (f *fixture) insertNode(t *testing.T, tenantID, name string) fleet.Node {
	t.Helper()
	var n fleet.Node
	require.NoError(t, f.cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		now := f.cp.Clock.Now()
		p := &fleet.NodeInsertParams{ID: envelope.NewID(fleet.NodeIDPrefix, now), Name: name, TenantID: tenantID, ProjectID: "prj_x",
			HardwareKey: "hw-" + name, State: fleet.NodeActive, Liveness: fleet.LivenessReady, Mode: fleet.RoleRamdisk, CreateTime: now}
		if err := fleet.NodeInsert(ctx, tx, p); err != nil {
			return err
		}
		var err error
		n, err = fleet.NodeGet(ctx, tx, "", p.ID)
		return err
	}))
	return n
}

func pub(s ssh.Signer) string { return approval.AuthorizedKey(s.PublicKey()) }

// putSet sets acme's approvers: threshold of the given signers.
func (f *fixture) putSet(t *testing.T, threshold int, signers ...ssh.Signer) *apiv1.ApproverSet {
	t.Helper()
	req := &apiv1.PutApproverSetRequest{Tenant: "acme", Threshold: int32(threshold)}
	for _, s := range signers {
		req.PublicKeys = append(req.PublicKeys, pub(s))
	}
	res, err := f.client("admin").CommandBatches.PutApproverSet(context.Background(), connect.NewRequest(req))
	require.NoError(t, err)
	return res.Msg.GetApproverSet()
}

func params(t *testing.T, m map[string]any) *structpb.Struct {
	t.Helper()
	st, err := structpb.NewStruct(m)
	require.NoError(t, err)
	return st
}

func (f *fixture) wipeBatch(t *testing.T, c *client.Client) *apiv1.CommandBatch {
	t.Helper()
	res, err := c.CommandBatches.Create(context.Background(), connect.NewRequest(&apiv1.CreateCommandBatchRequest{Tenant: "acme",
		Description: "decommission rack 4",
		Leaves: []*apiv1.CommandBatchLeafSpec{
			{Kind: fleet.KindDiskWipe, Subject: f.node.ID, Params: params(t, map[string]any{"method": "discard"})},
			{Kind: fleet.KindImageWrite, Subject: f.node2.ID, Params: params(t, map[string]any{"image": "debian-12", "size": 2})},
		}}))
	require.NoError(t, err)
	return res.Msg.GetBatch()
}

// approve signs b as a client that recomputed the root from b's leaves.
func approve(t *testing.T, b *apiv1.CommandBatch, s ssh.Signer) *apiv1.ApproveCommandBatchRequest {
	t.Helper()
	var leaves []approval.Leaf
	for _, l := range b.GetLeaves() {
		d, _, err := approval.ParamsDigest(l.GetParams().AsMap())
		require.NoError(t, err)
		leaves = append(leaves, approval.Leaf{Kind: l.GetKind(), Subject: l.GetSubject(), ParamsDigest: d})
	}
	root, err := approval.Root(leaves)
	require.NoError(t, err)
	require.Equal(t, b.GetRoot(), approval.HexRoot(root), "the server's root is the leaves' root")
	sig, err := approval.Sign(s, approval.BatchMessage(b.GetTrustDomain(), b.GetId(), root, b.GetApproverEpoch()))
	require.NoError(t, err)
	return &apiv1.ApproveCommandBatchRequest{Tenant: "acme", Id: b.GetId(), Root: b.GetRoot(),
		Approval: &apiv1.KeySignature{Key: pub(s), Signature: sig}}
}

func requireCode(t *testing.T, err error, code string, msgAndArgs ...any) {
	t.Helper()
	require.Error(t, err, msgAndArgs...)
	require.Equal(t, code, client.Code(err), append([]any{"error: %v", err}, msgAndArgs...)...)
}

func (f *fixture) commandCount(t *testing.T, tenantID string) int {
	t.Helper()
	var cmds []fleet.Command
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		cmds, err = fleet.CommandList(ctx, tx, &fleet.CommandListParams{TenantID: tenantID, Limit: 1000})
		return err
	}))
	return len(cmds)
}

// TestBatchRunsOnlyWithQuorum: a 2-of-3 batch does not run with one
// approval and runs with two, each leaf once; a direct destructive command
// is refused with the way to a batch.
func TestBatchRunsOnlyWithQuorum(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	member := f.client("member")
	set := f.putSet(t, 2, f.approvers...)
	require.EqualValues(t, 1, set.GetEpoch())

	_, err := member.Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: f.node.ID, Kind: fleet.KindDiskWipe}))
	requireCode(t, err, "QUORUM_REQUIRED")
	require.Contains(t, err.Error(), "commands run --batch")
	require.Zero(t, f.commandCount(t, f.acme.GetId()))

	b := f.wipeBatch(t, member)
	require.Equal(t, "pending", b.GetState())
	require.EqualValues(t, 2, b.GetThreshold())
	require.Len(t, b.GetLeaves(), 2)

	res, err := member.CommandBatches.Approve(ctx, connect.NewRequest(approve(t, b, f.approvers[0])))
	require.NoError(t, err)
	require.Equal(t, "pending", res.Msg.GetBatch().GetState())

	// M-1 approvals: nothing runs.
	_, err = member.CommandBatches.Run(ctx, connect.NewRequest(&apiv1.RunCommandBatchRequest{Tenant: "acme", Id: b.GetId()}))
	requireCode(t, err, "FAILED_PRECONDITION")
	require.Contains(t, err.Error(), "1 of the 2 approvals")
	require.Zero(t, f.commandCount(t, f.acme.GetId()))

	// The same key twice counts once.
	_, err = member.CommandBatches.Approve(ctx, connect.NewRequest(approve(t, b, f.approvers[0])))
	requireCode(t, err, "FAILED_PRECONDITION")
	require.Contains(t, err.Error(), "already approved")

	// A key outside the set, and a signature over another root, are refused.
	stranger := newSigner(t, false)
	_, err = member.CommandBatches.Approve(ctx, connect.NewRequest(approve(t, b, stranger)))
	requireCode(t, err, "PERMISSION_DENIED")
	require.Contains(t, err.Error(), "not an approver")
	forged := approve(t, b, f.approvers[1])
	forged.Approval.Signature, err = approval.Sign(f.approvers[1], approval.BatchMessage(b.GetTrustDomain(), b.GetId(), [32]byte{1}, b.GetApproverEpoch()))
	require.NoError(t, err)
	_, err = member.CommandBatches.Approve(ctx, connect.NewRequest(forged))
	requireCode(t, err, "PERMISSION_DENIED")
	require.Contains(t, err.Error(), "does not verify")

	// The ECDSA key completes the quorum.
	res, err = member.CommandBatches.Approve(ctx, connect.NewRequest(approve(t, b, f.approvers[2])))
	require.NoError(t, err)
	require.Equal(t, "approved", res.Msg.GetBatch().GetState())
	require.Len(t, res.Msg.GetBatch().GetApprovals(), 2)

	ran, err := member.CommandBatches.Run(ctx, connect.NewRequest(&apiv1.RunCommandBatchRequest{Tenant: "acme", Id: b.GetId()}))
	require.NoError(t, err)
	require.Equal(t, "ran", ran.Msg.GetBatch().GetState())
	require.Equal(t, 2, f.commandCount(t, f.acme.GetId()))
	var ids []string
	for i, l := range ran.Msg.GetBatch().GetLeaves() {
		require.NotEmpty(t, l.GetCommandId())
		ids = append(ids, l.GetCommandId())
		c, err := member.Commands.Get(ctx, connect.NewRequest(&apiv1.GetCommandRequest{Tenant: "acme", Id: l.GetCommandId()}))
		require.NoError(t, err)
		require.Equal(t, b.GetLeaves()[i].GetKind(), c.Msg.GetCommand().GetKind())
		require.Equal(t, b.GetLeaves()[i].GetSubject(), c.Msg.GetCommand().GetNodeId())
		require.Equal(t, b.GetLeaves()[i].GetParams().AsMap(), c.Msg.GetCommand().GetParams().AsMap())
	}
	// Each is an ordinary command row: signed like every other.
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		for _, id := range ids {
			c, err := fleet.CommandGet(ctx, tx, "", id)
			if err != nil {
				return err
			}
			require.NotEmpty(t, c.Signature, "command %s is signed", id)
			require.NotEmpty(t, c.Signer, "command %s names its signer", id)
		}
		return nil
	}))
	// Exactly once: a second run answers the same commands and adds none.
	again, err := member.CommandBatches.Run(ctx, connect.NewRequest(&apiv1.RunCommandBatchRequest{Tenant: "acme", Id: b.GetId()}))
	require.NoError(t, err)
	for i, l := range again.Msg.GetBatch().GetLeaves() {
		require.Equal(t, ids[i], l.GetCommandId())
	}
	require.Equal(t, 2, f.commandCount(t, f.acme.GetId()))

	// An agent proposes but cannot approve or run.
	agent := f.client("agent")
	ab := f.wipeBatch(t, agent)
	_, err = agent.CommandBatches.Approve(ctx, connect.NewRequest(approve(t, ab, f.approvers[0])))
	requireCode(t, err, "PERMISSION_DENIED")
	_, err = agent.CommandBatches.Run(ctx, connect.NewRequest(&apiv1.RunCommandBatchRequest{Tenant: "acme", Id: ab.GetId()}))
	requireCode(t, err, "PERMISSION_DENIED")
}

// TestBatchRowsAreVerifiedAtRun: an approved batch whose leaf row was
// edited in the database afterwards runs nothing.
func TestBatchRowsAreVerifiedAtRun(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	member := f.client("member")
	f.putSet(t, 1, f.approvers[0])
	b := f.wipeBatch(t, member)
	_, err := member.CommandBatches.Approve(ctx, connect.NewRequest(approve(t, b, f.approvers[0])))
	require.NoError(t, err)
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE command_batch_leaves SET kind = $1 WHERE batch_id = $2 AND idx = 1`, fleet.KindDiskWipe, b.GetId())
		return err
	}))
	_, err = member.CommandBatches.Run(ctx, connect.NewRequest(&apiv1.RunCommandBatchRequest{Tenant: "acme", Id: b.GetId()}))
	requireCode(t, err, "FAILED_PRECONDITION")
	require.Contains(t, err.Error(), "do not hash to its root")
	require.Zero(t, f.commandCount(t, f.acme.GetId()))
}

// TestDuplicatedApprovalRowCountsOnce: one approval stored twice, under the
// key's fingerprint and under its text (a database-only attacker's copy),
// is one approval: a 2-of-2 batch with one signature runs nothing.
func TestDuplicatedApprovalRowCountsOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	member := f.client("member")
	f.putSet(t, 2, f.approvers[0], f.approvers[1])
	b := f.wipeBatch(t, member)
	_, err := member.CommandBatches.Approve(ctx, connect.NewRequest(approve(t, b, f.approvers[0])))
	require.NoError(t, err)
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO command_batch_approvals (batch_id, key_id, signature, approved_by, create_time)
			SELECT batch_id, $1, signature, approved_by, create_time FROM command_batch_approvals WHERE batch_id = $2`,
			pub(f.approvers[0]), b.GetId())
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE command_batches SET state = 'approved' WHERE id = $1`, b.GetId())
		return err
	}))
	_, err = member.CommandBatches.Run(ctx, connect.NewRequest(&apiv1.RunCommandBatchRequest{Tenant: "acme", Id: b.GetId()}))
	requireCode(t, err, "FAILED_PRECONDITION")
	require.Zero(t, f.commandCount(t, f.acme.GetId()))
}

// auditResults lists acme's audit rows of an action as decision/result.
func (f *fixture) auditResults(t *testing.T, action string) []string {
	t.Helper()
	res, err := f.client("admin").Audit.List(context.Background(), connect.NewRequest(&apiv1.ListAuditRequest{Tenant: "acme", Action: action}))
	require.NoError(t, err)
	var out []string
	for _, e := range res.Msg.GetEntries() {
		out = append(out, e.GetDecision()+"/"+e.GetResult())
	}
	return out
}

// TestApproverSetChange: the first set is an admin's; a later one needs the
// previous quorum's signatures over its canonical bytes, and a change
// without them is refused and audited. Batches of the old epoch stop.
func TestApproverSetChange(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	admin := f.client("admin")
	a := f.approvers
	_, err := f.client("member").CommandBatches.PutApproverSet(ctx, connect.NewRequest(&apiv1.PutApproverSetRequest{
		Tenant: "acme", Threshold: 1, PublicKeys: []string{pub(a[0])}}))
	requireCode(t, err, "PERMISSION_DENIED", "a member does not set approvers")
	set := f.putSet(t, 2, a[0], a[1], a[2])
	old := f.wipeBatch(t, f.client("member"))

	next := []ssh.Signer{a[0], newSigner(t, false)}
	change := func(sigs ...ssh.Signer) *apiv1.PutApproverSetRequest {
		req := &apiv1.PutApproverSetRequest{Tenant: "acme", Threshold: 1, PreviousEpoch: set.GetEpoch()}
		var keys []ssh.PublicKey
		for _, s := range next {
			req.PublicKeys = append(req.PublicKeys, pub(s))
			keys = append(keys, s.PublicKey())
		}
		msg := approval.SetMessage(set.GetTrustDomain(), f.acme.GetId(), set.GetEpoch()+1, 1, keys)
		for _, s := range sigs {
			sig, err := approval.Sign(s, msg)
			require.NoError(t, err)
			req.Approvals = append(req.Approvals, &apiv1.KeySignature{Key: pub(s), Signature: sig})
		}
		return req
	}
	before := len(f.auditResults(t, "approverSets.put"))
	for name, req := range map[string]*apiv1.PutApproverSetRequest{
		"no approvals":       change(),
		"M-1 approvals":      change(a[0]),
		"the same key twice": change(a[1], a[1]),
		"a new key signing":  change(a[0], next[1]),
	} {
		_, err := admin.CommandBatches.PutApproverSet(ctx, connect.NewRequest(req))
		requireCode(t, err, "PERMISSION_DENIED", name)
		require.Contains(t, err.Error(), "needs approvals by 2 of the 3 keys of epoch 1", name)
	}
	got := f.auditResults(t, "approverSets.put")
	require.Len(t, got, before+4, "every refused change is in the audit log: %v", got)
	require.Contains(t, got, "deny/PERMISSION_DENIED")
	cur, err := admin.CommandBatches.GetApproverSet(ctx, connect.NewRequest(&apiv1.GetApproverSetRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.EqualValues(t, 1, cur.Msg.GetApproverSet().GetEpoch(), "nothing refused was written")

	// Against a stale epoch the change is refused even with a quorum.
	stale := change(a[0], a[2])
	stale.PreviousEpoch = 7
	_, err = admin.CommandBatches.PutApproverSet(ctx, connect.NewRequest(stale))
	requireCode(t, err, "FAILED_PRECONDITION")

	res, err := admin.CommandBatches.PutApproverSet(ctx, connect.NewRequest(change(a[0], a[2])))
	require.NoError(t, err)
	require.EqualValues(t, 2, res.Msg.GetApproverSet().GetEpoch())
	require.Len(t, res.Msg.GetApproverSet().GetKeys(), 2)

	// The batch proposed under epoch 1 can no longer be approved.
	_, err = f.client("member").CommandBatches.Approve(ctx, connect.NewRequest(approve(t, old, a[0])))
	requireCode(t, err, "FAILED_PRECONDITION")
	require.Contains(t, err.Error(), "moved from epoch 1 to 2")
}

// TestBatchCrossTenant: another tenant's batches and nodes answer exactly
// as missing ones.
func TestBatchCrossTenant(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.putSet(t, 1, f.approvers[0])
	b := f.wipeBatch(t, f.client("member"))
	evil := f.client("evil")

	_, err := evil.CommandBatches.Get(ctx, connect.NewRequest(&apiv1.GetCommandBatchRequest{Tenant: "other", Id: b.GetId()}))
	requireCode(t, err, "NOT_FOUND")
	_, err = evil.CommandBatches.Get(ctx, connect.NewRequest(&apiv1.GetCommandBatchRequest{Tenant: "acme", Id: b.GetId()}))
	requireCode(t, err, "PERMISSION_DENIED")
	req := approve(t, b, f.approvers[0])
	req.Tenant = "other"
	_, err = evil.CommandBatches.Approve(ctx, connect.NewRequest(req))
	requireCode(t, err, "NOT_FOUND")
	_, err = evil.CommandBatches.Run(ctx, connect.NewRequest(&apiv1.RunCommandBatchRequest{Tenant: "other", Id: b.GetId()}))
	requireCode(t, err, "NOT_FOUND")
	list, err := evil.CommandBatches.List(ctx, connect.NewRequest(&apiv1.ListCommandBatchesRequest{Tenant: "other"}))
	require.NoError(t, err)
	require.Empty(t, list.Msg.GetBatches())

	// acme naming other's node is refused exactly as a node that does not
	// exist: same code, same message but for the id.
	create := func(subject string) error {
		_, err := f.client("member").CommandBatches.Create(ctx, connect.NewRequest(&apiv1.CreateCommandBatchRequest{Tenant: "acme",
			Leaves: []*apiv1.CommandBatchLeafSpec{{Kind: fleet.KindDiskWipe, Subject: subject}}}))
		return err
	}
	missing := envelope.NewID(fleet.NodeIDPrefix, f.cp.Clock.Now())
	errOther, errMissing := create(f.otherNode.ID), create(missing)
	requireCode(t, errOther, "NOT_FOUND")
	requireCode(t, errMissing, "NOT_FOUND")
	require.Equal(t, strings.ReplaceAll(errMissing.Error(), missing, "ID"), strings.ReplaceAll(errOther.Error(), f.otherNode.ID, "ID"))
	// And other's admin cannot batch acme's node either.
	_, err = evil.CommandBatches.Create(ctx, connect.NewRequest(&apiv1.CreateCommandBatchRequest{Tenant: "other",
		Leaves: []*apiv1.CommandBatchLeafSpec{{Kind: fleet.KindDiskWipe, Subject: f.node.ID}}}))
	require.Error(t, err)
	require.NotContains(t, err.Error(), "rd-1")
}

func (f *fixture) batchCount(t *testing.T) int {
	t.Helper()
	n := 0
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT (SELECT COUNT(*) FROM command_batches) + (SELECT COUNT(*) FROM command_batch_leaves)`).Scan(&n)
	}))
	return n
}

// TestBatchBadInput: each bad request names its field and reason and
// writes nothing.
func TestBatchBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	member := f.client("member")
	big := strings.Repeat("x", fleet.MaxCommandParamsBytes-64)
	var nine []*apiv1.CommandBatchLeafSpec
	for range 9 {
		nine = append(nine, &apiv1.CommandBatchLeafSpec{Kind: fleet.KindDiskWipe, Subject: f.node.ID, Params: params(t, map[string]any{"pad": big})})
	}
	for _, tt := range []struct {
		name   string
		req    *apiv1.CreateCommandBatchRequest
		field  string
		reason string
	}{
		{"no leaves", &apiv1.CreateCommandBatchRequest{Tenant: "acme"}, "leaves", "at least one"},
		{"not destructive", &apiv1.CreateCommandBatchRequest{Tenant: "acme", Leaves: []*apiv1.CommandBatchLeafSpec{
			{Kind: fleet.KindInventoryRefresh, Subject: f.node.ID}}}, "leaves[0].kind", "destructive kind"},
		{"subject not a node id", &apiv1.CreateCommandBatchRequest{Tenant: "acme", Leaves: []*apiv1.CommandBatchLeafSpec{
			{Kind: fleet.KindDiskWipe, Subject: "rd-1"}}}, "leaves[0].subject", "not a valid nod id"},
		{"one command too large", &apiv1.CreateCommandBatchRequest{Tenant: "acme", Leaves: []*apiv1.CommandBatchLeafSpec{
			{Kind: fleet.KindDiskWipe, Subject: f.node.ID, Params: params(t, map[string]any{"pad": big + strings.Repeat("y", 128)})}}},
			"leaves[0].params", "one command"},
		{"over 8 MiB in total", &apiv1.CreateCommandBatchRequest{Tenant: "acme", Leaves: nine}, "leaves", "8 MiB"},
		{"ttl", &apiv1.CreateCommandBatchRequest{Tenant: "acme", TtlSeconds: -1, Leaves: []*apiv1.CommandBatchLeafSpec{
			{Kind: fleet.KindDiskWipe, Subject: f.node.ID}}}, "ttl_seconds", "between 1 and"},
	} {
		_, err := member.CommandBatches.Create(ctx, connect.NewRequest(tt.req))
		requireCode(t, err, "INVALID_ARGUMENT", tt.name)
		var found bool
		for _, v := range client.Detail(err).GetViolations() {
			if v.GetField() == tt.field {
				found = true
				require.Contains(t, v.GetReason(), tt.reason, tt.name)
			}
		}
		require.True(t, found, "%s: violations %v", tt.name, client.Detail(err).GetViolations())
	}
	require.Zero(t, f.batchCount(t))

	// Valid leaves but no approver set: refused with the reason.
	_, err := member.CommandBatches.Create(ctx, connect.NewRequest(&apiv1.CreateCommandBatchRequest{Tenant: "acme",
		Leaves: []*apiv1.CommandBatchLeafSpec{{Kind: fleet.KindDiskWipe, Subject: f.node.ID}}}))
	requireCode(t, err, "FAILED_PRECONDITION")
	require.Contains(t, err.Error(), "no approver set")

	// A second leaf the node's mode refuses rolls back the whole batch.
	f.putSet(t, 1, f.approvers[0])
	gpu := f.insertNode(t, f.acme.GetId(), "gpu-1")
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE nodes SET mode = 'node' WHERE id = $1`, gpu.ID)
		return err
	}))
	_, err = member.CommandBatches.Create(ctx, connect.NewRequest(&apiv1.CreateCommandBatchRequest{Tenant: "acme",
		Leaves: []*apiv1.CommandBatchLeafSpec{{Kind: fleet.KindDiskWipe, Subject: f.node.ID}, {Kind: fleet.KindDiskWipe, Subject: gpu.ID}}}))
	requireCode(t, err, "FAILED_PRECONDITION")
	require.Contains(t, err.Error(), "leaves[1]")
	require.Zero(t, f.batchCount(t))

	for name, req := range map[string]*apiv1.PutApproverSetRequest{
		"threshold over N": {Tenant: "acme", Threshold: 2, PublicKeys: []string{pub(f.approvers[0])}},
		"rsa key":          {Tenant: "acme", Threshold: 1, PublicKeys: []string{"ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQDF"}},
		"duplicate key":    {Tenant: "acme", Threshold: 1, PublicKeys: []string{pub(f.approvers[0]), pub(f.approvers[0]) + " again"}},
	} {
		_, err := f.client("admin").CommandBatches.PutApproverSet(ctx, connect.NewRequest(req))
		requireCode(t, err, "INVALID_ARGUMENT", name)
	}
}

// TestBatchExpiry: a batch not approved by its expiry expires: it takes no
// approval and does not run, and lists as expired.
func TestBatchExpiry(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	member := f.client("member")
	f.putSet(t, 2, f.approvers[0], f.approvers[1])
	res, err := member.CommandBatches.Create(ctx, connect.NewRequest(&apiv1.CreateCommandBatchRequest{Tenant: "acme", TtlSeconds: 60,
		Leaves: []*apiv1.CommandBatchLeafSpec{{Kind: fleet.KindDiskWipe, Subject: f.node.ID}}}))
	require.NoError(t, err)
	b := res.Msg.GetBatch()
	_, err = member.CommandBatches.Approve(ctx, connect.NewRequest(approve(t, b, f.approvers[0])))
	require.NoError(t, err)
	f.cp.Clock.Advance(61 * time.Second)

	got, err := member.CommandBatches.Get(ctx, connect.NewRequest(&apiv1.GetCommandBatchRequest{Tenant: "acme", Id: b.GetId()}))
	require.NoError(t, err)
	require.Equal(t, "expired", got.Msg.GetBatch().GetState())
	_, err = member.CommandBatches.Approve(ctx, connect.NewRequest(approve(t, b, f.approvers[1])))
	requireCode(t, err, "FAILED_PRECONDITION")
	require.Contains(t, err.Error(), "is expired")
	_, err = member.CommandBatches.Run(ctx, connect.NewRequest(&apiv1.RunCommandBatchRequest{Tenant: "acme", Id: b.GetId()}))
	requireCode(t, err, "FAILED_PRECONDITION")
	require.Zero(t, f.commandCount(t, f.acme.GetId()))
	list, err := member.CommandBatches.List(ctx, connect.NewRequest(&apiv1.ListCommandBatchesRequest{Tenant: "acme", State: "expired"}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetBatches(), 1)
	list, err = member.CommandBatches.List(ctx, connect.NewRequest(&apiv1.ListCommandBatchesRequest{Tenant: "acme", State: "pending"}))
	require.NoError(t, err)
	require.Empty(t, list.Msg.GetBatches())

	// Cancel: a pending batch cancels once.
	c := f.wipeBatch(t, member)
	_, err = member.CommandBatches.Cancel(ctx, connect.NewRequest(&apiv1.CancelCommandBatchRequest{Tenant: "acme", Id: c.GetId()}))
	require.NoError(t, err)
	_, err = member.CommandBatches.Cancel(ctx, connect.NewRequest(&apiv1.CancelCommandBatchRequest{Tenant: "acme", Id: c.GetId()}))
	requireCode(t, err, "FAILED_PRECONDITION")
}

// TestBatchCreateIdempotent: a create repeated with its Idempotency-Key
// answers the first batch and writes nothing more.
func TestBatchCreateIdempotent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.putSet(t, 1, f.approvers[0])
	mk := func() *connect.Request[apiv1.CreateCommandBatchRequest] {
		r := connect.NewRequest(&apiv1.CreateCommandBatchRequest{Tenant: "acme",
			Leaves: []*apiv1.CommandBatchLeafSpec{{Kind: fleet.KindDiskWipe, Subject: f.node.ID}}})
		r.Header().Set("Idempotency-Key", "wipe-rack-4")
		return r
	}
	a, err := f.client("member").CommandBatches.Create(ctx, mk())
	require.NoError(t, err)
	b, err := f.client("member").CommandBatches.Create(ctx, mk())
	require.NoError(t, err)
	require.Equal(t, a.Msg.GetBatch().GetId(), b.Msg.GetBatch().GetId())
	require.Equal(t, 2, f.batchCount(t), "one batch row and one leaf row")
}

// enroll adds a site and a machine of tenant (as its admin key) and
// returns their ids.
func (f *fixture) enroll(t *testing.T, c *client.Client, tenant, site, machine, mac, bmc string) (string, string) {
	t.Helper()
	ctx := context.Background()
	s, err := c.Sites.Create(ctx, connect.NewRequest(&apiv1.CreateSiteRequest{Tenant: tenant, Name: site, Networks: []string{"127.0.0.0/8"}}))
	if err != nil {
		// The site exists already: look it up.
		got, gerr := c.Sites.Get(ctx, connect.NewRequest(&apiv1.GetSiteRequest{Tenant: tenant, Site: site}))
		require.NoError(t, gerr, "create: %v", err)
		s = connect.NewResponse(&apiv1.CreateSiteResponse{Site: got.Msg.GetSite()})
	}
	m, err := c.Machines.Enroll(ctx, connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: tenant, Site: site, Name: machine,
		BmcDriver: "ipmi", BmcAddress: bmc, BmcUsername: "admin", BmcPassword: "secret", Mac: mac}))
	require.NoError(t, err)
	return s.Msg.GetSite().GetId(), m.Msg.GetMachine().GetId()
}

// TestBatchPowersMachines: a power.off leaf names a machine by its site;
// another tenant's machine (or one under another site) is refused as a
// missing one; the approved batch starts the machine's power workflow
// once; and with approvers set, machines power off is refused directly.
func TestBatchPowersMachines(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	admin, member := f.client("admin"), f.client("member")
	site, m1 := f.enroll(t, admin, "acme", "dc1", "m1", "02:00:00:00:00:01", "127.0.0.2")
	_, m2 := f.enroll(t, admin, "acme", "dc1", "m2", "02:00:00:00:00:02", "127.0.0.3")
	otherSite, otherMachine := f.enroll(t, f.client("evil"), "other", "dc9", "x1", "02:00:00:00:00:09", "127.0.0.9")
	f.putSet(t, 2, f.approvers...)

	_, err := admin.Machines.Power(ctx, connect.NewRequest(&apiv1.PowerMachineRequest{Tenant: "acme", Machine: m1, Action: "off"}))
	requireCode(t, err, "QUORUM_REQUIRED")
	require.Contains(t, err.Error(), "batches create --leaf power.off,site/"+site+"/machine/"+m1)
	// Power on destroys nothing: still one decision.
	_, err = admin.Machines.Power(ctx, connect.NewRequest(&apiv1.PowerMachineRequest{Tenant: "acme", Machine: m2, Action: "on"}))
	require.NoError(t, err)

	mk := func(subject string, p map[string]any) error {
		_, err := member.CommandBatches.Create(ctx, connect.NewRequest(&apiv1.CreateCommandBatchRequest{Tenant: "acme",
			Leaves: []*apiv1.CommandBatchLeafSpec{{Kind: "power.off", Subject: subject, Params: params(t, p)}}}))
		return err
	}
	missing := envelope.NewID("mch", f.cp.Clock.Now())
	errOther := mk("site/"+otherSite+"/machine/"+otherMachine, nil)
	errMissing := mk("site/"+otherSite+"/machine/"+missing, nil)
	requireCode(t, errOther, "NOT_FOUND")
	requireCode(t, errMissing, "NOT_FOUND")
	require.Equal(t, strings.ReplaceAll(errMissing.Error(), missing, "ID"), strings.ReplaceAll(errOther.Error(), otherMachine, "ID"))
	requireCode(t, mk("site/"+otherSite+"/machine/"+m1, nil), "NOT_FOUND", "acme's machine under another site")
	requireCode(t, mk(m1, nil), "INVALID_ARGUMENT", "a bare machine id")
	requireCode(t, mk("site/"+site+"/machine/"+m1, map[string]any{"boot": "disk"}), "INVALID_ARGUMENT", "params on a power leaf")
	require.Zero(t, f.batchCount(t))

	res, err := member.CommandBatches.Create(ctx, connect.NewRequest(&apiv1.CreateCommandBatchRequest{Tenant: "acme",
		Leaves: []*apiv1.CommandBatchLeafSpec{{Kind: "power.off", Subject: "site/" + site + "/machine/" + m1},
			{Kind: fleet.KindDiskWipe, Subject: f.node.ID}}}))
	require.NoError(t, err)
	b := res.Msg.GetBatch()
	for _, s := range f.approvers[:2] {
		_, err := member.CommandBatches.Approve(ctx, connect.NewRequest(approve(t, b, s)))
		require.NoError(t, err)
	}
	ran, err := member.CommandBatches.Run(ctx, connect.NewRequest(&apiv1.RunCommandBatchRequest{Tenant: "acme", Id: b.GetId()}))
	require.NoError(t, err)
	leaves := ran.Msg.GetBatch().GetLeaves()
	require.NotEmpty(t, leaves[0].GetWorkflowId())
	require.Empty(t, leaves[0].GetCommandId())
	require.NotEmpty(t, leaves[1].GetCommandId())
	// The workflow goes on without us (no site agent is connected here),
	// so what is checked is that it exists for m1, not how far it got.
	wf, err := admin.Machines.GetWorkflow(ctx, connect.NewRequest(&apiv1.GetMachineWorkflowRequest{Tenant: "acme", Workflow: leaves[0].GetWorkflowId()}))
	require.NoError(t, err)
	require.Equal(t, m1, wf.Msg.GetWorkflow().GetMachineId())
	require.Equal(t, "power-off", wf.Msg.GetWorkflow().GetOperation())
	again, err := member.CommandBatches.Run(ctx, connect.NewRequest(&apiv1.RunCommandBatchRequest{Tenant: "acme", Id: b.GetId()}))
	require.NoError(t, err)
	require.Equal(t, leaves[0].GetWorkflowId(), again.Msg.GetBatch().GetLeaves()[0].GetWorkflowId())

	// A batch whose machine is busy by the time it runs runs nothing of it.
	_, m3 := f.enroll(t, admin, "acme", "dc1", "m3", "02:00:00:00:00:03", "127.0.0.4")
	res, err = member.CommandBatches.Create(ctx, connect.NewRequest(&apiv1.CreateCommandBatchRequest{Tenant: "acme",
		Leaves: []*apiv1.CommandBatchLeafSpec{{Kind: fleet.KindDiskWipe, Subject: f.node2.ID},
			{Kind: "power.cycle", Subject: "site/" + site + "/machine/" + m3}}}))
	require.NoError(t, err)
	busy := res.Msg.GetBatch()
	// Busy as an operation in flight leaves it (set here so that no engine
	// run can end it first).
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE machines SET workflow_id = 'wf_elsewhere', operation = 'inspect' WHERE id = $1`, m3)
		return err
	}))
	for _, s := range f.approvers[1:] {
		_, err := member.CommandBatches.Approve(ctx, connect.NewRequest(approve(t, busy, s)))
		require.NoError(t, err)
	}
	before := f.commandCount(t, f.acme.GetId())
	_, err = member.CommandBatches.Run(ctx, connect.NewRequest(&apiv1.RunCommandBatchRequest{Tenant: "acme", Id: busy.GetId()}))
	requireCode(t, err, "FAILED_PRECONDITION")
	require.Contains(t, err.Error(), "leaves[1]")
	require.Equal(t, before, f.commandCount(t, f.acme.GetId()), "the first leaf's command rolled back with the refusal")
}
