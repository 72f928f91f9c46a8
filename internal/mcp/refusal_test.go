package mcp_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/mcp"
)

// TestMCPBadInput: an argument out of range is a tool error naming the
// argument, and nothing is written — over the stdio flavour (in-memory
// pipes) as over HTTP.
func TestMCPBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t)
	sessions := map[string]*sdk.ClientSession{"memory": f.memorySession(t, f.acmeAgent), "http": f.httpSession(t, f.acmeAgent)}
	for name, cs := range sessions {
		cases := []struct {
			tool  string
			args  map[string]any
			code  string
			field string
		}{
			{"reserve_gpus", map[string]any{"pool": "gpus", "gpus": -1}, "INVALID_ARGUMENT", "gpus"},
			{"reserve_gpus", map[string]any{"pool": "gpus", "gpus": 1, "duration": "forever"}, "INVALID_ARGUMENT", "duration"},
			{"reserve_gpus", map[string]any{"pool": "gpus", "gpus": 1, "duration": "-4h"}, "INVALID_ARGUMENT", "duration"},
			{"reserve_gpus", map[string]any{"pool": "gpus", "gpus": 1, "duration": "90d"}, "INVALID_ARGUMENT", "duration"},
			{"reserve_gpus", map[string]any{"pool": "gpus", "gpus": 1, "confirmation_id": "nope"}, "INVALID_ARGUMENT", "confirmation_id"},
			{"preview_reservation", map[string]any{"pool": "gpus", "gpus": -1}, "INVALID_ARGUMENT", "gpus"},
			{"extend_reservation", map[string]any{"reservation": "rsv_x", "by": "forever"}, "INVALID_ARGUMENT", "by"},
			{"list_reservations", map[string]any{"state": "sideways"}, "INVALID_ARGUMENT", "state"},
			{"usage", map[string]any{"since": "a while"}, "INVALID_ARGUMENT", "since"},
		}
		for _, c := range cases {
			f.cp.Authz.Reset()
			r := refused(t, cs, c.tool, c.args)
			require.Equal(t, c.code, r.Code, "%s %s %v: %s", name, c.tool, c.args, r.Message)
			var fields []string
			for _, v := range r.Violations {
				fields = append(fields, v.Field)
			}
			require.Contains(t, fields, c.field, "%s %s %v: %+v", name, c.tool, c.args, r)
			require.Zero(t, f.cp.Authz.CallsFor("reservations.create"), "refused before any decision")
		}
		// A type the schema refuses never reaches the tool.
		res := call(t, cs, "reserve_gpus", map[string]any{"pool": "gpus", "gpus": "two"}, nil)
		require.True(t, res.IsError)
		require.Contains(t, res.Content[0].(*sdk.TextContent).Text, "gpus")
	}
	require.Zero(t, f.reservationCount(t), "nothing written")
}

// TestMCPCrossTenant: an agent key of tenant other reaches nothing of acme
// through any tool or resource, over either transport.
func TestMCPCrossTenant(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	acme := f.memorySession(t, f.acmeAgent)
	var made mcp.ReservationOutput
	res := call(t, acme, "reserve_gpus", map[string]any{"pool": "gpus", "gpus": 2, "duration": "2h"}, &made)
	require.False(t, res.IsError, "%v", res.Content)
	id := made.Reservation.ID
	before := f.reservation(t, id)

	for name, cs := range map[string]*sdk.ClientSession{"memory": f.memorySession(t, f.other), "http": f.httpSession(t, f.other)} {
		for _, c := range []struct {
			tool string
			args map[string]any
		}{
			{"list_pools", map[string]any{"tenant": "acme"}},
			{"capacity_summary", map[string]any{"tenant": "acme"}},
			{"preview_reservation", map[string]any{"tenant": "acme", "pool": "gpus", "gpus": 1}},
			{"reserve_gpus", map[string]any{"tenant": "acme", "pool": "gpus", "gpus": 1}},
			{"reserve_gpus", map[string]any{"pool": "acme/gpus", "gpus": 1}},
			{"list_reservations", map[string]any{"tenant": "acme"}},
			{"extend_reservation", map[string]any{"tenant": "acme", "reservation": id, "by": "1h"}},
			{"extend_reservation", map[string]any{"reservation": id, "by": "1h"}},
			{"release_reservation", map[string]any{"tenant": "acme", "reservation": id}},
			{"release_reservation", map[string]any{"reservation": id}},
			{"list_nodes", map[string]any{"tenant": "acme"}},
			{"usage", map[string]any{"tenant": "acme"}},
		} {
			r := refused(t, cs, c.tool, c.args)
			require.Contains(t, []string{"PERMISSION_DENIED", "NOT_FOUND"}, r.Code, "%s %s %v: %s", name, c.tool, c.args, r.Message)
		}
		// Its own tenant shows none of acme's.
		var pools mcp.PoolsOutput
		call(t, cs, "list_pools", nil, &pools)
		require.Empty(t, pools.Pools, name)
		var list mcp.ReservationsOutput
		call(t, cs, "list_reservations", nil, &list)
		require.Empty(t, list.Reservations, name)
		for _, uri := range []string{"bettercompute://tenants/acme/pools", "bettercompute://tenants/acme/reservations",
			"bettercompute://tenants/acme/reservations/" + id, "bettercompute://tenants/other/reservations/" + id} {
			_, err := cs.ReadResource(ctx, &sdk.ReadResourceParams{URI: uri})
			require.Error(t, err, "%s %s", name, uri)
			require.NotContains(t, err.Error(), `"gpus"`)
		}
	}
	after := f.reservation(t, id)
	// Binding goes on to active by itself; nothing of other's ended it.
	require.Contains(t, []string{"placed", "binding", "active"}, after.GetState())
	require.Equal(t, before.GetEndTime().AsTime(), after.GetEndTime().AsTime())
	require.Equal(t, 1, f.reservationCount(t))
}

// TestMCPHTTPRefusesOtherKeys: /mcp lets in only API keys of kind agent;
// every other caller gets a clear refusal before any session exists.
func TestMCPHTTPRefusesOtherKeys(t *testing.T) {
	t.Parallel()
	f := setup(t)
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}`
	post := func(auth string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, f.cp.URL+mcp.Path, strings.NewReader(initialize))
		require.NoError(t, err)
		// As through a reverse proxy on the same host.
		req.Host = "bc.example.com"
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(b)
	}
	code := func(body string) string {
		var v struct {
			Error mcp.Refusal `json:"error"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &v), body)
		return v.Error.Code
	}
	for _, c := range []struct {
		auth, code string
		status     int
		says       string
	}{
		{"", "UNAUTHENTICATED", http.StatusUnauthorized, "missing Authorization"},
		{"Bearer bc_nonsense", "UNAUTHENTICATED", http.StatusUnauthorized, "malformed API key"},
		{"Bearer " + f.cp.AdminKey, "PERMISSION_DENIED", http.StatusForbidden, "is a user key"},
		{"Bearer " + f.serviceKey, "PERMISSION_DENIED", http.StatusForbidden, "is a service key"},
		{"Bearer " + f.memberKey, "PERMISSION_DENIED", http.StatusForbidden, "kind agent"},
	} {
		status, body := post(c.auth)
		require.Equal(t, c.status, status, body)
		require.Equal(t, c.code, code(body), body)
		require.Contains(t, body, c.says)
	}
	status, body := post("Bearer " + f.acmeAgent)
	require.Equal(t, http.StatusOK, status, body)

	// A body past the API's limit is refused whole.
	big := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"pad":"` + strings.Repeat("x", 2<<20) + `"}}`
	req, err := http.NewRequest(http.MethodPost, f.cp.URL+mcp.Path, strings.NewReader(big))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+f.acmeAgent)
	tooBig, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = tooBig.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, tooBig.StatusCode)

	// A session is tied to the key that opened it: another agent key cannot
	// ride on its id.
	cs := f.httpSession(t, f.acmeAgent)
	req, err = http.NewRequest(http.MethodPost, f.cp.URL+mcp.Path,
		strings.NewReader(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_reservations","arguments":{"tenant":"acme"}}}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", cs.ID())
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	req.Header.Set("Authorization", "Bearer "+f.other)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusForbidden, res.StatusCode)

	// A key revoked mid-session is refused on its next call.
	_, err = f.admin.ApiKeys.Revoke(context.Background(), connect.NewRequest(&apiv1.RevokeApiKeyRequest{Tenant: "acme", Id: f.acmeAgentID}))
	require.NoError(t, err)
	_, err = cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "list_pools"})
	require.Error(t, err)
}

// TestMCPOfferedPool: once acme offers its pool to other, other's agent
// sees it (with its owner) and reserves from it by owner/name, as its own
// tenant; acme's reservations stay out of its sight.
func TestMCPOfferedPool(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	_, err := f.admin.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "acme", Pool: "gpus", To: []string{"other"}}))
	require.NoError(t, err)
	cs := f.httpSession(t, f.other)
	var pools mcp.PoolsOutput
	call(t, cs, "list_pools", nil, &pools)
	require.Len(t, pools.Pools, 1)
	require.Equal(t, "acme", pools.Pools[0].Owner)
	var made mcp.ReservationOutput
	res := call(t, cs, "reserve_gpus", map[string]any{"pool": "acme/gpus", "gpus": 1, "duration": "1h"}, &made)
	require.False(t, res.IsError, "%v", res.Content)
	require.Equal(t, "gpus", made.Reservation.Pool)
	require.Equal(t, pools.Pools[0].ID, made.Reservation.PoolID)
	var list mcp.ReservationsOutput
	call(t, cs, "list_reservations", nil, &list)
	require.Len(t, list.Reservations, 1)
	require.Equal(t, made.Reservation.ID, list.Reservations[0].ID)
	require.Zero(t, f.reservationCount(t), "acme's own reservations: none")
}
