package app_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/go-jose/go-jose/v4"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/authn"
	"github.com/better-compute/better-compute/internal/envelope"
)

const ocClientID = "bc"

// ocIssuer is an OpenID provider for one test: a discovery document and a
// JWKS with one RSA key, and a signer for ID tokens.
type ocIssuer struct {
	URL string
	key *rsa.PrivateKey
}

func newOCIssuer(t *testing.T) *ocIssuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	iss := &ocIssuer{key: key}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"issuer":                                iss.URL,
			"authorization_endpoint":                iss.URL + "/authorize",
			"token_endpoint":                        iss.URL + "/token",
			"jwks_uri":                              iss.URL + "/jwks",
			"response_types_supported":              []string{"code"},
			"subject_types_supported":               []string{"public"},
			"id_token_signing_alg_values_supported": []string{"RS256"},
		})
	})
	mux.HandleFunc("GET /jwks", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
			{Key: &key.PublicKey, KeyID: "k1", Algorithm: string(jose.RS256), Use: "sig"},
		}})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	iss.URL = srv.URL
	return iss
}

// sign returns a compact JWS of claims signed by key with key id k1.
func ocSign(t *testing.T, key *rsa.PrivateKey, claims map[string]any) string {
	t.Helper()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: "k1"}},
		(&jose.SignerOptions{}).WithType("JWT"))
	require.NoError(t, err)
	payload, err := json.Marshal(claims)
	require.NoError(t, err)
	jws, err := signer.Sign(payload)
	require.NoError(t, err)
	out, err := jws.CompactSerialize()
	require.NoError(t, err)
	return out
}

// claims returns valid claims for sub, issued now by the control plane's
// clock, with edits applied (a nil value deletes a claim).
func (iss *ocIssuer) claims(cp *bctest.ControlPlane, sub, tenant, role string, edits map[string]any) map[string]any {
	now := cp.Clock.Now()
	c := map[string]any{
		"iss": iss.URL, "aud": ocClientID, "sub": sub,
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(),
		"email": sub + "@example.com", "bc_tenant": tenant, "bc_role": role,
	}
	maps.Copy(c, edits)
	for k, v := range edits {
		if v == nil {
			delete(c, k)
		}
	}
	return c
}

func (iss *ocIssuer) token(t *testing.T, cp *bctest.ControlPlane, sub, tenant, role string, edits map[string]any) string {
	t.Helper()
	return ocSign(t, iss.key, iss.claims(cp, sub, tenant, role, edits))
}

func newOIDCControlPlane(t *testing.T) (*bctest.ControlPlane, *ocIssuer) {
	t.Helper()
	iss := newOCIssuer(t) // up before the control plane fetches discovery
	cp := bctest.NewControlPlane(t, func(c *app.Config) {
		c.OIDC = authn.OIDCConfig{Issuer: iss.URL, ClientID: ocClientID}
	})
	return cp, iss
}

func TestOIDCUser(t *testing.T) {
	t.Parallel()
	cp, iss := newOIDCControlPlane(t)
	ctx := context.Background()
	acme := sfTenant(t, cp.Admin(), "acme")
	sfTenant(t, cp.Admin(), "other")

	alice := cp.Client(iss.token(t, cp, "alice", "acme", "admin", nil))
	who, err := alice.Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
	require.NoError(t, err)
	require.Equal(t, "user", who.Msg.GetKind())
	require.Equal(t, "oidc", who.Msg.GetAuthenticatedBy())
	require.Equal(t, "admin", who.Msg.GetRole())
	require.Equal(t, acme.GetId(), who.Msg.GetTenantId())
	require.Equal(t, "acme", who.Msg.GetTenantName())
	require.Equal(t, "alice@example.com", who.Msg.GetName())

	res, err := alice.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "web"}))
	require.NoError(t, err)
	require.Equal(t, acme.GetId(), res.Msg.GetProject().GetTenantId())

	// The audit row names the OIDC user.
	aud, err := cp.Admin().Audit.List(ctx, connect.NewRequest(&apiv1.ListAuditRequest{Tenant: "acme", Action: "projects.create"}))
	require.NoError(t, err)
	require.NotEmpty(t, aud.Msg.GetEntries())
	require.Equal(t, who.Msg.GetPrincipalId(), aud.Msg.GetEntries()[0].GetPrincipalId())
	require.Equal(t, "user", aud.Msg.GetEntries()[0].GetPrincipalKind())

	// Its role is bounded by its tenant.
	_, err = alice.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "other", Name: "web"}))
	sfRequireCode(t, err, "PERMISSION_DENIED")
	_, err = alice.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "mine"}))
	sfRequireCode(t, err, "PERMISSION_DENIED")

	// A viewer token reads but does not write.
	bob := cp.Client(iss.token(t, cp, "bob", "acme", "viewer", nil))
	_, err = bob.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "acme", Project: "web"}))
	require.NoError(t, err)
	_, err = bob.Projects.Delete(ctx, connect.NewRequest(&apiv1.DeleteProjectRequest{Tenant: "acme", Project: "web"}))
	sfRequireCode(t, err, "PERMISSION_DENIED")
}

func TestOIDCRefusedTokens(t *testing.T) {
	t.Parallel()
	cp, iss := newOIDCControlPlane(t)
	ctx := context.Background()
	sfTenant(t, cp.Admin(), "acme")
	otherKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	now := cp.Clock.Now()

	valid := iss.token(t, cp, "alice", "acme", "admin", nil)
	cases := []struct {
		name  string
		token string
	}{
		{"nonexistent tenant", iss.token(t, cp, "alice", "ghost", "admin", nil)},
		{"wrong audience", iss.token(t, cp, "alice", "acme", "admin", map[string]any{"aud": "someone-else"})},
		{"wrong issuer", iss.token(t, cp, "alice", "acme", "admin", map[string]any{"iss": "https://evil.example.com"})},
		{"expired", iss.token(t, cp, "alice", "acme", "admin", map[string]any{"iat": now.Add(-2 * time.Hour).Unix(), "exp": now.Add(-time.Hour).Unix()})},
		{"not yet valid", iss.token(t, cp, "alice", "acme", "admin", map[string]any{"nbf": now.Add(time.Hour).Unix()})},
		{"bad signature", ocSign(t, otherKey, iss.claims(cp, "alice", "acme", "admin", nil))},
		{"corrupted signature bytes", valid[:len(valid)-4] + "AAAA"},
		{"missing role", iss.token(t, cp, "alice", "acme", "", map[string]any{"bc_role": nil})},
		{"unknown role", iss.token(t, cp, "alice", "acme", "platform-admin", nil)},
		{"agent role", iss.token(t, cp, "alice", "acme", "agent", nil)},
		{"missing tenant", iss.token(t, cp, "alice", "", "admin", map[string]any{"bc_tenant": nil})},
		{"not a jwt", "definitely.not.ajwt"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := cp.Client(tc.token)
			before := sfCounts(t, cp)
			_, err := c.Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
			sfRequireCode(t, err, "UNAUTHENTICATED")
			_, err = c.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "web"}))
			sfRequireCode(t, err, "UNAUTHENTICATED")
			sfRequireDelta(t, before, sfCounts(t, cp), nil)
		})
	}

	// The valid token works, and stops working when it expires by the
	// control plane's clock.
	c := cp.Client(valid)
	_, err = c.Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
	require.NoError(t, err)
	cp.Clock.Advance(2 * time.Hour)
	_, err = c.Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
	sfRequireCode(t, err, "UNAUTHENTICATED")
}

func TestOIDCUserApprovesConfirmation(t *testing.T) {
	t.Parallel()
	cp, iss := newOIDCControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	sfTenant(t, admin, "acme")
	sfProject(t, admin, "acme", "web")
	agentSecret, _ := sfKey(t, admin, "acme", "agent", 0)
	agent := cp.Client(agentSecret)

	_, err := agent.Projects.Delete(ctx, connect.NewRequest(&apiv1.DeleteProjectRequest{Tenant: "acme", Project: "web"}))
	sfRequireCode(t, err, "CONFIRMATION_REQUIRED")
	id := client.Detail(err).GetConfirmationId()

	// A human member may not approve (approvals stay with admins); a human
	// admin of another tenant may not either.
	sfTenant(t, admin, "other")
	for _, tok := range []string{
		iss.token(t, cp, "mallory", "acme", "member", nil),
		iss.token(t, cp, "oscar", "other", "admin", nil),
	} {
		_, err := cp.Client(tok).Confirmations.Approve(ctx, connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: id}))
		sfRequireCode(t, err, "PERMISSION_DENIED")
	}

	alice := cp.Client(iss.token(t, cp, "alice", "acme", "admin", nil))
	who, err := alice.Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
	require.NoError(t, err)
	res, err := alice.Confirmations.Approve(ctx, connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: id}))
	require.NoError(t, err)
	require.Equal(t, envelope.ConfirmationApproved, res.Msg.GetConfirmation().GetState())
	require.Equal(t, who.Msg.GetPrincipalId(), res.Msg.GetConfirmation().GetApprovedBy())

	_, err = agent.Projects.Delete(ctx, sfWithHeader(&apiv1.DeleteProjectRequest{Tenant: "acme", Project: "web"}, client.HeaderConfirmationID, id))
	require.NoError(t, err)
	_, err = admin.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "acme", Project: "web"}))
	sfRequireCode(t, err, "NOT_FOUND")
}
