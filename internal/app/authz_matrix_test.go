package app_test

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
)

// principals of the matrix, all of tenant acme except the platform admin.
var matrixPrincipals = []string{"platform-admin", "admin", "member", "viewer", "agent"}

// matrixExpect is the authorization matrix: for every mutation in the
// catalog, the outcome each principal gets. Adding a mutation to the catalog
// without a row here fails TestAuthzMatrix.
var matrixExpect = map[string]map[string]string{
	"tenants.create":  {"platform-admin": "OK", "admin": "PERMISSION_DENIED", "member": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"projects.create": {"platform-admin": "OK", "admin": "OK", "member": "OK", "viewer": "PERMISSION_DENIED", "agent": "OK"},
	"projects.delete": {"platform-admin": "OK", "admin": "OK", "member": "OK", "viewer": "PERMISSION_DENIED", "agent": "CONFIRMATION_REQUIRED"},
	"apiKeys.create":  {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"apiKeys.revoke":  {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	"policies.put":    {"platform-admin": "OK", "admin": "OK", "member": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
	// A service key may hold the admin role but is no human: the decision
	// allows, the approval itself is refused.
	"confirmations.approve": {"platform-admin": "OK", "admin": "PERMISSION_DENIED", "member": "PERMISSION_DENIED", "viewer": "PERMISSION_DENIED", "agent": "PERMISSION_DENIED"},
}

type matrixFixture struct {
	cp      *bctest.ControlPlane
	admin   *client.Client
	keys    map[string]string
	counter atomic.Int64
}

func (f *matrixFixture) name(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, f.counter.Add(1))
}

// matrixCalls makes each mutation with fresh resources, so every cell of the
// matrix is independent.
var matrixCalls = map[string]func(t *testing.T, f *matrixFixture, c *client.Client) error{
	"tenants.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Tenants.Create(context.Background(), connect.NewRequest(&apiv1.CreateTenantRequest{Name: f.name("t")}))
		return err
	},
	"projects.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Projects.Create(context.Background(), connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: f.name("p")}))
		return err
	},
	"projects.delete": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		name := f.name("p")
		_, err := f.admin.Projects.Create(context.Background(), connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: name}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.Projects.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteProjectRequest{Tenant: "acme", Project: name}))
		return err
	},
	"apiKeys.create": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.ApiKeys.Create(context.Background(), connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "viewer"}))
		return err
	},
	"apiKeys.revoke": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		k, err := f.admin.ApiKeys.Create(context.Background(), connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "viewer"}))
		require.NoError(t, err)
		f.cp.Authz.Reset()
		_, err = c.ApiKeys.Revoke(context.Background(), connect.NewRequest(&apiv1.RevokeApiKeyRequest{Tenant: "acme", Id: k.Msg.GetApiKey().GetId()}))
		return err
	},
	"policies.put": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		_, err := c.Policies.Put(context.Background(), connect.NewRequest(&apiv1.PutPolicyRequest{
			Tenant: "acme", Id: f.name("pol"),
			Text: `@id("no-viewer-deletes") forbid (principal, action == BC::Action::"projects.delete", resource) when { principal.role == "viewer" };`,
		}))
		return err
	},
	"confirmations.approve": func(t *testing.T, f *matrixFixture, c *client.Client) error {
		name := f.name("p")
		_, err := f.admin.Projects.Create(context.Background(), connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: name}))
		require.NoError(t, err)
		_, err = f.cp.Client(f.keys["agent"]).Projects.Delete(context.Background(), connect.NewRequest(&apiv1.DeleteProjectRequest{Tenant: "acme", Project: name}))
		require.Equal(t, "CONFIRMATION_REQUIRED", client.Code(err))
		f.cp.Authz.Reset()
		_, err = c.Confirmations.Approve(context.Background(), connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: client.Detail(err).GetConfirmationId()}))
		return err
	},
}

// TestCatalogCoversAPI fails when the API serves a procedure that has no
// catalog row (it would be refused at runtime) or the catalog names one the
// API does not serve.
func TestCatalogCoversAPI(t *testing.T) {
	t.Parallel()
	served := map[string]bool{}
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if fd.Package() != "bettercompute.api.v1" {
			return true
		}
		for i := range fd.Services().Len() {
			svc := fd.Services().Get(i)
			for j := range svc.Methods().Len() {
				served[fmt.Sprintf("/%s/%s", svc.FullName(), svc.Methods().Get(j).Name())] = true
			}
		}
		return true
	})
	_ = apiv1.File_bettercompute_api_v1_tenancy_proto // make sure the descriptors are registered
	require.NotEmpty(t, served)
	for p := range served {
		_, ok := envelope.Lookup(p)
		require.True(t, ok, "procedure %s has no catalog row", p)
	}
	for _, m := range envelope.Catalog() {
		require.True(t, served[m.Procedure], "catalog row %s is not served", m.Procedure)
	}
}

// TestAuthzMatrix runs every mutation of the catalog as every principal kind
// and checks the outcome and that exactly one authorization decision was
// made for it.
func TestAuthzMatrix(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	f := &matrixFixture{cp: cp, admin: cp.Admin(), keys: map[string]string{"platform-admin": cp.AdminKey}}
	_, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	for _, role := range []string{"admin", "member", "viewer", "agent"} {
		k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: role}))
		require.NoError(t, err)
		f.keys[role] = k.Msg.GetSecret()
	}

	var actions []string
	for _, m := range envelope.Catalog() {
		if m.Kind != envelope.KindMutation {
			continue
		}
		actions = append(actions, m.Action)
		require.Contains(t, matrixExpect, m.Action, "mutation %s has no row in the authz matrix", m.Action)
		require.Contains(t, matrixCalls, m.Action, "mutation %s has no call in the authz matrix", m.Action)
	}
	sort.Strings(actions)
	require.Len(t, matrixExpect, len(actions), "the matrix names a mutation the catalog does not have")

	// Cells share one control plane, so they run one after another: the
	// decision counter is global to it.
	for _, action := range actions {
		for _, who := range matrixPrincipals {
			want := matrixExpect[action][who]
			require.NotEmpty(t, want, "no expectation for %s as %s", action, who)
			t.Run(action+"/"+who, func(t *testing.T) {
				cp.Authz.Reset()
				err := matrixCalls[action](t, f, cp.Client(f.keys[who]))
				got := "OK"
				if err != nil {
					got = client.Code(err)
				}
				require.Equal(t, want, got, "err: %v", err)
				require.Equal(t, 1, cp.Authz.CallsFor(action), "decisions for %s", action)
				require.Equal(t, 1, cp.Authz.Calls(), "decisions in total")
			})
		}
	}
}
