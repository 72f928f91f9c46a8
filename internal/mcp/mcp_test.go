package mcp_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/mcp"
	"github.com/better-compute/better-compute/internal/store"
)

// fixture is a control plane with tenant acme (project web, one simulated
// 8×H100 node in pool "gpus") and tenant other, each with an agent key.
type fixture struct {
	cp               *bctest.ControlPlane
	admin            *client.Client
	acmeAgent, other string
	acmeAgentID      string
	serviceKey       string
	memberKey        string
	pool             string
}

func setup(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	cp := bctest.NewControlPlane(t)
	f := &fixture{cp: cp, admin: cp.Admin()}
	for _, name := range []string{"acme", "other"} {
		_, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
		require.NoError(t, err)
	}
	_, err := f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "web"}))
	require.NoError(t, err)
	_, err = f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "other", Name: "default"}))
	require.NoError(t, err)
	key := func(tenant, role string) (string, string) {
		res, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: tenant, Role: role}))
		require.NoError(t, err)
		return res.Msg.GetSecret(), res.Msg.GetApiKey().GetId()
	}
	f.acmeAgent, f.acmeAgentID = key("acme", "agent")
	f.other, _ = key("other", "agent")
	f.serviceKey, _ = key("acme", "admin")
	f.memberKey, _ = key("acme", "member")

	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr}, Root: t.TempDir(), N: 1,
		Token: func(ctx context.Context, _ int) (string, error) {
			tok, err := f.admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	bctest.WaitFor(t, "the node's 8 GPUs", func() bool {
		var n int
		require.NoError(t, cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT COUNT(*) FROM gpus`).Scan(&n)
		}))
		return n == 8
	})
	p, err := f.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "gpus",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)
	f.pool = p.Msg.GetPool().GetId()
	return f
}

// bearerTransport adds an API key to every request, as an MCP client
// configured with a bearer token does.
type bearerTransport struct{ token string }

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// httpSession connects the SDK's client to /mcp with key.
func (f *fixture) httpSession(t *testing.T, key string) *sdk.ClientSession {
	t.Helper()
	c := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &sdk.StreamableClientTransport{Endpoint: f.cp.URL + mcp.Path,
		HTTPClient: &http.Client{Transport: bearerTransport{key}}, MaxRetries: -1}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// memorySession connects the SDK's client to the stdio flavour of the
// server (the one `better-compute mcp` runs: a fixed API client with key)
// over in-memory pipes.
func (f *fixture) memorySession(t *testing.T, key string) *sdk.ClientSession {
	t.Helper()
	api := f.cp.Client(key)
	srv, err := mcp.New(mcp.Config{Version: "test", Connect: func(context.Context, http.Header) (*client.Client, error) { return api, nil }})
	require.NoError(t, err)
	st, ct := sdk.NewInMemoryTransports()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, st) }()
	c := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cs.Close()
		cancel()
		<-done
	})
	return cs
}

// call calls a tool and decodes its structured output into out.
func call(t *testing.T, cs *sdk.ClientSession, tool string, args map[string]any, out any) *sdk.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: tool, Arguments: args})
	require.NoError(t, err, tool)
	if out != nil && res.StructuredContent != nil {
		b, err := json.Marshal(res.StructuredContent)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, out), string(b))
	}
	return res
}

// refused calls a tool that must be refused and returns why.
func refused(t *testing.T, cs *sdk.ClientSession, tool string, args map[string]any) *mcp.Refusal {
	t.Helper()
	var out struct {
		Error *mcp.Refusal `json:"error"`
	}
	res := call(t, cs, tool, args, &out)
	require.True(t, res.IsError, "%s %v should be refused", tool, args)
	require.NotNil(t, out.Error, "%s: structured error", tool)
	require.Contains(t, res.Content[0].(*sdk.TextContent).Text, out.Error.Code)
	return out.Error
}

func (f *fixture) reservationCount(t *testing.T) int {
	t.Helper()
	res, err := f.admin.Reservations.List(context.Background(), connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: "acme"}))
	require.NoError(t, err)
	return len(res.Msg.GetReservations())
}

func (f *fixture) reservation(t *testing.T, id string) *apiv1.Reservation {
	t.Helper()
	res, err := f.admin.Reservations.Get(context.Background(), connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: id}))
	require.NoError(t, err)
	return res.Msg.GetReservation()
}

var wantTools = []string{"capacity_summary", "create_instance", "create_sandbox", "delete_instance", "delete_sandbox",
	"exec_sandbox", "extend_reservation", "extend_sandbox", "list_nodes", "list_pools", "list_reservations",
	"preview_reservation", "propose_command_batch", "release_reservation", "reserve_gpus", "usage"}

// TestMCPAgentOverHTTP drives every tool and resource over streamable HTTP
// as acme's agent key, through a confirmation a human approves.
func TestMCPAgentOverHTTP(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	cs := f.httpSession(t, f.acmeAgent)

	tools, err := cs.ListTools(ctx, nil)
	require.NoError(t, err)
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
		require.NotNil(t, tl.InputSchema, tl.Name)
		require.NotNil(t, tl.OutputSchema, tl.Name)
	}
	slices.Sort(names)
	require.Equal(t, wantTools, names)

	var pools mcp.PoolsOutput
	res := call(t, cs, "list_pools", nil, &pools)
	require.False(t, res.IsError)
	require.Len(t, pools.Pools, 1)
	require.Equal(t, "gpus", pools.Pools[0].Name)
	require.Equal(t, "acme", pools.Pools[0].Owner)

	// capacity_summary answers what the API answers.
	var capSum mcp.CapacityOutput
	res = call(t, cs, "capacity_summary", nil, &capSum)
	require.False(t, res.IsError, "%v", res.Content)
	direct, err := f.cp.Client(f.acmeAgent).Capacity.Summary(ctx, connect.NewRequest(&apiv1.CapacitySummaryRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, capSum.Rows, len(direct.Msg.GetRows()))

	var preview mcp.PreviewOutput
	res = call(t, cs, "preview_reservation", map[string]any{"pool": "gpus", "gpus": 2, "duration": "4h"}, &preview)
	require.False(t, res.IsError, "%v", res.Content)
	require.True(t, preview.Feasible)
	require.NotNil(t, preview.Placement)
	require.NotNil(t, preview.Explanation)
	// A request no node can hold says why, by node class.
	res = call(t, cs, "preview_reservation", map[string]any{"pool": "gpus", "gpus": 9}, &preview)
	require.False(t, res.IsError, "%v", res.Content)
	require.False(t, preview.Feasible)
	require.NotEmpty(t, preview.Explanation.Lines)
	require.NotEmpty(t, preview.Explanation.Lines[0].Class)
	require.NotEmpty(t, preview.Explanation.Lines[0].Reason)

	// One reservation: exactly one decision, as the agent.
	var made mcp.ReservationOutput
	f.cp.Authz.Reset()
	res = call(t, cs, "reserve_gpus", map[string]any{"pool": "gpus", "gpus": 1, "duration": "1h"}, &made)
	require.False(t, res.IsError, "%v", res.Content)
	require.Equal(t, 1, f.cp.Authz.CallsFor("reservations.create"))
	require.Equal(t, 1, f.cp.Authz.Calls(), "the tenant lookup (WhoAmI) decides nothing")
	r := made.Reservation
	require.NotNil(t, r)
	require.Equal(t, f.acmeAgentID, r.CreatedBy)
	require.Equal(t, int32(1), r.GPUs)

	var list mcp.ReservationsOutput
	call(t, cs, "list_reservations", map[string]any{"pool": "gpus"}, &list)
	require.Len(t, list.Reservations, 1)
	require.Equal(t, r.ID, list.Reservations[0].ID)

	// Resources read the same state without a tool call.
	read, err := cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: "bettercompute://tenants/acme/reservations/" + r.ID})
	require.NoError(t, err)
	var got mcp.Reservation
	require.NoError(t, json.Unmarshal([]byte(read.Contents[0].Text), &got))
	require.Equal(t, r.ID, got.ID)
	read, err = cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: "bettercompute://tenants/acme/pools"})
	require.NoError(t, err)
	require.Contains(t, read.Contents[0].Text, `"name":"gpus"`)
	read, err = cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: "bettercompute://tenants/acme/reservations"})
	require.NoError(t, err)
	require.Contains(t, read.Contents[0].Text, r.ID)
	templates, err := cs.ListResourceTemplates(ctx, nil)
	require.NoError(t, err)
	require.Len(t, templates.ResourceTemplates, 3)

	// Past a day an agent needs a human: CONFIRMATION_REQUIRED, nothing
	// changed, one decision.
	end := f.reservation(t, r.ID).GetEndTime().AsTime()
	f.cp.Authz.Reset()
	ref := refused(t, cs, "extend_reservation", map[string]any{"reservation": r.ID, "by": "1d"})
	require.Equal(t, 1, f.cp.Authz.CallsFor("reservations.extend"))
	require.Equal(t, mcp.CodeConfirmationRequired, ref.Code)
	require.True(t, strings.HasPrefix(ref.ConfirmationID, "cfm_"), ref.ConfirmationID)
	require.Equal(t, "better-compute confirmations approve "+ref.ConfirmationID+" --tenant acme", ref.Approve)
	require.Contains(t, ref.Retry, "confirmation_id "+ref.ConfirmationID)
	require.Equal(t, end, f.reservation(t, r.ID).GetEndTime().AsTime(), "the end waits for a human")

	// The retry before approval is refused; a human approves through the
	// API; the retry with the id goes through.
	ref2 := refused(t, cs, "extend_reservation", map[string]any{"reservation": r.ID, "by": "1d", "confirmation_id": ref.ConfirmationID})
	require.Equal(t, "CONFIRMATION_NOT_USABLE", ref2.Code)
	_, err = f.admin.Confirmations.Approve(ctx, connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: ref.ConfirmationID}))
	require.NoError(t, err)
	var extended mcp.ReservationOutput
	res = call(t, cs, "extend_reservation", map[string]any{"reservation": r.ID, "by": "1d", "confirmation_id": ref.ConfirmationID}, &extended)
	require.False(t, res.IsError, "%v", res.Content)
	require.Equal(t, end.Add(24*time.Hour), f.reservation(t, r.ID).GetEndTime().AsTime())

	// The audit shows the agent, for the hold and for the extension.
	audit, err := f.admin.Audit.List(ctx, connect.NewRequest(&apiv1.ListAuditRequest{Tenant: "acme", Action: "reservations.extend"}))
	require.NoError(t, err)
	var outcomes []string
	for _, e := range audit.Msg.GetEntries() {
		require.Equal(t, f.acmeAgentID, e.GetPrincipalId())
		require.Equal(t, "agent", e.GetPrincipalKind())
		outcomes = append(outcomes, e.GetDecision()+"/"+e.GetResult())
	}
	require.Contains(t, outcomes, "confirmation_required/CONFIRMATION_REQUIRED")
	require.Contains(t, outcomes, "allow/OK")

	var nodes mcp.NodesOutput
	call(t, cs, "list_nodes", nil, &nodes)
	require.Len(t, nodes.Nodes, 1)
	require.Equal(t, int32(8), nodes.Nodes[0].GPUCount)
	var usage mcp.UsageOutput
	res = call(t, cs, "usage", map[string]any{"since": "1d"}, &usage)
	require.False(t, res.IsError, "%v", res.Content)

	var released mcp.ReservationOutput
	f.cp.Authz.Reset()
	res = call(t, cs, "release_reservation", map[string]any{"reservation": r.ID}, &released)
	require.False(t, res.IsError, "%v", res.Content)
	require.Equal(t, 1, f.cp.Authz.CallsFor("reservations.release"))
	require.Equal(t, "released", f.reservation(t, r.ID).GetState())
}
