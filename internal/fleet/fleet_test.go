package fleet_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/store"
)

// fakeSealer seals claims as readable JSON, so tests can check them.
type fakeSealer struct{}

func (fakeSealer) SealJoinToken(c fleet.JoinClaims) (string, error) {
	b, err := json.Marshal(c)
	return "bcjt_test." + base64.RawURLEncoding.EncodeToString(b), err
}

func openClaims(t *testing.T, token string) fleet.JoinClaims {
	t.Helper()
	raw, ok := strings.CutPrefix(token, "bcjt_test.")
	require.True(t, ok, "token %q", token)
	b, err := base64.RawURLEncoding.DecodeString(raw)
	require.NoError(t, err)
	var c fleet.JoinClaims
	require.NoError(t, json.Unmarshal(b, &c))
	return c
}

// fakeRevoker records which nodes had their certificates revoked.
type fakeRevoker struct {
	mu    sync.Mutex
	nodes []string
}

func (r *fakeRevoker) RevokeNode(_ context.Context, nodeID, reason string) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nodes = append(r.nodes, nodeID+":"+reason)
	return 2, nil
}

func (r *fakeRevoker) revoked() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.nodes...)
}

// fakeNotifier records wakes, after commit as the gateway's does.
type fakeNotifier struct {
	mu    sync.Mutex
	woken []string
}

func (n *fakeNotifier) NotifyCommand(tx store.Tx, nodeID string) {
	tx.AfterCommit(func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		n.woken = append(n.woken, nodeID)
	})
}

func (n *fakeNotifier) count(nodeID string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := 0
	for _, id := range n.woken {
		if id == nodeID {
			c++
		}
	}
	return c
}

type fixture struct {
	cp       *bctest.ControlPlane
	url      string
	revoker  *fakeRevoker
	notifier *fakeNotifier
	acme     *apiv1.Tenant
	web      *apiv1.Project
	other    *apiv1.Tenant
	// keys of acme's roles, and "evil": the admin of tenant other.
	keys map[string]string
	node fleet.Node // active, in acme/web
}

// client returns a fleet client for a role ("platform-admin" is the
// bootstrap key).
func (f *fixture) client(role string) *client.Client {
	if role == "platform-admin" {
		return client.New(f.url, f.cp.AdminKey)
	}
	return client.New(f.url, f.keys[role])
}

// setup starts a control plane and serves the fleet API from it with fake
// PKI and gateway ports, so that every handler is reachable.
func setup(t *testing.T) *fixture {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	f := &fixture{cp: cp, revoker: &fakeRevoker{}, notifier: &fakeNotifier{}, keys: map[string]string{}}
	f.url = serveFleet(t, cp, fleet.Deps{Revoker: f.revoker, Sealer: fakeSealer{}, Notifier: f.notifier})

	admin := cp.Admin()
	acme, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	f.acme = acme.Msg.GetTenant()
	other, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "other"}))
	require.NoError(t, err)
	f.other = other.Msg.GetTenant()
	web, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "web"}))
	require.NoError(t, err)
	f.web = web.Msg.GetProject()
	for _, role := range []string{"admin", "member", "viewer", "agent"} {
		k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: role}))
		require.NoError(t, err)
		f.keys[role] = k.Msg.GetSecret()
	}
	k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "other", Role: "admin"}))
	require.NoError(t, err)
	f.keys["evil"] = k.Msg.GetSecret()
	f.node = f.insertNode(t, f.acme.GetId(), f.web.GetId(), "gpu-1.dc1", fleet.NodeActive)
	return f
}

// serveFleet serves the fleet API on cp's envelope with the given ports.
func serveFleet(t *testing.T, cp *bctest.ControlPlane, deps fleet.Deps) string {
	t.Helper()
	opts := connect.WithInterceptors(envelope.NewInterceptor(cp.App.Envelope, cp.App.Authn, nil))
	mux := http.NewServeMux()
	mux.Handle(apiv1connect.NewNodeServiceHandler(fleet.NewNodeService(cp.App.Envelope, deps), opts))
	mux.Handle(apiv1connect.NewCommandServiceHandler(fleet.NewCommandService(cp.App.Envelope, deps), opts))
	mux.Handle(apiv1connect.NewJoinTokenServiceHandler(fleet.NewJoinTokenService(cp.App.Envelope, deps), opts))
	mux.Handle(apiv1connect.NewJoinRequestServiceHandler(fleet.NewJoinRequestService(cp.App.Envelope), opts))
	mux.Handle(apiv1connect.NewInventoryServiceHandler(fleet.NewInventoryService(cp.App.Envelope), opts))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// insertNode adds a node the way a join would, straight through the store.
func (f *fixture) insertNode(t *testing.T, tenantID, projectID, name, state string) fleet.Node {
	t.Helper()
	ctx := context.Background()
	var n fleet.Node
	err := f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		now := f.cp.Clock.Now()
		p := &fleet.NodeInsertParams{
			ID: envelope.NewID(fleet.NodeIDPrefix, now), Name: name, TenantID: tenantID, ProjectID: projectID, Pool: "a100",
			Labels: `{"rack":"r1"}`, HardwareKey: "hw-" + name, State: state, Liveness: fleet.LivenessReady,
			AgentVersion: "0.1.1", Capabilities: `["nvml","cgroups"]`, CreateTime: now,
		}
		if err := fleet.NodeInsert(ctx, tx, p); err != nil {
			return err
		}
		var err error
		n, err = fleet.NodeGet(ctx, tx, "", p.ID)
		return err
	})
	require.NoError(t, err)
	return n
}

func requireCode(t *testing.T, err error, code string, msgAndArgs ...any) {
	t.Helper()
	require.Error(t, err, msgAndArgs...)
	require.Equal(t, code, client.Code(err), append([]any{"error: %v", err}, msgAndArgs...)...)
}

func requireViolation(t *testing.T, err error, field string) {
	t.Helper()
	requireCode(t, err, "INVALID_ARGUMENT")
	var fields []string
	for _, v := range client.Detail(err).GetViolations() {
		fields = append(fields, v.GetField())
	}
	require.Contains(t, fields, field, "violations of %v", err)
}

func TestNodes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	admin, member, viewer := f.client("admin"), f.client("member"), f.client("viewer")
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if err := fleet.InventoryReplace(ctx, tx, &fleet.Inventory{NodeID: f.node.ID, Digest: "sha256:abc", GPUs: []fleet.GPU{
			{UUID: "GPU-1", Index: 0, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559},
			{UUID: "GPU-2", Index: 1, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559},
		}}, ""); err != nil {
			return err
		}
		return fleet.NodeConditionSet(ctx, tx, &fleet.NodeCondition{NodeID: f.node.ID, Type: "GpuHealthy", Status: "true",
			Reason: "AllHealthy", Message: "2 of 2"})
	}))
	joining := f.insertNode(t, f.acme.GetId(), f.web.GetId(), "gpu-2", fleet.NodeJoining)
	f.insertNode(t, f.other.GetId(), "prj_x", "elsewhere", fleet.NodeActive)

	t.Run("list", func(t *testing.T) {
		res, err := viewer.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Tenant: "acme"}))
		require.NoError(t, err)
		require.Len(t, res.Msg.GetNodes(), 2)
		n := res.Msg.GetNodes()[0]
		require.Equal(t, "gpu-1.dc1", n.GetName())
		require.EqualValues(t, 2, n.GetGpuCount())
		require.Equal(t, "NVIDIA H100 80GB HBM3", n.GetGpuModel())
		require.Equal(t, map[string]string{"rack": "r1"}, n.GetLabels())
		require.Equal(t, []string{"nvml", "cgroups"}, n.GetCapabilities())
		require.Len(t, n.GetConditions(), 1)
		require.Equal(t, "GpuHealthy", n.GetConditions()[0].GetType())

		res, err = viewer.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Tenant: "acme", State: "joining"}))
		require.NoError(t, err)
		require.Len(t, res.Msg.GetNodes(), 1)
		require.Equal(t, joining.ID, res.Msg.GetNodes()[0].GetId())

		res, err = viewer.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Tenant: "acme", Project: "web", Liveness: "lost"}))
		require.NoError(t, err)
		require.Empty(t, res.Msg.GetNodes())

		all, err := f.client("platform-admin").Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{PageSize: 2}))
		require.NoError(t, err)
		require.Len(t, all.Msg.GetNodes(), 2)
		require.NotEmpty(t, all.Msg.GetNextPageToken())
		rest, err := f.client("platform-admin").Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{PageSize: 2, PageToken: all.Msg.GetNextPageToken()}))
		require.NoError(t, err)
		require.Len(t, rest.Msg.GetNodes(), 1)

		_, err = viewer.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{}))
		requireCode(t, err, "PERMISSION_DENIED", "a tenant cannot list the platform")
	})

	t.Run("get", func(t *testing.T) {
		for _, ref := range []string{f.node.ID, f.node.Name} {
			res, err := viewer.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Node: ref}))
			require.NoError(t, err)
			require.Equal(t, f.node.ID, res.Msg.GetNode().GetId())
		}
		_, err := viewer.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Tenant: "acme", Node: "nope"}))
		requireCode(t, err, "NOT_FOUND")
	})

	t.Run("drain and undrain", func(t *testing.T) {
		_, err := member.Nodes.Drain(ctx, connect.NewRequest(&apiv1.DrainNodeRequest{Node: f.node.Name}))
		requireCode(t, err, "PERMISSION_DENIED", "members do not drive the node lifecycle")

		res, err := admin.Nodes.Drain(ctx, connect.NewRequest(&apiv1.DrainNodeRequest{Tenant: "acme", Node: f.node.Name, Reason: "maintenance"}))
		require.NoError(t, err)
		require.Equal(t, fleet.NodeDraining, res.Msg.GetNode().GetState())
		cmd := res.Msg.GetCommand()
		require.Equal(t, fleet.KindNodeDrain, cmd.GetKind())
		require.Equal(t, fleet.CommandPending, cmd.GetState())
		require.EqualValues(t, 1, cmd.GetSeq())
		require.Equal(t, "maintenance", cmd.GetParams().GetFields()["reason"].GetStringValue())
		require.Equal(t, 1, f.notifier.count(f.node.ID))

		_, err = admin.Nodes.Drain(ctx, connect.NewRequest(&apiv1.DrainNodeRequest{Node: f.node.Name}))
		requireCode(t, err, "FAILED_PRECONDITION")

		un, err := admin.Nodes.Undrain(ctx, connect.NewRequest(&apiv1.UndrainNodeRequest{Node: f.node.ID}))
		require.NoError(t, err)
		require.Equal(t, fleet.NodeActive, un.Msg.GetNode().GetState())
		got, err := admin.Commands.Get(ctx, connect.NewRequest(&apiv1.GetCommandRequest{Id: cmd.GetId()}))
		require.NoError(t, err)
		require.Equal(t, fleet.CommandCanceled, got.Msg.GetCommand().GetState(), "undrain cancels the drain")

		_, err = admin.Nodes.Undrain(ctx, connect.NewRequest(&apiv1.UndrainNodeRequest{Node: f.node.ID}))
		requireCode(t, err, "FAILED_PRECONDITION")
	})

	t.Run("delete", func(t *testing.T) {
		_, err := admin.Nodes.Delete(ctx, connect.NewRequest(&apiv1.DeleteNodeRequest{Node: f.node.Name}))
		requireCode(t, err, "FAILED_PRECONDITION", "an adopted node is retired first")
		require.Empty(t, f.revoker.revoked())

		_, err = member.Nodes.Delete(ctx, connect.NewRequest(&apiv1.DeleteNodeRequest{Node: joining.Name}))
		requireCode(t, err, "PERMISSION_DENIED")

		res, err := admin.Nodes.Delete(ctx, connect.NewRequest(&apiv1.DeleteNodeRequest{Node: joining.Name}))
		require.NoError(t, err)
		require.EqualValues(t, 2, res.Msg.GetRevokedCertificates())
		require.Equal(t, []string{joining.ID + ":node deleted"}, f.revoker.revoked())
		_, err = admin.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Tenant: "acme", Node: joining.ID}))
		requireCode(t, err, "NOT_FOUND")
		// Without a tenant the miss is decided on the platform: a tenant
		// principal learns nothing about nodes that are not its own.
		_, err = admin.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Node: joining.ID}))
		requireCode(t, err, "PERMISSION_DENIED")

		retired := f.insertNode(t, f.acme.GetId(), f.web.GetId(), "gpu-3", fleet.NodeRetired)
		_, err = admin.Nodes.Delete(ctx, connect.NewRequest(&apiv1.DeleteNodeRequest{Tenant: "acme", Node: retired.ID}))
		require.NoError(t, err)
	})
}

func TestCommands(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	member, viewer, agent := f.client("member"), f.client("viewer"), f.client("agent")

	run := func(c *client.Client, key string, msg *apiv1.RunCommandRequest) (*apiv1.Command, error) {
		req := connect.NewRequest(msg)
		if key != "" {
			req.Header().Set(client.HeaderIdempotencyKey, key)
		}
		res, err := c.Commands.Run(ctx, req)
		if err != nil {
			return nil, err
		}
		return res.Msg.GetCommand(), nil
	}

	first, err := run(member, "", &apiv1.RunCommandRequest{Node: f.node.Name, Kind: fleet.KindInventoryRefresh})
	require.NoError(t, err)
	require.Equal(t, fleet.CommandPending, first.GetState())
	require.EqualValues(t, 1, first.GetSeq())
	require.Equal(t, 300*time.Second, first.GetDeadline().AsTime().Sub(first.GetCreateTime().AsTime()))
	require.Equal(t, 1, f.notifier.count(f.node.ID))

	t.Run("sequence per node", func(t *testing.T) {
		params, err := structpb.NewStruct(map[string]any{"sections": []any{"gpus"}})
		require.NoError(t, err)
		c, err := run(agent, "", &apiv1.RunCommandRequest{Tenant: "acme", Node: f.node.ID, Kind: fleet.KindInventoryRefresh, Params: params, DeadlineSeconds: 60})
		require.NoError(t, err)
		require.EqualValues(t, 2, c.GetSeq())
		require.Equal(t, "gpus", c.GetParams().GetFields()["sections"].GetListValue().GetValues()[0].GetStringValue())
		other := f.insertNode(t, f.acme.GetId(), f.web.GetId(), "gpu-9", fleet.NodeActive)
		c, err = run(member, "", &apiv1.RunCommandRequest{Node: other.Name, Kind: fleet.KindInventoryRefresh})
		require.NoError(t, err)
		require.EqualValues(t, 1, c.GetSeq(), "each node counts on its own")
	})

	t.Run("idempotent", func(t *testing.T) {
		key := client.NewIdempotencyKey()
		a, err := run(member, key, &apiv1.RunCommandRequest{Node: f.node.Name, Kind: fleet.KindInventoryRefresh})
		require.NoError(t, err)
		b, err := run(member, key, &apiv1.RunCommandRequest{Node: f.node.Name, Kind: fleet.KindInventoryRefresh})
		require.NoError(t, err)
		require.Equal(t, a.GetId(), b.GetId())
		require.Equal(t, a.GetSeq(), b.GetSeq())
		_, err = run(member, key, &apiv1.RunCommandRequest{Node: f.node.Name, Kind: fleet.KindNodeDrain})
		requireCode(t, err, "IDEMPOTENCY_KEY_REUSED")
		list, err := viewer.Commands.List(ctx, connect.NewRequest(&apiv1.ListCommandsRequest{Node: f.node.Name}))
		require.NoError(t, err)
		n := 0
		for _, c := range list.Msg.GetCommands() {
			if c.GetId() == a.GetId() {
				n++
			}
		}
		require.Equal(t, 1, n)
	})

	t.Run("refused", func(t *testing.T) {
		_, err := run(viewer, "", &apiv1.RunCommandRequest{Node: f.node.Name, Kind: fleet.KindInventoryRefresh})
		requireCode(t, err, "PERMISSION_DENIED")
		for _, kind := range []string{"", "allocation.bind", "rm -rf /", "node.shutdown"} {
			_, err = run(member, "", &apiv1.RunCommandRequest{Node: f.node.Name, Kind: kind})
			requireViolation(t, err, "kind")
		}
		// A reboot stops what runs on the node: a quorum batch's, or the
		// health module's under the pool's policy, never one decision.
		_, err = run(member, "", &apiv1.RunCommandRequest{Node: f.node.Name, Kind: "node.reboot"})
		requireCode(t, err, "QUORUM_REQUIRED")
		for _, d := range []int32{-1, 86401} {
			_, err = run(member, "", &apiv1.RunCommandRequest{Node: f.node.Name, Kind: fleet.KindInventoryRefresh, DeadlineSeconds: d})
			requireViolation(t, err, "deadline_seconds")
		}
		_, err = run(member, "", &apiv1.RunCommandRequest{Node: "Bad_Node", Kind: fleet.KindInventoryRefresh})
		requireViolation(t, err, "node")
		_, err = run(member, "", &apiv1.RunCommandRequest{Tenant: "acme", Node: "ghost", Kind: fleet.KindInventoryRefresh})
		requireCode(t, err, "NOT_FOUND")
		retired := f.insertNode(t, f.acme.GetId(), f.web.GetId(), "old", fleet.NodeRetired)
		_, err = run(member, "", &apiv1.RunCommandRequest{Node: retired.Name, Kind: fleet.KindInventoryRefresh})
		requireCode(t, err, "FAILED_PRECONDITION")
	})

	t.Run("get list cancel", func(t *testing.T) {
		got, err := viewer.Commands.Get(ctx, connect.NewRequest(&apiv1.GetCommandRequest{Tenant: "acme", Id: first.GetId()}))
		require.NoError(t, err)
		require.Equal(t, first.GetId(), got.Msg.GetCommand().GetId())

		_, err = viewer.Commands.Cancel(ctx, connect.NewRequest(&apiv1.CancelCommandRequest{Id: first.GetId()}))
		requireCode(t, err, "PERMISSION_DENIED")
		_, err = agent.Commands.Cancel(ctx, connect.NewRequest(&apiv1.CancelCommandRequest{Id: first.GetId()}))
		requireCode(t, err, "PERMISSION_DENIED")
		before := f.notifier.count(f.node.ID)
		res, err := member.Commands.Cancel(ctx, connect.NewRequest(&apiv1.CancelCommandRequest{Id: first.GetId()}))
		require.NoError(t, err)
		require.Equal(t, fleet.CommandCanceled, res.Msg.GetCommand().GetState())
		require.Equal(t, before+1, f.notifier.count(f.node.ID), "the session hears of the cancel")
		_, err = member.Commands.Cancel(ctx, connect.NewRequest(&apiv1.CancelCommandRequest{Id: first.GetId()}))
		requireCode(t, err, "FAILED_PRECONDITION")

		list, err := viewer.Commands.List(ctx, connect.NewRequest(&apiv1.ListCommandsRequest{Tenant: "acme", State: "canceled"}))
		require.NoError(t, err)
		require.Len(t, list.Msg.GetCommands(), 1)
		_, err = viewer.Commands.List(ctx, connect.NewRequest(&apiv1.ListCommandsRequest{Tenant: "acme", State: "done"}))
		requireViolation(t, err, "state")
		_, err = viewer.Commands.Get(ctx, connect.NewRequest(&apiv1.GetCommandRequest{Id: "cmd_nope"}))
		requireViolation(t, err, "id")
	})
}

func TestJoinTokens(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	admin := f.client("admin")

	create := func(c *client.Client, key string, msg *apiv1.CreateJoinTokenRequest) (*apiv1.CreateJoinTokenResponse, error) {
		req := connect.NewRequest(msg)
		if key != "" {
			req.Header().Set(client.HeaderIdempotencyKey, key)
		}
		res, err := c.JoinTokens.Create(ctx, req)
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}

	key := client.NewIdempotencyKey()
	req := &apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web", Pool: "a100", Labels: map[string]string{"rack": "r7"}}
	res, err := create(admin, key, req)
	require.NoError(t, err)
	jt := res.GetJoinToken()
	require.Equal(t, fleet.JoinTokenActive, jt.GetState())
	require.Equal(t, time.Hour, jt.GetExpireTime().AsTime().Sub(jt.GetCreateTime().AsTime()))
	claims := openClaims(t, res.GetToken())
	require.Equal(t, fleet.JoinClaims{TokenID: jt.GetId(), TenantID: f.acme.GetId(), ProjectID: f.web.GetId(), Pool: "a100",
		Labels: map[string]string{"rack": "r7"}, ExpiresAt: jt.GetExpireTime().AsTime()}, claims)

	t.Run("shown once", func(t *testing.T) {
		replay, err := create(admin, key, req)
		require.NoError(t, err)
		require.Equal(t, jt.GetId(), replay.GetJoinToken().GetId())
		require.Empty(t, replay.GetToken(), "a replay must not carry the token")
		list, err := admin.JoinTokens.List(ctx, connect.NewRequest(&apiv1.ListJoinTokensRequest{Tenant: "acme"}))
		require.NoError(t, err)
		require.Len(t, list.Msg.GetJoinTokens(), 1)
		// Nothing the server stored holds the token.
		err = f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			for _, q := range []string{`SELECT COUNT(*) FROM join_tokens WHERE labels LIKE $1 OR id LIKE $1`,
				`SELECT COUNT(*) FROM events WHERE CAST(data AS TEXT) LIKE $1`} {
				var n int
				if err := tx.QueryRow(ctx, q, "%"+res.GetToken()+"%").Scan(&n); err != nil {
					return err
				}
				require.Zero(t, n, q)
			}
			return nil
		})
		require.NoError(t, err)
	})

	t.Run("credentials stay with admins", func(t *testing.T) {
		for _, role := range []string{"member", "viewer", "agent"} {
			_, err := create(f.client(role), "", &apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web"})
			requireCode(t, err, "PERMISSION_DENIED", role)
			_, err = f.client(role).JoinTokens.List(ctx, connect.NewRequest(&apiv1.ListJoinTokensRequest{Tenant: "acme"}))
			requireCode(t, err, "PERMISSION_DENIED", role)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		cases := []struct {
			field string
			req   *apiv1.CreateJoinTokenRequest
		}{
			{"tenant", &apiv1.CreateJoinTokenRequest{Project: "web"}},
			{"project", &apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "prj_bad"}},
			{"pool", &apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web", Pool: "A100"}},
			{"labels", &apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web", Labels: map[string]string{"bad key": "x"}}},
			// The API's text check names the one label (docs/api.md, Text fields).
			{`labels["k"]`, &apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web", Labels: map[string]string{"k": "a\nb"}}},
			{"ttl_seconds", &apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web", TtlSeconds: -1}},
			{"ttl_seconds", &apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web", TtlSeconds: 7*24*3600 + 1}},
		}
		for _, tc := range cases {
			_, err := create(admin, "", tc.req)
			requireViolation(t, err, tc.field)
		}
		_, err := create(admin, "", &apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "nope"})
		requireCode(t, err, "NOT_FOUND")
	})

	t.Run("revoke", func(t *testing.T) {
		_, err := f.client("member").JoinTokens.Revoke(ctx, connect.NewRequest(&apiv1.RevokeJoinTokenRequest{Id: jt.GetId()}))
		requireCode(t, err, "PERMISSION_DENIED")
		rev, err := admin.JoinTokens.Revoke(ctx, connect.NewRequest(&apiv1.RevokeJoinTokenRequest{Tenant: "acme", Id: jt.GetId()}))
		require.NoError(t, err)
		require.Equal(t, fleet.JoinTokenRevoked, rev.Msg.GetJoinToken().GetState())
		_, err = admin.JoinTokens.Revoke(ctx, connect.NewRequest(&apiv1.RevokeJoinTokenRequest{Id: jt.GetId()}))
		requireCode(t, err, "FAILED_PRECONDITION")
		list, err := admin.JoinTokens.List(ctx, connect.NewRequest(&apiv1.ListJoinTokensRequest{Tenant: "acme"}))
		require.NoError(t, err)
		require.Empty(t, list.Msg.GetJoinTokens())
		list, err = admin.JoinTokens.List(ctx, connect.NewRequest(&apiv1.ListJoinTokensRequest{Tenant: "acme", IncludeInactive: true}))
		require.NoError(t, err)
		require.Len(t, list.Msg.GetJoinTokens(), 1)
	})
}

func TestJoinRequests(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	admin := f.client("admin")
	var ids []string
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		now := f.cp.Clock.Now()
		for range 2 {
			tok := &fleet.JoinToken{ID: envelope.NewID(fleet.JoinTokenIDPrefix, now), TenantID: f.acme.GetId(), ProjectID: f.web.GetId(),
				CreatedBy: "test", CreateTime: now, ExpireTime: now.Add(time.Hour)}
			if err := fleet.JoinTokenInsert(ctx, tx, tok); err != nil {
				return err
			}
			jr := &fleet.JoinRequest{ID: envelope.NewID(fleet.JoinRequestIDPrefix, now), TenantID: f.acme.GetId(), TokenID: tok.ID,
				CSRSHA256: "csr", HardwareKey: "hw-" + tok.ID, Identity: "To Be Filled By O.E.M.", Reason: "placeholder DMI", CreateTime: now}
			if err := fleet.JoinRequestInsert(ctx, tx, jr); err != nil {
				return err
			}
			ids = append(ids, jr.ID)
		}
		return nil
	}))

	list, err := f.client("viewer").JoinRequests.List(ctx, connect.NewRequest(&apiv1.ListJoinRequestsRequest{Tenant: "acme", State: "pending"}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetJoinRequests(), 2)

	_, err = f.client("member").JoinRequests.Approve(ctx, connect.NewRequest(&apiv1.ApproveJoinRequestRequest{Id: ids[0]}))
	requireCode(t, err, "PERMISSION_DENIED")
	ap, err := admin.JoinRequests.Approve(ctx, connect.NewRequest(&apiv1.ApproveJoinRequestRequest{Tenant: "acme", Id: ids[0]}))
	require.NoError(t, err)
	require.Equal(t, fleet.JoinRequestApproved, ap.Msg.GetJoinRequest().GetState())
	require.NotEmpty(t, ap.Msg.GetJoinRequest().GetDecidedBy())
	_, err = admin.JoinRequests.Reject(ctx, connect.NewRequest(&apiv1.RejectJoinRequestRequest{Id: ids[0]}))
	requireCode(t, err, "FAILED_PRECONDITION", "only pending requests are decided")

	rj, err := admin.JoinRequests.Reject(ctx, connect.NewRequest(&apiv1.RejectJoinRequestRequest{Id: ids[1]}))
	require.NoError(t, err)
	require.Equal(t, fleet.JoinRequestRejected, rj.Msg.GetJoinRequest().GetState())

	list, err = admin.JoinRequests.List(ctx, connect.NewRequest(&apiv1.ListJoinRequestsRequest{Tenant: "acme", State: "pending"}))
	require.NoError(t, err)
	require.Empty(t, list.Msg.GetJoinRequests())
	_, err = admin.JoinRequests.Approve(ctx, connect.NewRequest(&apiv1.ApproveJoinRequestRequest{Id: "jrq_nope"}))
	requireViolation(t, err, "id")
}

func TestInventory(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return fleet.InventoryReplace(ctx, tx, &fleet.Inventory{
			NodeID: f.node.ID, Digest: "sha256:def",
			GPUs: []fleet.GPU{
				{UUID: "GPU-a", Index: 0, Model: "NVIDIA A100-SXM4-80GB", MemoryMiB: 81920, PCIBusID: "0000:07:00.0", NumaNode: 0, MigMode: "enabled",
					MigInstances: []fleet.MigInstance{{UUID: "MIG-1", Profile: "3g.40gb", GPUInstanceID: 1, MemoryMiB: 40960}}},
				{UUID: "GPU-b", Index: 1, Model: "NVIDIA A100-SXM4-80GB", MemoryMiB: 81920, PCIBusID: "0000:0f:00.0", NumaNode: 1},
			},
			NvLinks:   []fleet.NvLink{{GPUUUID: "GPU-a", PeerUUID: "GPU-b", Link: 0}},
			NumaNodes: []fleet.NumaNode{{ID: 0, CPUs: "0-31", MemoryMiB: 515000, Hugepages2Mi: 512}, {ID: 1, CPUs: "32-63", MemoryMiB: 515000}},
			Resources: &fleet.NodeResources{CPUModel: "AMD EPYC 7763", Sockets: 2, Cores: 64, Threads: 128, MemoryMiB: 1030000},
		}, "")
	}))
	res, err := f.client("viewer").Inventory.Get(ctx, connect.NewRequest(&apiv1.GetInventoryRequest{Node: f.node.Name}))
	require.NoError(t, err)
	inv := res.Msg
	require.Equal(t, "sha256:def", inv.GetDigest())
	require.Len(t, inv.GetGpus(), 2)
	require.Equal(t, "3g.40gb", inv.GetGpus()[0].GetMigInstances()[0].GetProfile())
	require.Equal(t, "disabled", inv.GetGpus()[1].GetMigMode())
	require.Len(t, inv.GetNvlinks(), 1)
	require.Len(t, inv.GetNumaNodes(), 2)
	require.EqualValues(t, 512, inv.GetNumaNodes()[0].GetHugepages_2Mi())
	require.EqualValues(t, 128, inv.GetResources().GetThreads())

	_, err = f.client("evil").Inventory.Get(ctx, connect.NewRequest(&apiv1.GetInventoryRequest{Node: f.node.Name}))
	requireCode(t, err, "PERMISSION_DENIED")
}

// TestCrossTenant checks that another tenant's admin can neither read nor
// touch acme's fleet, whether it names acme, its own tenant, or nothing.
func TestCrossTenant(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	evil := f.client("evil")
	cmd, err := f.client("member").Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Node: f.node.Name, Kind: fleet.KindInventoryRefresh}))
	require.NoError(t, err)
	cmdID := cmd.Msg.GetCommand().GetId()
	tok, err := f.client("admin").JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web"}))
	require.NoError(t, err)
	tokID := tok.Msg.GetJoinToken().GetId()

	calls := map[string]func(tenant string) error{
		"nodes.get": func(tn string) error {
			_, err := evil.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Tenant: tn, Node: f.node.Name}))
			return err
		},
		"nodes.list": func(tn string) error {
			if tn == "other" {
				return nil // its own list is allowed, and empty
			}
			_, err := evil.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Tenant: tn}))
			return err
		},
		"nodes.drain": func(tn string) error {
			_, err := evil.Nodes.Drain(ctx, connect.NewRequest(&apiv1.DrainNodeRequest{Tenant: tn, Node: f.node.ID}))
			return err
		},
		"nodes.delete": func(tn string) error {
			_, err := evil.Nodes.Delete(ctx, connect.NewRequest(&apiv1.DeleteNodeRequest{Tenant: tn, Node: f.node.ID}))
			return err
		},
		"commands.run": func(tn string) error {
			_, err := evil.Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: tn, Node: f.node.Name, Kind: fleet.KindInventoryRefresh}))
			return err
		},
		"commands.get": func(tn string) error {
			_, err := evil.Commands.Get(ctx, connect.NewRequest(&apiv1.GetCommandRequest{Tenant: tn, Id: cmdID}))
			return err
		},
		"commands.cancel": func(tn string) error {
			_, err := evil.Commands.Cancel(ctx, connect.NewRequest(&apiv1.CancelCommandRequest{Tenant: tn, Id: cmdID}))
			return err
		},
		"commands.list": func(tn string) error {
			_, err := evil.Commands.List(ctx, connect.NewRequest(&apiv1.ListCommandsRequest{Tenant: tn, Node: f.node.Name}))
			return err
		},
		"joinTokens.create": func(tn string) error {
			_, err := evil.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: tn, Project: f.web.GetId()}))
			if tn == "" {
				requireViolation(t, err, "tenant")
				return connect.NewError(connect.CodePermissionDenied, nil)
			}
			return err
		},
		"joinTokens.revoke": func(tn string) error {
			_, err := evil.JoinTokens.Revoke(ctx, connect.NewRequest(&apiv1.RevokeJoinTokenRequest{Tenant: tn, Id: tokID}))
			return err
		},
		"inventory.get": func(tn string) error {
			_, err := evil.Inventory.Get(ctx, connect.NewRequest(&apiv1.GetInventoryRequest{Tenant: tn, Node: f.node.ID}))
			return err
		},
	}
	for name, call := range calls {
		for _, tn := range []string{"acme", f.acme.GetId(), "other", ""} {
			err := call(tn)
			if tn == "other" && name == "nodes.list" {
				continue
			}
			require.Error(t, err, "%s as other naming %q", name, tn)
			require.Contains(t, []string{"PERMISSION_DENIED", "NOT_FOUND"}, client.Code(err), "%s naming %q: %v", name, tn, err)
		}
	}
	// acme's fleet is intact.
	n, err := f.client("viewer").Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Node: f.node.ID}))
	require.NoError(t, err)
	require.Equal(t, fleet.NodeActive, n.Msg.GetNode().GetState())
	c, err := f.client("viewer").Commands.Get(ctx, connect.NewRequest(&apiv1.GetCommandRequest{Id: cmdID}))
	require.NoError(t, err)
	require.Equal(t, fleet.CommandPending, c.Msg.GetCommand().GetState())
	require.Empty(t, f.revoker.revoked())
}

// TestNotWired checks that without the PKI ports the calls that need them
// refuse as a server fault, after the decision, instead of half-working.
func TestNotWired(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	url := serveFleet(t, f.cp, fleet.Deps{})
	admin, evil := client.New(url, f.keys["admin"]), client.New(url, f.keys["evil"])
	_, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web"}))
	requireCode(t, err, "INTERNAL")
	retired := f.insertNode(t, f.acme.GetId(), f.web.GetId(), "gpu-4", fleet.NodeRetired)
	_, err = admin.Nodes.Delete(ctx, connect.NewRequest(&apiv1.DeleteNodeRequest{Node: retired.ID}))
	requireCode(t, err, "INTERNAL")
	_, err = admin.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Node: retired.ID}))
	require.NoError(t, err, "nothing was deleted")
	_, err = evil.Nodes.Delete(ctx, connect.NewRequest(&apiv1.DeleteNodeRequest{Node: retired.ID}))
	requireCode(t, err, "PERMISSION_DENIED", "strangers are refused as always: the decision comes first")
	// A nil notifier only means commands wait for the node's next poll.
	_, err = admin.Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Node: f.node.ID, Kind: fleet.KindInventoryRefresh}))
	require.NoError(t, err)
}

// TestAppSealsWithPKI checks the app's own wiring: a token minted through
// its routes opens with its PKI and says what the row says.
func TestAppSealsWithPKI(t *testing.T) {
	t.Parallel()
	f := setup(t)
	if f.cp.PKI == nil {
		t.Fatal("bctest starts the control plane with a PKI")
	}
	res, err := f.cp.Client(f.keys["admin"]).JoinTokens.Create(context.Background(),
		connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web", Pool: "h100", Labels: map[string]string{"rack": "r1"}}))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(res.Msg.GetToken(), "bcjt_"), "token %q", res.Msg.GetToken())
	claims, err := f.cp.PKI.OpenJoinToken(res.Msg.GetToken())
	require.NoError(t, err)
	jt := res.Msg.GetJoinToken()
	require.Equal(t, jt.GetId(), claims.TokenID)
	require.Equal(t, f.acme.GetId(), claims.TenantID)
	require.Equal(t, f.web.GetId(), claims.ProjectID)
	require.Equal(t, "h100", claims.Pool)
	require.Equal(t, map[string]string{"rack": "r1"}, claims.Labels)
	require.True(t, jt.GetExpireTime().AsTime().Equal(claims.ExpiresAt))
}

func TestValidation(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	admin := f.client("platform-admin")
	cases := []struct {
		name  string
		field string
		call  func() error
	}{
		{"node name uppercase", "node", func() error {
			_, err := admin.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Node: "GPU-1"}))
			return err
		}},
		{"node empty", "node", func() error {
			_, err := admin.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{}))
			return err
		}},
		{"node bad id", "node", func() error {
			_, err := admin.Nodes.Drain(ctx, connect.NewRequest(&apiv1.DrainNodeRequest{Node: "nod_123"}))
			return err
		}},
		{"node other id kind", "node", func() error {
			_, err := admin.Nodes.Delete(ctx, connect.NewRequest(&apiv1.DeleteNodeRequest{Node: f.acme.GetId()}))
			return err
		}},
		{"tenant bad id", "tenant", func() error {
			_, err := admin.Nodes.Undrain(ctx, connect.NewRequest(&apiv1.UndrainNodeRequest{Tenant: "tnt_x", Node: "gpu-1"}))
			return err
		}},
		{"drain reason too long", "reason", func() error {
			_, err := admin.Nodes.Drain(ctx, connect.NewRequest(&apiv1.DrainNodeRequest{Node: "gpu-1", Reason: strings.Repeat("r", 201)}))
			return err
		}},
		{"list state", "state", func() error {
			_, err := admin.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{State: "broken"}))
			return err
		}},
		{"list liveness", "liveness", func() error {
			_, err := admin.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Liveness: "dead"}))
			return err
		}},
		{"list project without tenant", "project", func() error {
			_, err := admin.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Project: "web"}))
			return err
		}},
		{"list page size", "page_size", func() error {
			_, err := admin.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{PageSize: 501}))
			return err
		}},
		{"page token for other filters", "page_token", func() error {
			_, err := admin.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{State: "active", PageToken: envelope.EncodePageToken("nod_x", "///")}))
			return err
		}},
		{"command cancel id", "id", func() error {
			_, err := admin.Commands.Cancel(ctx, connect.NewRequest(&apiv1.CancelCommandRequest{Id: "jtk_01jxyzabcdefghjkmnpqrstvwx"}))
			return err
		}},
		{"join token revoke id", "id", func() error {
			_, err := admin.JoinTokens.Revoke(ctx, connect.NewRequest(&apiv1.RevokeJoinTokenRequest{Id: ""}))
			return err
		}},
		{"join request state", "state", func() error {
			_, err := admin.JoinRequests.List(ctx, connect.NewRequest(&apiv1.ListJoinRequestsRequest{State: "maybe"}))
			return err
		}},
		{"inventory node", "node", func() error {
			_, err := admin.Inventory.Get(ctx, connect.NewRequest(&apiv1.GetInventoryRequest{Node: "a b"}))
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			requireViolation(t, tc.call(), tc.field)
		})
	}
}

// TestJoinTokenTTLEdges: a ttl whose nanoseconds overflow int64 once wrapped
// into an already-expired token answered with 200; it is refused naming the
// field, and the largest allowed ttl still expires in the future.
func TestJoinTokenTTLEdges(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	admin := f.client("admin")
	countTokens := func() int {
		var n int
		require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT count(*) FROM join_tokens`).Scan(&n)
		}))
		return n
	}
	before := countTokens()
	const maxTTL = 7 * 24 * 3600
	for _, ttl := range []int64{1<<63 - 1, 1 << 62, 9_300_000_000, maxTTL + 1, -1} {
		_, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web", TtlSeconds: ttl}))
		requireViolation(t, err, "ttl_seconds")
	}
	require.Equal(t, before, countTokens(), "a refused create writes nothing")

	res, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web", TtlSeconds: maxTTL}))
	require.NoError(t, err)
	require.Equal(t, f.cp.Clock.Now().Add(maxTTL*time.Second).Unix(), res.Msg.GetJoinToken().GetExpireTime().AsTime().Unix())
}

// TestCommandKeyOutlivesReplay: once the envelope's 24-hour replay record
// is gone, the key on the command row still answers a repeat with the
// stored command (it used to be ALREADY_EXISTS), and a different command
// with it is IDEMPOTENCY_KEY_REUSED.
func TestCommandKeyOutlivesReplay(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	member := f.client("member")
	run := func(key string, kind string) (*apiv1.Command, error) {
		req := connect.NewRequest(&apiv1.RunCommandRequest{Node: f.node.Name, Kind: kind})
		req.Header().Set(client.HeaderIdempotencyKey, key)
		res, err := member.Commands.Run(ctx, req)
		if err != nil {
			return nil, err
		}
		return res.Msg.GetCommand(), nil
	}
	key := client.NewIdempotencyKey()
	a, err := run(key, fleet.KindInventoryRefresh)
	require.NoError(t, err)
	woken := f.notifier.count(f.node.ID)
	f.cp.Clock.Advance(25 * time.Hour)
	b, err := run(key, fleet.KindInventoryRefresh)
	require.NoError(t, err)
	require.Equal(t, a.GetId(), b.GetId())
	require.Equal(t, a.GetSeq(), b.GetSeq())
	require.Equal(t, woken, f.notifier.count(f.node.ID), "a repeat wakes nobody")
	_, err = run(key, fleet.KindNodeDrain)
	requireCode(t, err, "IDEMPOTENCY_KEY_REUSED")
	c, err := run(client.NewIdempotencyKey(), fleet.KindInventoryRefresh)
	require.NoError(t, err)
	require.Equal(t, a.GetSeq()+1, c.GetSeq(), "a repeat takes no sequence number")
}

// TestSystemCommands: a repeated idempotency key answers the stored
// command and leaves the caller's transaction usable (on PostgreSQL a
// unique violation used to abort it); a different command with the key,
// or params that cannot reach the agent, are refused at once and write
// nothing.
func TestSystemCommands(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	send := func(tx store.Tx, key string, params map[string]any) (string, error) {
		return fleet.SendSystemCommand(ctx, tx, f.notifier, fleet.SystemCommand{
			TenantID: f.node.TenantID, NodeID: f.node.ID, Kind: "allocation.bind", Params: params,
			IdempotencyKey: key, CreatedBy: "system:test", Time: f.cp.Clock.Now(),
		})
	}
	count := func() (n int, nextSeq int64) {
		require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM commands WHERE node_id = $1`, f.node.ID).Scan(&n); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT next_seq FROM nodes WHERE id = $1`, f.node.ID).Scan(&nextSeq)
		}))
		return n, nextSeq
	}
	params := map[string]any{"allocation_id": "rsv_1", "gpus": []any{"GPU-1"}}
	var first, again string
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		if first, err = send(tx, "bind:rsv_1:1", params); err != nil {
			return err
		}
		// The same transaction goes on after the repeat.
		again, err = send(tx, "bind:rsv_1:1", params)
		return err
	}))
	require.Equal(t, first, again)
	var later string
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) (err error) {
		later, err = send(tx, "bind:rsv_1:1", map[string]any{"gpus": []any{"GPU-1"}, "allocation_id": "rsv_1"})
		return err
	}))
	require.Equal(t, first, later)
	n, seq := count()
	require.Equal(t, 1, n)
	require.EqualValues(t, 1, seq, "a repeat hands its sequence number back")

	err := f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := send(tx, "bind:rsv_1:1", map[string]any{"allocation_id": "rsv_2"})
		return err
	})
	require.ErrorIs(t, err, fleet.ErrCommandKeyReused)

	for name, p := range map[string]map[string]any{
		"not JSON": {"x": math.NaN()},
		"too big":  {"blob": strings.Repeat("x", fleet.MaxCommandParamsBytes)},
	} {
		err := f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
			_, err := send(tx, "bind:"+name, p)
			return err
		})
		require.ErrorIs(t, err, fleet.ErrCommandUnencodable, name)
	}
	n, seq = count()
	require.Equal(t, 1, n, "a refused command writes nothing")
	require.EqualValues(t, 1, seq)
}

// TestInventorySectionEmpty: an empty section (nil data, as a host without
// disks or GPUs sends it) is stored, not refused by the NOT NULL column.
func TestInventorySectionEmpty(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return fleet.InventorySectionPut(ctx, tx, f.node.ID, "disks", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", nil)
	}))
	var n int
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT count(*) FROM inventory_sections WHERE node_id = $1 AND data IS NOT NULL`, f.node.ID).Scan(&n)
	}))
	require.Equal(t, 1, n)
}
