package app_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tracing"
	"github.com/better-compute/better-compute/internal/tracing/tracingtest"
)

// noEnv keeps the developer's or CI's OTEL_* variables out of a test.
func noEnv(string) string { return "" }

// traceSetup starts a control plane whose tracing config is cfg, one
// simulated bcd (tracing with bcdTracing) joined to tenant acme, and a pool
// gpu over its H100s.
func traceSetup(t *testing.T, cfg tracing.Config, bcdTracing *tracing.Provider) *bctest.ControlPlane {
	t.Helper()
	cp := bctest.NewControlPlane(t, func(c *app.Config) { c.Tracing = cfg })
	ctx := context.Background()
	admin := cp.Admin()
	_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	_, err = admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "default"}))
	require.NoError(t, err)
	tmpl := bctest.FakeDaemonConfig{Gateway: cp.GatewayAddr}
	if bcdTracing != nil {
		tmpl.Tracing = bcdTracing
	}
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: tmpl, Root: t.TempDir(), N: 1,
		Token: func(ctx context.Context, i int) (string, error) {
			tok, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "default"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	eventually(t, "a node with 8 GPUs", func() bool { return countRows(t, cp, `SELECT COUNT(*) FROM gpus`) == 8 })
	_, err = admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "gpu",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)
	return cp
}

// reserveUntilActive creates a 2-GPU reservation (with the caller's
// traceparent when not empty) and waits until its node has bound it.
func reserveUntilActive(t *testing.T, cp *bctest.ControlPlane, traceparent string) *apiv1.Reservation {
	t.Helper()
	ctx := context.Background()
	req := connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "acme", Pool: "gpu", Gpus: 2, DurationSeconds: 3600})
	if traceparent != "" {
		req.Header().Set("Traceparent", traceparent)
	}
	res, err := cp.Admin().Reservations.Create(ctx, req)
	require.NoError(t, err)
	id := res.Msg.GetReservation().GetId()
	var got *apiv1.Reservation
	eventually(t, "reservation active", func() bool {
		g, err := cp.Admin().Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: id}))
		require.NoError(t, err)
		got = g.Msg.GetReservation()
		return got.GetState() == "active"
	})
	return got
}

// bindTraceparent is the traceparent stored on the reservation's
// allocation.bind command row.
func bindTraceparent(t *testing.T, cp *bctest.ControlPlane, rsv *apiv1.Reservation) string {
	t.Helper()
	var tp string
	require.NoError(t, cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT traceparent FROM commands WHERE kind = 'allocation.bind' AND params LIKE $1`,
			"%"+rsv.GetId()+"%").Scan(&tp)
	}))
	return tp
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// TestTraceReservationToAgent: one reservation's trace, exported over OTLP
// to a real gRPC collector by the control plane and by a real bcd, runs
// from the caller's traceparent through the API call, the placement, the
// allocation.bind command's send, the agent applying it, to the command's
// completion — one trace id, each span the child of the one before, the
// placer's batch linked to the API call and the completion to the agent's
// span.
func TestTraceReservationToAgent(t *testing.T) {
	t.Parallel()
	col := tracingtest.Start(t)
	cfg := tracing.Config{Endpoint: col.Endpoint(), Insecure: true, BatchTimeout: 10 * time.Millisecond, Getenv: noEnv}
	bcdCfg := cfg
	bcdCfg.ServiceName = "bcd"
	bcdTP, err := tracing.New(context.Background(), bcdCfg)
	require.NoError(t, err)
	require.True(t, bcdTP.Enabled())
	t.Cleanup(func() { _ = bcdTP.Shutdown(context.Background()) })
	cp := traceSetup(t, cfg, bcdTP)
	require.True(t, cp.App.Tracing.Enabled())

	traceID, callerSpan := randomHex(t, 16), randomHex(t, 8)
	rsv := reserveUntilActive(t, cp, fmt.Sprintf("00-%s-%s-01", traceID, callerSpan))
	require.Contains(t, bindTraceparent(t, cp, rsv), traceID, "the bind command row carries the trace")

	const create = "/bettercompute.api.v1.ReservationService/Create"
	inTrace := func(spans []tracingtest.Span) []tracingtest.Span {
		return slices.DeleteFunc(slices.Clone(spans), func(s tracingtest.Span) bool { return s.TraceID != traceID })
	}
	spans := col.WaitFor(t, "the reservation's trace through to the command's completion", func(spans []tracingtest.Span) bool {
		// bcd exports through its own provider, so its span can arrive
		// after the control plane's completion: wait for both.
		_, done := tracingtest.Find(inTrace(spans), "better-compute", "command.complete")
		_, applied := tracingtest.Find(inTrace(spans), "bcd", "bcd.command")
		_, batch := tracingtest.Find(spans, "better-compute", "placer.batch")
		return done && applied && batch
	})
	trace := inTrace(spans)
	find := func(service, name string) tracingtest.Span {
		t.Helper()
		s, ok := tracingtest.Find(trace, service, name)
		require.True(t, ok, "span %s/%s in trace %s; got:\n%v", service, name, traceID, trace)
		return s
	}
	api := find("better-compute", create)
	require.Equal(t, callerSpan, api.ParentSpanID, "the API span continues the caller's traceparent")
	require.Equal(t, "SERVER", api.Kind)
	require.Equal(t, "allow", api.Attrs["bc.decision"])
	require.Equal(t, "OK", api.Attrs["bc.code"])
	require.Equal(t, "user", api.Attrs["bc.principal.kind"])
	require.NotEmpty(t, api.Attrs["bc.tenant.id"])

	place := find("better-compute", "placer.place")
	require.Equal(t, api.SpanID, place.ParentSpanID, "placement is a child of the API call")
	require.NotEmpty(t, place.Attrs["bc.placer.batch_size"])

	var send tracingtest.Span
	for _, s := range trace {
		if s.Name == "command.send" && s.Attrs["bc.command.kind"] == "allocation.bind" {
			send = s
		}
	}
	require.Equal(t, place.SpanID, send.ParentSpanID, "the bind command is sent from the placement; got:\n%v", trace)
	require.Equal(t, rsv.GetPlacement().GetNodeId(), send.Attrs["bc.node.id"])

	applied := find("bcd", "bcd.command")
	require.Equal(t, send.SpanID, applied.ParentSpanID, "bcd applies the command in a child of its send span")
	require.Equal(t, "allocation.bind", applied.Attrs["bc.command.kind"])
	require.Equal(t, "COMMAND_STATE_SUCCEEDED", applied.Attrs["bc.command.state"])

	done := find("better-compute", "command.complete")
	require.Equal(t, send.SpanID, done.ParentSpanID, "the command's span hangs off its send")
	require.Equal(t, "succeeded", done.Attrs["bc.command.state"])
	require.Contains(t, done.Links, tracingtest.Link{TraceID: traceID, SpanID: applied.SpanID}, "linked to the agent's span from the update's traceparent")

	// The batch is a root of its own (it may carry other callers'
	// placements), linked to each caller's API span.
	var batch tracingtest.Span
	for _, s := range spans {
		if s.Name == "placer.batch" && slices.Contains(s.Links, tracingtest.Link{TraceID: traceID, SpanID: api.SpanID}) {
			batch = s
		}
	}
	require.NotEmpty(t, batch.SpanID, "a placer.batch span linked to the API call")
	require.Empty(t, batch.ParentSpanID)
	require.NotEmpty(t, batch.Attrs["bc.placer.batch_size"])
	require.Contains(t, place.Links, tracingtest.Link{TraceID: batch.TraceID, SpanID: batch.SpanID}, "the placement links its batch")

	// The audit row of the call names the same trace.
	require.Equal(t, 1, countRows(t, cp, `SELECT COUNT(*) FROM audit_log WHERE trace_id = $1 AND action = 'reservations.create'`, traceID))
}

// TestTracingOff: with tracing off (here OTEL_SDK_DISABLED wins over a
// configured endpoint) nothing is exported — the control plane holds no
// exporter at all — and commands go to the node with no traceparent, even
// when the caller sent one; its trace id still reaches the audit row.
func TestTracingOff(t *testing.T) {
	t.Parallel()
	col := tracingtest.Start(t)
	disabled := func(k string) string {
		if k == tracing.EnvSDKDisabled {
			return "true"
		}
		return ""
	}
	cp := traceSetup(t, tracing.Config{Endpoint: col.Endpoint(), Insecure: true, Getenv: disabled}, nil)
	require.False(t, cp.App.Tracing.Enabled(), "OTEL_SDK_DISABLED=true turns tracing off")
	traceID := randomHex(t, 16)
	rsv := reserveUntilActive(t, cp, fmt.Sprintf("00-%s-%s-01", traceID, randomHex(t, 8)))
	require.Empty(t, bindTraceparent(t, cp, rsv))
	require.Zero(t, countRows(t, cp, `SELECT COUNT(*) FROM commands WHERE traceparent <> ''`))
	require.Equal(t, 1, countRows(t, cp, `SELECT COUNT(*) FROM audit_log WHERE trace_id <> ''`), "only the call that sent a traceparent")
	require.Equal(t, 1, countRows(t, cp, `SELECT COUNT(*) FROM audit_log WHERE trace_id = $1 AND action = 'reservations.create'`, traceID))
	require.NoError(t, cp.App.Tracing.ForceFlush(context.Background()))
	require.Empty(t, col.Spans())
}
