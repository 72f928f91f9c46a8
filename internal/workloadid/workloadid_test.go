package workloadid_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/sandbox"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/workloadid"
)

type fixture struct {
	cp                     *bctest.ControlPlane
	member, viewer, evil   *client.Client
	acme, web, other       string
	sandboxID, rsvID, rsv2 string
}

func setup(t *testing.T) *fixture {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	f := &fixture{cp: cp}
	tenant := func(name string) string {
		res, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
		require.NoError(t, err)
		return res.Msg.GetTenant().GetId()
	}
	key := func(tenant, role string) *client.Client {
		k, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: tenant, Role: role}))
		require.NoError(t, err)
		return cp.Client(k.Msg.GetSecret())
	}
	f.acme, f.other = tenant("acme"), tenant("other")
	p, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "web"}))
	require.NoError(t, err)
	f.web = p.Msg.GetProject().GetId()
	f.member, f.viewer, f.evil = key("acme", "member"), key("acme", "viewer"), key("other", "admin")

	// acme's sandbox and two active reservations, one ending in ten
	// minutes, written as their modules would.
	now := cp.Clock.Now()
	tpl := sandbox.Template{ID: envelope.NewID(sandbox.TemplateIDPrefix, now), TenantID: f.acme, Name: "t1", Image: "debian-12",
		FlavorName: "small", DefaultTTL: time.Hour, MaxTTL: 2 * time.Hour, NetworkPolicy: "egress", Shape: "s1",
		State: sandbox.TemplateActive, CreatedBy: "test", CreateTime: now, UpdateTime: now}
	sbx := sandbox.Sandbox{ID: envelope.NewID(sandbox.SandboxIDPrefix, now), TenantID: f.acme, TemplateID: tpl.ID, TemplateName: "t1",
		State: sandbox.SandboxActive, Origin: sandbox.OriginCold, CreatedBy: "test", ExpireTime: now.Add(time.Hour),
		CreateTime: now, UpdateTime: now}
	f.sandboxID = sbx.ID
	f.rsvID, f.rsv2 = envelope.NewID(reservation.IDPrefix, now), envelope.NewID(reservation.IDPrefix, now.Add(time.Millisecond))
	require.NoError(t, cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if err := errors.Join(sandbox.TemplateInsert(ctx, tx, &tpl), sandbox.SandboxInsert(ctx, tx, &sbx)); err != nil {
			return err
		}
		for id, ends := range map[string]time.Time{f.rsvID: now.Add(24 * time.Hour), f.rsv2: now.Add(10 * time.Minute)} {
			if _, err := tx.Exec(ctx, `INSERT INTO reservations (id, tenant_id, project_id, pool_id, state, gpus, model, gpu_model,
					vcpu, memory_gib, binding, starts_at, ends_at, active_since, created_by, create_time, update_time)
				VALUES ($1, $2, $3, 'pool_x', 'active', 1, 'H100', 'H100', 0, 0, 'none', $4, $5, $4, 'test', $4, $4)`,
				id, f.acme, f.web, now, ends); err != nil {
				return err
			}
		}
		return nil
	}))
	return f
}

func (f *fixture) issue(c *client.Client, tenant, kind, id string, ttl int32) (*apiv1.IssueWorkloadTokenResponse, error) {
	res, err := c.WorkloadIdentity.IssueToken(context.Background(), connect.NewRequest(&apiv1.IssueWorkloadTokenRequest{
		Tenant: tenant, WorkloadKind: kind, Workload: id, Audience: "https://store.example", TtlSeconds: ttl}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// fetch GETs a well-known document from the control plane, with no
// credentials, as a verifier does.
func fetch(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
}

// verify checks a token as an external service would: the JWKS from the
// discovery document's jwks_uri (served by the control plane), go-jose's
// signature check and the standard claims.
func verify(t *testing.T, f *fixture, tok string) (jwt.Claims, workloadid.Claims, string) {
	t.Helper()
	var disco map[string]any
	fetch(t, f.cp.URL+workloadid.DiscoveryPath, &disco)
	require.Equal(t, bctest.WorkloadIssuer, disco["issuer"])
	require.Equal(t, bctest.WorkloadIssuer+"/.well-known/jwks.json", disco["jwks_uri"])
	var set jose.JSONWebKeySet
	fetch(t, f.cp.URL+workloadid.JWKSPath, &set)
	parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.ES256})
	require.NoError(t, err)
	kid := parsed.Headers[0].KeyID
	keys := set.Key(kid)
	require.Len(t, keys, 1, "the token's kid %s is in the JWKS", kid)
	require.True(t, keys[0].IsPublic())
	var (
		reg jwt.Claims
		wc  workloadid.Claims
	)
	require.NoError(t, parsed.Claims(keys[0].Key, &reg, &wc))
	require.NoError(t, reg.ValidateWithLeeway(jwt.Expected{Issuer: bctest.WorkloadIssuer,
		AnyAudience: jwt.Audience{"https://store.example"}, Time: f.cp.Clock.Now()}, 0))
	return reg, wc, kid
}

// TestSandboxTokenVerifiesAgainstJWKS: a member's token for acme's sandbox
// verifies with go-jose against the JWKS the control plane serves, names
// the tenant and the sandbox, and lives the default 15 minutes.
func TestSandboxTokenVerifiesAgainstJWKS(t *testing.T) {
	t.Parallel()
	f := setup(t)
	res, err := f.issue(f.member, "acme", "sandbox", f.sandboxID, 0)
	require.NoError(t, err)
	reg, wc, _ := verify(t, f, res.GetToken())
	require.Equal(t, "tenant:acme:sandbox:"+f.sandboxID, reg.Subject)
	require.Equal(t, res.GetSubject(), reg.Subject)
	require.Equal(t, workloadid.Claims{TenantID: f.acme, Tenant: "acme", WorkloadKind: "sandbox", WorkloadID: f.sandboxID}, wc)
	require.Equal(t, 15*time.Minute, reg.Expiry.Time().Sub(reg.IssuedAt.Time()))
	require.Equal(t, reg.IssuedAt.Time(), reg.NotBefore.Time())
	require.Equal(t, res.GetTokenId(), reg.ID)
	require.Equal(t, res.GetExpireTime().AsTime(), reg.Expiry.Time().UTC())

	// Expired at its exp, to the verifier.
	require.ErrorIs(t, reg.ValidateWithLeeway(jwt.Expected{Time: reg.Expiry.Time().Add(time.Second)}, 0), jwt.ErrExpired)
	// Issuing is audited, on the workload.
	audit, err := f.cp.Admin().Audit.List(context.Background(), connect.NewRequest(&apiv1.ListAuditRequest{Tenant: "acme"}))
	require.NoError(t, err)
	found := false
	for _, e := range audit.Msg.GetEntries() {
		found = found || (e.GetAction() == "workloadTokens.issue" && e.GetResourceId() == f.sandboxID)
	}
	require.True(t, found, "an audit row for the issue")

	// A suspended tenant's workloads get no new token; the one issued
	// before still verifies until its exp (it is short-lived by design).
	_, err = f.cp.Admin().Tenants.Suspend(context.Background(), connect.NewRequest(&apiv1.SuspendTenantRequest{Tenant: "acme"}))
	require.NoError(t, err)
	_, err = f.issue(f.member, "acme", "sandbox", f.sandboxID, 0)
	require.Error(t, err)
	require.Equal(t, "TENANT_SUSPENDED", client.Code(err), "err: %v", err)
}

// TestReservationTokenAndRotation: a reservation's token names its project
// and ends with the reservation; after a rotation new tokens carry the new
// kid and the JWKS keeps the old key, so earlier tokens still verify.
func TestReservationTokenAndRotation(t *testing.T) {
	t.Parallel()
	f := setup(t)
	res, err := f.issue(f.member, "acme", "reservation", f.rsvID, 3600)
	require.NoError(t, err)
	reg, wc, kid1 := verify(t, f, res.GetToken())
	require.Equal(t, "tenant:acme:project:web:reservation:"+f.rsvID, reg.Subject)
	require.Equal(t, f.web, wc.ProjectID)
	require.Equal(t, "web", wc.Project)
	require.Equal(t, time.Hour, reg.Expiry.Time().Sub(reg.IssuedAt.Time()))

	// A token outlives no workload.
	short, err := f.issue(f.member, "acme", "reservation", f.rsv2, 3600)
	require.NoError(t, err)
	reg2, _, _ := verify(t, f, short.GetToken())
	require.Equal(t, f.cp.Clock.Now().Add(10*time.Minute).Unix(), reg2.Expiry.Time().Unix())

	sealer, err := pki.NewSealer(f.cp.Secret)
	require.NoError(t, err)
	kid2, err := pki.NewWorkloadKeys(f.cp.App.DB, sealer).Rotate(context.Background())
	require.NoError(t, err)
	require.NotEqual(t, kid1, kid2)
	next, err := f.issue(f.member, "acme", "reservation", f.rsvID, 0)
	require.NoError(t, err)
	_, _, kid := verify(t, f, next.GetToken())
	require.Equal(t, kid2, kid)
	_, _, kid = verify(t, f, res.GetToken())
	require.Equal(t, kid1, kid, "the previous key is still published")
	var set jose.JSONWebKeySet
	fetch(t, f.cp.URL+workloadid.JWKSPath, &set)
	require.Len(t, set.Keys, pki.WorkloadKeysPublished)
}

// TestIssueRefusals: another tenant's credentials and ids, a viewer, bad
// fields and an ended workload are refused, and nothing is issued.
func TestIssueRefusals(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, c := range []struct {
		name         string
		c            *client.Client
		tenant, kind string
		id           string
		ttl          int32
		codes        []string
	}{
		{"another tenant's admin on acme", f.evil, "acme", "sandbox", f.sandboxID, 0, []string{"PERMISSION_DENIED", "NOT_FOUND"}},
		{"another tenant's admin with acme's id", f.evil, "other", "sandbox", f.sandboxID, 0, []string{"NOT_FOUND"}},
		{"another tenant's admin with acme's reservation", f.evil, "other", "reservation", f.rsvID, 0, []string{"NOT_FOUND"}},
		{"a viewer", f.viewer, "acme", "sandbox", f.sandboxID, 0, []string{"PERMISSION_DENIED"}},
		{"an unknown sandbox", f.member, "acme", "sandbox", "sbx_00000000000000000000000000", 0, []string{"NOT_FOUND"}},
		{"a kind", f.member, "acme", "node", f.sandboxID, 0, []string{"INVALID_ARGUMENT"}},
		{"an id of another kind", f.member, "acme", "sandbox", f.rsvID, 0, []string{"INVALID_ARGUMENT"}},
		{"a lifetime too long", f.member, "acme", "sandbox", f.sandboxID, 3601, []string{"INVALID_ARGUMENT"}},
		{"a lifetime too short", f.member, "acme", "sandbox", f.sandboxID, 30, []string{"INVALID_ARGUMENT"}},
	} {
		_, err := f.issue(c.c, c.tenant, c.kind, c.id, c.ttl)
		require.Contains(t, c.codes, client.Code(err), c.name)
	}
	_, err := f.member.WorkloadIdentity.IssueToken(context.Background(), connect.NewRequest(&apiv1.IssueWorkloadTokenRequest{
		Tenant: "acme", WorkloadKind: "sandbox", Workload: f.sandboxID}))
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err), "an audience is required")
	require.Contains(t, client.Detail(err).GetViolations()[0].GetField(), "audience")

	// An ended workload gets no token.
	_, err = f.member.Reservations.Release(context.Background(), connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "acme", Reservation: f.rsvID}))
	require.NoError(t, err)
	_, err = f.issue(f.member, "acme", "reservation", f.rsvID, 0)
	require.Equal(t, "FAILED_PRECONDITION", client.Code(err))
	f.cp.Clock.Set(f.cp.Clock.Now().Add(time.Hour))
	_, err = f.issue(f.member, "acme", "sandbox", f.sandboxID, 0)
	require.Equal(t, "FAILED_PRECONDITION", client.Code(err), "an expired sandbox")
}

// TestOffWithoutIssuer: without an issuer the documents are 404 and
// IssueToken says what to configure.
func TestOffWithoutIssuer(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t, func(c *app.Config) { c.WorkloadIssuer = "" })
	for _, p := range []string{workloadid.JWKSPath, workloadid.DiscoveryPath} {
		resp, err := http.Get(cp.URL + p)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode, p)
	}
	_, err := cp.Admin().WorkloadIdentity.IssueToken(context.Background(), connect.NewRequest(&apiv1.IssueWorkloadTokenRequest{
		Tenant: "platform", WorkloadKind: "sandbox", Workload: "sbx_00000000000000000000000000", Audience: "x"}))
	require.Equal(t, "FAILED_PRECONDITION", client.Code(err))
	require.Contains(t, err.Error(), "--workload-issuer")
}
