package provideraccounts_test

import (
	"context"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/providers"
	"github.com/better-compute/better-compute/internal/store"
)

// A provider type for this test binary alone: the accounts service reads
// manifests from the registry, whichever providers are linked in.
func init() {
	providers.Register(providers.Factory{Manifest: providers.Manifest{Type: "test-cloud", Description: "a test manifest",
		Fields: []providers.Field{
			{Name: "token", Secret: true, Required: true, Description: "API token"},
			{Name: "location", Description: "default location"},
		}},
		New: func(providers.Config) (providers.Provider, error) {
			return nil, providers.Errorf("test-cloud", providers.KindNotSupported, "no servers")
		},
	})
}

type fixture struct {
	cp     *bctest.ControlPlane
	admin  *client.Client
	acme   *client.Client // acme's admin
	member *client.Client // acme's member
	globex *client.Client // another tenant's admin
}

func setup(t *testing.T) *fixture {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	f := &fixture{cp: cp, admin: cp.Admin()}
	ctx := context.Background()
	for _, n := range []string{"acme", "globex"} {
		_, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: n}))
		require.NoError(t, err)
	}
	key := func(tenant, role string) *client.Client {
		k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: tenant, Role: role}))
		require.NoError(t, err)
		return cp.Client(k.Msg.GetSecret())
	}
	f.acme, f.member, f.globex = key("acme", "admin"), key("acme", "member"), key("globex", "admin")
	_, err := f.acme.Secrets.Put(ctx, connect.NewRequest(&apiv1.PutSecretRequest{Tenant: "acme", Name: "hc-token",
		Value: []byte("s3cret-provider-token")}))
	require.NoError(t, err)
	return f
}

func (f *fixture) count(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT COUNT(*) FROM provider_accounts`).Scan(&n)
	}))
	return n
}

func refused(t *testing.T, err error, code, field, reason string) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, code, client.Code(err), "err: %v", err)
	d := client.Detail(err)
	if field == "" {
		require.Contains(t, d.GetMessage(), reason)
		return
	}
	for _, v := range d.GetViolations() {
		if v.GetField() == field {
			require.Contains(t, v.GetReason(), reason)
			return
		}
	}
	t.Fatalf("no violation of %s in %v", field, d.GetViolations())
}

// TestProviderAccounts: an account is checked against its type's manifest
// (a credential only as a reference to a secret the tenant has, settings
// only as settings), shows references and never a value, is the admin's
// to create, and is invisible to another tenant.
func TestProviderAccounts(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	create := func(c *client.Client, req *apiv1.CreateProviderAccountRequest) (*apiv1.ProviderAccount, error) {
		res, err := c.ProviderAccounts.Create(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, err
		}
		return res.Msg.GetAccount(), nil
	}
	good := func() *apiv1.CreateProviderAccountRequest {
		return &apiv1.CreateProviderAccountRequest{Tenant: "acme", Name: "hc", Type: "test-cloud",
			Settings: map[string]string{"location": "fsn1"}, SecretRefs: map[string]string{"token": "secret://hc-token"}}
	}

	types, err := f.member.ProviderAccounts.ListTypes(ctx, connect.NewRequest(&apiv1.ListProviderTypesRequest{}))
	require.NoError(t, err)
	var found bool
	for _, pt := range types.Msg.GetTypes() {
		if pt.GetType() == "test-cloud" {
			found = true
			require.Len(t, pt.GetFields(), 2)
			require.True(t, pt.GetFields()[0].GetSecret())
		}
	}
	require.True(t, found, "the registered type is listed")

	// Bad input: a clear field and reason, nothing written.
	for _, c := range []struct {
		mutate      func(*apiv1.CreateProviderAccountRequest)
		code, field string
		reason      string
	}{
		{func(r *apiv1.CreateProviderAccountRequest) { r.Type = "" }, "INVALID_ARGUMENT", "type", "is required"},
		{func(r *apiv1.CreateProviderAccountRequest) { r.Type = "aws" }, "INVALID_ARGUMENT", "type", "must be one of"},
		{func(r *apiv1.CreateProviderAccountRequest) {
			r.Settings["token"] = "s3cret-provider-token"
			delete(r.SecretRefs, "token")
		}, "INVALID_ARGUMENT", "settings.token", "is a credential"},
		{func(r *apiv1.CreateProviderAccountRequest) { r.SecretRefs = nil }, "INVALID_ARGUMENT", "secret_refs.token", "is required"},
		{func(r *apiv1.CreateProviderAccountRequest) { r.SecretRefs["location"] = "secret://hc-token" }, "INVALID_ARGUMENT", "secret_refs.location", "is not a credential"},
		{func(r *apiv1.CreateProviderAccountRequest) { r.Settings["zone"] = "x" }, "INVALID_ARGUMENT", "settings.zone", "is not a setting"},
		{func(r *apiv1.CreateProviderAccountRequest) { r.SecretRefs["token"] = "hc-token" }, "INVALID_ARGUMENT", "secret_refs.token", "secret://"},
		{func(r *apiv1.CreateProviderAccountRequest) { r.SecretRefs["token"] = "secret://nope" }, "INVALID_ARGUMENT", "secret_refs.token", "names no secret"},
		{func(r *apiv1.CreateProviderAccountRequest) { r.Endpoint = "ftp://x" }, "INVALID_ARGUMENT", "endpoint", "http(s) URL"},
		{func(r *apiv1.CreateProviderAccountRequest) { r.Endpoint = "https://u:p@x" }, "INVALID_ARGUMENT", "endpoint", "without credentials"},
		// The control plane calls the endpoint: a tenant cannot aim it.
		{func(r *apiv1.CreateProviderAccountRequest) { r.Endpoint = "http://10.0.0.1:8080" }, "PERMISSION_DENIED", "endpoint", "platform admin"},
		{func(r *apiv1.CreateProviderAccountRequest) { r.Name = "Bad Name" }, "INVALID_ARGUMENT", "name", ""},
	} {
		req := good()
		c.mutate(req)
		_, err := create(f.acme, req)
		refused(t, err, c.code, c.field, c.reason)
	}
	require.Zero(t, f.count(t), "nothing written")

	// A member cannot create one (it spends at a provider, with a secret).
	_, err = create(f.member, good())
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))

	a, err := create(f.acme, good())
	require.NoError(t, err)
	require.Equal(t, "secret://hc-token", a.GetSecretRefs()["token"])
	b, err := protojson.Marshal(a)
	require.NoError(t, err)
	require.NotContains(t, string(b), "s3cret-provider-token", "the value never leaves")
	_, err = create(f.acme, good())
	require.Equal(t, "ALREADY_EXISTS", client.Code(err))

	// The platform may aim an account at another endpoint (an emulator, a
	// private region).
	withEndpoint := good()
	withEndpoint.Name, withEndpoint.Endpoint = "hc-lab", "http://127.0.0.1:9"
	_, err = create(f.admin, withEndpoint)
	require.NoError(t, err)

	// The member reads it; another tenant cannot find it.
	got, err := f.member.ProviderAccounts.Get(ctx, connect.NewRequest(&apiv1.GetProviderAccountRequest{Tenant: "acme", Account: "hc"}))
	require.NoError(t, err)
	require.Equal(t, a.GetId(), got.Msg.GetAccount().GetId())
	_, err = f.globex.ProviderAccounts.Get(ctx, connect.NewRequest(&apiv1.GetProviderAccountRequest{Tenant: "globex", Account: a.GetId()}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
	_, err = f.globex.ProviderAccounts.Get(ctx, connect.NewRequest(&apiv1.GetProviderAccountRequest{Tenant: "acme", Account: a.GetId()}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
	_, err = f.globex.ProviderAccounts.Delete(ctx, connect.NewRequest(&apiv1.DeleteProviderAccountRequest{Tenant: "globex", Account: a.GetId()}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
	list, err := f.globex.ProviderAccounts.List(ctx, connect.NewRequest(&apiv1.ListProviderAccountsRequest{Tenant: "globex"}))
	require.NoError(t, err)
	require.Empty(t, list.Msg.GetAccounts())
	list, err = f.member.ProviderAccounts.List(ctx, connect.NewRequest(&apiv1.ListProviderAccountsRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetAccounts(), 2)

	_, err = f.acme.ProviderAccounts.Delete(ctx, connect.NewRequest(&apiv1.DeleteProviderAccountRequest{Tenant: "acme", Account: "hc"}))
	require.NoError(t, err)
	_, err = f.acme.ProviderAccounts.Get(ctx, connect.NewRequest(&apiv1.GetProviderAccountRequest{Tenant: "acme", Account: "hc"}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
}
