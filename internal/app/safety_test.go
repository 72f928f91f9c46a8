package app_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/capacity/budget"
	"github.com/better-compute/better-compute/internal/capacity/quota"
	"github.com/better-compute/better-compute/internal/capacity/reservation"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/imagesig"
	"github.com/better-compute/better-compute/internal/quorum"
	"github.com/better-compute/better-compute/internal/sandbox"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vps"
	"github.com/better-compute/better-compute/internal/webhooks"
)

// Helpers shared by safety_test.go, confirm_test.go, oidc_test.go and
// authzen_test.go. They carry an "sf" prefix so they cannot collide with
// helpers of other test files in this package.

// sfTables are the tables a mutation may write.
var sfTables = []string{"tenants", "projects", "api_keys", "tenant_policies", "audit_log", "events", "confirmations", "idempotency_keys",
	"nodes", "commands", "join_tokens", "join_requests", "quotas", "budgets", "budget_thresholds", "reservations", "bookings",
	"images", "image_signatures", "signer_keys", "image_refs", "webhooks",
	"sites", "machines", "provision_workflows", "provision_steps", "flavors", "ip_pools", "ip_leases", "instances", "volumes", "secrets",
	"sandbox_templates", "sandboxes", "sandbox_warm", "sandbox_snapshots",
	"health_findings", "health_gpus", "health_remediations", "health_breakers"}

// sfCounts returns the row count of every table in sfTables.
func sfCounts(t *testing.T, cp *bctest.ControlPlane) map[string]int {
	t.Helper()
	out := map[string]int{}
	err := cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		for _, tbl := range sfTables {
			var n int
			if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM `+tbl).Scan(&n); err != nil {
				return err
			}
			out[tbl] = n
		}
		return nil
	})
	require.NoError(t, err)
	return out
}

// sfRequireDelta checks that every table changed by exactly the given delta
// (tables not named must be unchanged).
func sfRequireDelta(t *testing.T, before, after map[string]int, delta map[string]int, msgAndArgs ...any) {
	t.Helper()
	want := map[string]int{}
	for k, v := range before {
		want[k] = v + delta[k]
	}
	require.Equal(t, want, after, msgAndArgs...)
}

// sfRequireCode checks an error's machine code.
func sfRequireCode(t *testing.T, err error, code string, msgAndArgs ...any) {
	t.Helper()
	require.Error(t, err, msgAndArgs...)
	require.Equal(t, code, client.Code(err), append([]any{"error: %v", err}, msgAndArgs...)...)
}

// sfRequireViolation checks an INVALID_ARGUMENT error that names field.
func sfRequireViolation(t *testing.T, err error, field string) {
	t.Helper()
	sfRequireCode(t, err, "INVALID_ARGUMENT")
	d := client.Detail(err)
	require.NotNil(t, d, "error %v carries no detail", err)
	var fields []string
	for _, v := range d.GetViolations() {
		fields = append(fields, v.GetField())
	}
	require.Contains(t, fields, field, "violations %v of %v", fields, err)
}

func sfTenant(t *testing.T, c *client.Client, name string) *apiv1.Tenant {
	t.Helper()
	res, err := c.Tenants.Create(context.Background(), connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
	require.NoError(t, err)
	return res.Msg.GetTenant()
}

func sfProject(t *testing.T, c *client.Client, tenant, name string) *apiv1.Project {
	t.Helper()
	res, err := c.Projects.Create(context.Background(), connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: tenant, Name: name}))
	require.NoError(t, err)
	return res.Msg.GetProject()
}

func sfKey(t *testing.T, c *client.Client, tenant, role string, ttlSeconds int64) (string, *apiv1.ApiKey) {
	t.Helper()
	res, err := c.ApiKeys.Create(context.Background(), connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: tenant, Role: role, TtlSeconds: ttlSeconds}))
	require.NoError(t, err)
	return res.Msg.GetSecret(), res.Msg.GetApiKey()
}

// sfWithHeader returns a request carrying one extra header.
func sfWithHeader[T any](msg *T, key, value string) *connect.Request[T] {
	req := connect.NewRequest(msg)
	req.Header().Set(key, value)
	return req
}

// sfWatchReservations opens a reservation watch and returns how it ended; a
// watch that was let in would run until the deadline.
func sfWatchReservations(ctx context.Context, c *client.Client, req *apiv1.WatchReservationsRequest) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := c.Reservations.Watch(ctx, connect.NewRequest(req))
	if err != nil {
		return err
	}
	defer func() { _ = stream.Close() }()
	for stream.Receive() {
	}
	return stream.Err()
}

// sfWatchInstances runs an instance watch and returns how it ended.
func sfWatchInstances(ctx context.Context, c *client.Client, req *apiv1.WatchInstancesRequest) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := c.Instances.Watch(ctx, connect.NewRequest(req))
	if err != nil {
		return err
	}
	defer func() { _ = stream.Close() }()
	for stream.Receive() {
	}
	return stream.Err()
}

// sfExec runs an exec and returns how its stream ended.
func sfExec(ctx context.Context, c *client.Client, req *apiv1.ExecReservationRequest) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := c.Reservations.Exec(ctx, connect.NewRequest(req))
	if err != nil {
		return err
	}
	defer func() { _ = stream.Close() }()
	for stream.Receive() {
	}
	return stream.Err()
}

// --- raw HTTP -------------------------------------------------------------

func TestSafetyRawHTTP(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	sfTenant(t, cp.Admin(), "acme")
	url := cp.URL + apiv1connect.ProjectServiceCreateProcedure

	post := func(t *testing.T, body []byte) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+cp.AdminKey)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		raw, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		out := map[string]any{}
		require.NoError(t, json.Unmarshal(raw, &out), "body %q", raw)
		return res.StatusCode, out
	}

	huge := []byte(`{"tenant":"acme","name":"big","displayName":"` + strings.Repeat("a", app.MaxRequestBytes+1) + `"}`)
	cases := []struct {
		name   string
		body   []byte
		status []int
		codes  []string
	}{
		{"malformed json", []byte(`{"tenant":"acme","name":`), []int{http.StatusBadRequest}, []string{"invalid_argument"}},
		{"not json at all", []byte(`tenant=acme&name=x`), []int{http.StatusBadRequest}, []string{"invalid_argument"}},
		{"unknown field", []byte(`{"tenant":"acme","name":"x","owner":"mallory"}`), []int{http.StatusBadRequest}, []string{"invalid_argument"}},
		{"wrong field type", []byte(`{"tenant":"acme","name":7}`), []int{http.StatusBadRequest}, []string{"invalid_argument"}},
		// Connect refuses a body over WithReadMaxBytes with resource_exhausted
		// (HTTP 429) before decoding it.
		{"oversize body", huge, []int{http.StatusTooManyRequests, http.StatusBadRequest}, []string{"resource_exhausted", "invalid_argument"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := sfCounts(t, cp)
			status, body := post(t, tc.body)
			require.Contains(t, tc.status, status, "body %v", body)
			require.Contains(t, tc.codes, body["code"], "body %v", body)
			sfRequireDelta(t, before, sfCounts(t, cp), nil, "a refused body must write nothing")
		})
	}

	t.Run("curl-style valid json", func(t *testing.T) {
		before := sfCounts(t, cp)
		status, body := post(t, []byte(`{"tenant": "acme", "name": "web", "display_name": "Web"}`))
		require.Equal(t, http.StatusOK, status, "body %v", body)
		p, ok := body["project"].(map[string]any)
		require.True(t, ok, "body %v", body)
		require.Equal(t, "web", p["name"])
		require.True(t, envelope.IsID(p["id"].(string), "prj"), "id %v", p["id"])
		sfRequireDelta(t, before, sfCounts(t, cp), map[string]int{"projects": 1, "audit_log": 1, "events": 1})
	})
}

// --- validation -----------------------------------------------------------

func TestSafetyValidation(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	acme := sfTenant(t, admin, "acme")
	sfProject(t, admin, "acme", "web")

	cases := []struct {
		name  string
		field string
		call  func() error
	}{
		{"tenant name uppercase", "name", func() error {
			_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "Acme"}))
			return err
		}},
		{"tenant name 64 chars", "name", func() error {
			_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: strings.Repeat("a", 64)}))
			return err
		}},
		{"tenant name empty", "name", func() error {
			_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: ""}))
			return err
		}},
		{"tenant name with spaces", "name", func() error {
			_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "ac me"}))
			return err
		}},
		{"tenant name underscore", "name", func() error {
			_, err := admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "ac_me"}))
			return err
		}},
		{"project name uppercase", "name", func() error {
			_, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "Web"}))
			return err
		}},
		{"project name 64 chars", "name", func() error {
			_, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: strings.Repeat("b", 64)}))
			return err
		}},
		{"project name empty", "name", func() error {
			_, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme"}))
			return err
		}},
		{"project name spaces", "name", func() error {
			_, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "my web"}))
			return err
		}},
		{"project tenant bad id", "tenant", func() error {
			_, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "tnt_XYZ", Name: "web2"}))
			return err
		}},
		{"project display name too long", "display_name", func() error {
			_, err := admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "web3", DisplayName: strings.Repeat("d", 201)}))
			return err
		}},
		{"project get bad tenant id", "tenant", func() error {
			_, err := admin.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "tnt_XYZ", Project: "web"}))
			return err
		}},
		{"project get bad project id", "project", func() error {
			_, err := admin.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "acme", Project: "prj_nope"}))
			return err
		}},
		{"project delete bad id", "project", func() error {
			_, err := admin.Projects.Delete(ctx, connect.NewRequest(&apiv1.DeleteProjectRequest{Tenant: "acme", Project: "prj_NOPE"}))
			return err
		}},
		{"tenant get bad id", "tenant", func() error {
			_, err := admin.Tenants.Get(ctx, connect.NewRequest(&apiv1.GetTenantRequest{Tenant: "tnt_XYZ"}))
			return err
		}},
		{"key revoke bad id", "id", func() error {
			_, err := admin.ApiKeys.Revoke(ctx, connect.NewRequest(&apiv1.RevokeApiKeyRequest{Tenant: "acme", Id: "key_nope"}))
			return err
		}},
		{"key revoke bad tenant id", "tenant", func() error {
			_, err := admin.ApiKeys.Revoke(ctx, connect.NewRequest(&apiv1.RevokeApiKeyRequest{Tenant: "tnt_XYZ", Id: "key_nope"}))
			return err
		}},
		{"key create bad role", "role", func() error {
			_, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "owner"}))
			return err
		}},
		{"key create negative ttl", "ttl_seconds", func() error {
			_, err := admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "member", TtlSeconds: -1}))
			return err
		}},
		{"confirmation approve bad id", "id", func() error {
			_, err := admin.Confirmations.Approve(ctx, connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: "cfm_nope"}))
			return err
		}},
		{"confirmation list bad state", "state", func() error {
			_, err := admin.Confirmations.List(ctx, connect.NewRequest(&apiv1.ListConfirmationsRequest{Tenant: "acme", State: "done"}))
			return err
		}},
		{"policy put bad id", "id", func() error {
			_, err := admin.Policies.Put(ctx, connect.NewRequest(&apiv1.PutPolicyRequest{Tenant: "acme", Id: "Bad Id", Text: sfHarmlessPolicy}))
			return err
		}},
		{"projects list bad page token", "page_token", func() error {
			_, err := admin.Projects.List(ctx, connect.NewRequest(&apiv1.ListProjectsRequest{Tenant: "acme", PageToken: "not-a-token!"}))
			return err
		}},
		{"projects list foreign page token", "page_token", func() error {
			tok := envelope.EncodePageToken("prj_x", "other/")
			_, err := admin.Projects.List(ctx, connect.NewRequest(&apiv1.ListProjectsRequest{Tenant: "acme", PageToken: tok}))
			return err
		}},
		{"tenants list bad page token", "page_token", func() error {
			_, err := admin.Tenants.List(ctx, connect.NewRequest(&apiv1.ListTenantsRequest{PageToken: "%%%"}))
			return err
		}},
		{"audit list bad page token", "page_token", func() error {
			_, err := admin.Audit.List(ctx, connect.NewRequest(&apiv1.ListAuditRequest{PageToken: "eyJ4Ijox"}))
			return err
		}},
		{"projects list page size too big", "page_size", func() error {
			_, err := admin.Projects.List(ctx, connect.NewRequest(&apiv1.ListProjectsRequest{Tenant: "acme", PageSize: envelope.MaxPageSize + 1}))
			return err
		}},
		{"confirmation header not an id", envelope.HeaderConfirmationID, func() error {
			_, err := admin.Projects.Delete(ctx, sfWithHeader(&apiv1.DeleteProjectRequest{Tenant: "acme", Project: "web"}, client.HeaderConfirmationID, "nope"))
			return err
		}},
		{"idempotency key on a non-create method", envelope.HeaderIdempotencyKey, func() error {
			_, err := admin.Projects.Delete(ctx, sfWithHeader(&apiv1.DeleteProjectRequest{Tenant: "acme", Project: "web"}, client.HeaderIdempotencyKey, "k1"))
			return err
		}},
		// A read honours no key: refusing it beats letting a caller believe
		// its retry was made safe.
		{"idempotency key on a get", envelope.HeaderIdempotencyKey, func() error {
			_, err := admin.Projects.Get(ctx, sfWithHeader(&apiv1.GetProjectRequest{Tenant: "acme", Project: "web"}, client.HeaderIdempotencyKey, "k1"))
			return err
		}},
		{"idempotency key on a list", envelope.HeaderIdempotencyKey, func() error {
			_, err := admin.Tenants.List(ctx, sfWithHeader(&apiv1.ListTenantsRequest{}, client.HeaderIdempotencyKey, "k1"))
			return err
		}},
		{"idempotency key on whoami", envelope.HeaderIdempotencyKey, func() error {
			_, err := admin.Identity.WhoAmI(ctx, sfWithHeader(&apiv1.WhoAmIRequest{}, client.HeaderIdempotencyKey, "k1"))
			return err
		}},
		{"idempotency key on a watch", envelope.HeaderIdempotencyKey, func() error {
			// A watch let in would run until this deadline.
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			stream, err := admin.Reservations.Watch(ctx, sfWithHeader(&apiv1.WatchReservationsRequest{Tenant: "acme"}, client.HeaderIdempotencyKey, "k1"))
			if err != nil {
				return err
			}
			defer func() { _ = stream.Close() }()
			for stream.Receive() {
			}
			return stream.Err()
		}},
		{"idempotency key too long", envelope.HeaderIdempotencyKey, func() error {
			_, err := admin.Projects.Create(ctx, sfWithHeader(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "web4"}, client.HeaderIdempotencyKey, strings.Repeat("k", 129)))
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := sfCounts(t, cp)
			sfRequireViolation(t, tc.call(), tc.field)
			sfRequireDelta(t, before, sfCounts(t, cp), nil, "a validation failure must write nothing")
		})
	}

	// The project "web" survived the refused deletes.
	_, err := admin.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: acme.GetId(), Project: "web"}))
	require.NoError(t, err)
}

// sfHarmlessPolicy is a valid tenant policy that never matches.
const sfHarmlessPolicy = `@id("never")
forbid (principal, action, resource) when { false };`

// --- authentication -------------------------------------------------------

func TestSafetyAuthentication(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	sfTenant(t, admin, "acme")
	expiring, _ := sfKey(t, admin, "acme", "admin", 60)
	revoked, revokedKey := sfKey(t, admin, "acme", "admin", 0)

	// Both keys work before they expire or are revoked.
	for _, s := range []string{expiring, revoked} {
		_, err := cp.Client(s).Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
		require.NoError(t, err)
	}
	_, err := admin.ApiKeys.Revoke(ctx, connect.NewRequest(&apiv1.RevokeApiKeyRequest{Tenant: "acme", Id: revokedKey.GetId()}))
	require.NoError(t, err)
	cp.Clock.Advance(61 * time.Second)

	// A well-formed secret that was never issued.
	unknown := "bc_" + strings.Repeat("A", len(expiring)-len("bc_"))

	rawAuth := func(header string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, cp.URL+apiv1connect.ProjectServiceCreateProcedure,
			strings.NewReader(`{"tenant":"acme","name":"raw"}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", header)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		var body struct {
			Code string `json:"code"`
		}
		require.NoError(t, json.NewDecoder(res.Body).Decode(&body))
		return res.StatusCode, body.Code
	}

	cases := []struct {
		name  string
		token string
	}{
		{"missing", ""},
		{"not an api key and no oidc", "hello"},
		{"malformed api key", "bc_short"},
		{"unknown api key", unknown},
		{"expired api key", expiring},
		{"revoked api key", revoked},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := cp.Client(tc.token)
			before := sfCounts(t, cp)
			_, err := c.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "p"}))
			sfRequireCode(t, err, "UNAUTHENTICATED")
			_, err = c.Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
			sfRequireCode(t, err, "UNAUTHENTICATED")
			_, err = c.Projects.List(ctx, connect.NewRequest(&apiv1.ListProjectsRequest{Tenant: "acme"}))
			sfRequireCode(t, err, "UNAUTHENTICATED")
			sfRequireDelta(t, before, sfCounts(t, cp), nil, "an unauthenticated call must write nothing")
		})
	}
	t.Run("not a bearer scheme", func(t *testing.T) {
		before := sfCounts(t, cp)
		for _, h := range []string{"Basic YWRtaW46YWRtaW4=", "Bearer ", "bearer " + cp.AdminKey, cp.AdminKey, "Bearer  " + cp.AdminKey} {
			status, code := rawAuth(h)
			require.Equal(t, http.StatusUnauthorized, status, "Authorization %q", h)
			require.Equal(t, "unauthenticated", code, "Authorization %q", h)
		}
		sfRequireDelta(t, before, sfCounts(t, cp), nil)
	})
}

// --- authorization and tenant boundaries ---------------------------------

func TestSafetyAuthorizationDenials(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	acme := sfTenant(t, admin, "acme")
	other := sfTenant(t, admin, "other")
	acmeWeb := sfProject(t, admin, "acme", "web")
	sfProject(t, admin, "other", "site")
	_, acmeKey := sfKey(t, admin, "acme", "viewer", 0)
	memberSecret, _ := sfKey(t, admin, "acme", "member", 0)
	viewerSecret, _ := sfKey(t, admin, "acme", "viewer", 0)
	otherAdminSecret, _ := sfKey(t, admin, "other", "admin", 0)
	member, viewer, otherAdmin := cp.Client(memberSecret), cp.Client(viewerSecret), cp.Client(otherAdminSecret)

	// Denied mutations: exactly one audit row (decision deny), nothing else.
	denied := []struct {
		name   string
		action string
		call   func() error
	}{
		{"member creates a key", "apiKeys.create", func() error {
			_, err := member.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin"}))
			return err
		}},
		{"member puts a policy", "policies.put", func() error {
			_, err := member.Policies.Put(ctx, connect.NewRequest(&apiv1.PutPolicyRequest{Tenant: "acme", Id: "mine", Text: sfHarmlessPolicy}))
			return err
		}},
		{"viewer creates a project", "projects.create", func() error {
			_, err := viewer.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "new"}))
			return err
		}},
		{"viewer deletes a project", "projects.delete", func() error {
			_, err := viewer.Projects.Delete(ctx, connect.NewRequest(&apiv1.DeleteProjectRequest{Tenant: "acme", Project: "web"}))
			return err
		}},
		{"tenant admin creates a tenant", "tenants.create", func() error {
			_, err := otherAdmin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "sibling"}))
			return err
		}},
		{"other admin creates a project in acme", "projects.create", func() error {
			_, err := otherAdmin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "evil"}))
			return err
		}},
		{"other admin deletes acme's project by id", "projects.delete", func() error {
			_, err := otherAdmin.Projects.Delete(ctx, connect.NewRequest(&apiv1.DeleteProjectRequest{Tenant: acme.GetId(), Project: acmeWeb.GetId()}))
			return err
		}},
		{"other admin revokes acme's key in acme", "apiKeys.revoke", func() error {
			_, err := otherAdmin.ApiKeys.Revoke(ctx, connect.NewRequest(&apiv1.RevokeApiKeyRequest{Tenant: "acme", Id: acmeKey.GetId()}))
			return err
		}},
		{"other admin creates a project in a tenant that does not exist", "projects.create", func() error {
			_, err := otherAdmin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "ghost", Name: "x"}))
			return err
		}},
	}
	for _, tc := range denied {
		t.Run(tc.name, func(t *testing.T) {
			before := sfCounts(t, cp)
			cp.Authz.Reset()
			sfRequireCode(t, tc.call(), "PERMISSION_DENIED")
			require.Equal(t, 1, cp.Authz.CallsFor(tc.action), "one decision per mutation attempt")
			sfRequireDelta(t, before, sfCounts(t, cp), map[string]int{"audit_log": 1}, "a denial writes its audit row only")
			aud, err := admin.Audit.List(ctx, connect.NewRequest(&apiv1.ListAuditRequest{PageSize: 1}))
			require.NoError(t, err)
			require.Len(t, aud.Msg.GetEntries(), 1)
			last := aud.Msg.GetEntries()[0]
			require.Equal(t, tc.action, last.GetAction())
			require.Equal(t, envelope.DecisionDeny, last.GetDecision())
			require.Equal(t, "PERMISSION_DENIED", last.GetResult())
		})
	}

	// A resource of acme named under tenant other is not found there: the
	// caller may act in other, so it hears NOT_FOUND (never success), and a
	// failed Apply rolls back, writing nothing.
	wrongTenant := []struct {
		name     string
		mutation bool
		code     []string
		call     func() error
	}{
		{"revoke acme's key via other", true, []string{"NOT_FOUND", "PERMISSION_DENIED"}, func() error {
			_, err := otherAdmin.ApiKeys.Revoke(ctx, connect.NewRequest(&apiv1.RevokeApiKeyRequest{Tenant: "other", Id: acmeKey.GetId()}))
			return err
		}},
		{"platform admin revokes acme's key via other", true, []string{"NOT_FOUND"}, func() error {
			_, err := admin.ApiKeys.Revoke(ctx, connect.NewRequest(&apiv1.RevokeApiKeyRequest{Tenant: other.GetId(), Id: acmeKey.GetId()}))
			return err
		}},
		{"get acme's project by id via other", false, []string{"NOT_FOUND", "PERMISSION_DENIED"}, func() error {
			_, err := otherAdmin.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "other", Project: acmeWeb.GetId()}))
			return err
		}},
		{"get acme's project by name via other", false, []string{"NOT_FOUND", "PERMISSION_DENIED"}, func() error {
			_, err := otherAdmin.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "other", Project: "web"}))
			return err
		}},
		{"platform admin gets acme's project via other", false, []string{"NOT_FOUND"}, func() error {
			_, err := admin.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "other", Project: acmeWeb.GetId()}))
			return err
		}},
		{"delete acme's project via other", true, []string{"NOT_FOUND", "PERMISSION_DENIED"}, func() error {
			_, err := otherAdmin.Projects.Delete(ctx, connect.NewRequest(&apiv1.DeleteProjectRequest{Tenant: "other", Project: acmeWeb.GetId()}))
			return err
		}},
	}
	for _, tc := range wrongTenant {
		t.Run(tc.name, func(t *testing.T) {
			before := sfCounts(t, cp)
			err := tc.call()
			require.Error(t, err)
			require.Contains(t, tc.code, client.Code(err), "error %v", err)
			after := sfCounts(t, cp)
			// A NOT_FOUND after an allow writes nothing; a deny writes its
			// audit row.
			delta := map[string]int{}
			if tc.mutation && client.Code(err) == "PERMISSION_DENIED" {
				delta["audit_log"] = 1
			}
			sfRequireDelta(t, before, after, delta)
		})
	}

	// Nothing of acme changed.
	keys, err := admin.ApiKeys.List(ctx, connect.NewRequest(&apiv1.ListApiKeysRequest{Tenant: "acme"}))
	require.NoError(t, err)
	var ids []string
	for _, k := range keys.Msg.GetApiKeys() {
		ids = append(ids, k.GetId())
	}
	require.Contains(t, ids, acmeKey.GetId(), "acme's key must not be revoked")
	_, err = admin.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "acme", Project: "web"}))
	require.NoError(t, err)
}

// --- idempotency ----------------------------------------------------------

func TestSafetyIdempotency(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	sfTenant(t, admin, "acme")
	key := client.NewIdempotencyKey()

	create := func(name, idem string) (*apiv1.Project, error) {
		res, err := admin.Projects.Create(ctx, sfWithHeader(&apiv1.CreateProjectRequest{Tenant: "acme", Name: name}, client.HeaderIdempotencyKey, idem))
		if err != nil {
			return nil, err
		}
		return res.Msg.GetProject(), nil
	}

	before := sfCounts(t, cp)
	first, err := create("web", key)
	require.NoError(t, err)
	second, err := create("web", key)
	require.NoError(t, err)
	require.Equal(t, first.GetId(), second.GetId(), "a replay answers with the first response")
	require.Equal(t, first.GetCreateTime().AsTime(), second.GetCreateTime().AsTime())
	sfRequireDelta(t, before, sfCounts(t, cp), map[string]int{"projects": 1, "audit_log": 1, "events": 1, "idempotency_keys": 1},
		"a replay creates nothing")

	t.Run("same key, different body", func(t *testing.T) {
		before := sfCounts(t, cp)
		_, err := create("api", key)
		sfRequireCode(t, err, "IDEMPOTENCY_KEY_REUSED")
		sfRequireDelta(t, before, sfCounts(t, cp), nil)
	})
	t.Run("same key, different method", func(t *testing.T) {
		before := sfCounts(t, cp)
		_, err := admin.Tenants.Create(ctx, sfWithHeader(&apiv1.CreateTenantRequest{Name: "web"}, client.HeaderIdempotencyKey, key))
		sfRequireCode(t, err, "IDEMPOTENCY_KEY_REUSED")
		sfRequireDelta(t, before, sfCounts(t, cp), nil)
	})
	t.Run("key on a non-create method", func(t *testing.T) {
		before := sfCounts(t, cp)
		_, err := admin.Projects.Delete(ctx, sfWithHeader(&apiv1.DeleteProjectRequest{Tenant: "acme", Project: "web"}, client.HeaderIdempotencyKey, client.NewIdempotencyKey()))
		sfRequireViolation(t, err, envelope.HeaderIdempotencyKey)
		sfRequireDelta(t, before, sfCounts(t, cp), nil)
	})
	t.Run("keys are per principal", func(t *testing.T) {
		// Another principal using the same key string gets its own create.
		secret, _ := sfKey(t, admin, "acme", "admin", 0)
		res, err := cp.Client(secret).Projects.Create(ctx, sfWithHeader(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "web-2"}, client.HeaderIdempotencyKey, key))
		require.NoError(t, err)
		require.NotEqual(t, first.GetId(), res.Msg.GetProject().GetId())
	})
	t.Run("api key replay does not return the secret", func(t *testing.T) {
		idem := client.NewIdempotencyKey()
		mk := func() *apiv1.CreateApiKeyResponse {
			res, err := admin.ApiKeys.Create(ctx, sfWithHeader(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "viewer"}, client.HeaderIdempotencyKey, idem))
			require.NoError(t, err)
			return res.Msg
		}
		first := mk()
		require.NotEmpty(t, first.GetSecret())
		before := sfCounts(t, cp)
		second := mk()
		require.Equal(t, first.GetApiKey().GetId(), second.GetApiKey().GetId())
		require.Empty(t, second.GetSecret(), "the stored replay must not hold the secret")
		sfRequireDelta(t, before, sfCounts(t, cp), nil)
		var stored []byte
		require.NoError(t, cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			return tx.QueryRow(ctx, `SELECT response FROM idempotency_keys WHERE key = $1`, idem).Scan(&stored)
		}))
		require.NotContains(t, string(stored), first.GetSecret())
	})
	t.Run("a new key creates again", func(t *testing.T) {
		_, err := create("web", client.NewIdempotencyKey())
		sfRequireCode(t, err, "ALREADY_EXISTS")
	})
}

// --- cross-tenant sweep over the whole catalog ----------------------------

// sfLeaseID is a well-formed lease id no tenant has: a stranger's lease
// calls must fail on the tenant, not on input.
const sfLeaseID = "mls_00000000000000000000000000"

func TestSafetyCrossTenantCatalog(t *testing.T) {
	t.Parallel()
	// One stranger tries every procedure and each refusal must be on record:
	// lift the per-principal bound on refusal rows (TestRefusalAuditIsBounded
	// covers it).
	cp := bctest.NewControlPlane(t, func(c *app.Config) { c.RefusalAuditLimit = 1 << 20 })
	ctx := context.Background()
	admin := cp.Admin()
	acme := sfTenant(t, admin, "acme")
	sfTenant(t, admin, "other")
	web := sfProject(t, admin, "acme", "web")
	sfProject(t, admin, "acme", "doomed")
	_, acmeKey := sfKey(t, admin, "acme", "member", 0)
	_, err := admin.Policies.Put(ctx, connect.NewRequest(&apiv1.PutPolicyRequest{Tenant: "acme", Id: "extra", Text: sfHarmlessPolicy}))
	require.NoError(t, err)
	agentSecret, _ := sfKey(t, admin, "acme", "agent", 0)
	_, err = cp.Client(agentSecret).Projects.Delete(ctx, connect.NewRequest(&apiv1.DeleteProjectRequest{Tenant: "acme", Project: "doomed"}))
	sfRequireCode(t, err, "CONFIRMATION_REQUIRED")
	cfmID := client.Detail(err).GetConfirmationId()
	require.True(t, envelope.IsID(cfmID, "cfm"), "confirmation id %q", cfmID)

	otherSecret, _ := sfKey(t, admin, "other", "admin", 0)
	evil := cp.Client(otherSecret)
	// An entry of acme's audit log, in a signed checkpoint.
	acmeAudit, err := admin.Audit.List(ctx, connect.NewRequest(&apiv1.ListAuditRequest{Tenant: "acme"}))
	require.NoError(t, err)
	acmeAuditID := acmeAudit.Msg.GetEntries()[0].GetId()
	_, err = cp.App.AuditLog.CheckpointNow(ctx)
	require.NoError(t, err)

	// acme's fleet: a node (as a join would insert it), a command, a join
	// token and a deferred join request.
	now := cp.Clock.Now()
	node := &fleet.NodeInsertParams{ID: envelope.NewID(fleet.NodeIDPrefix, now), Name: "gpu-1", TenantID: acme.GetId(),
		ProjectID: web.GetId(), HardwareKey: "hw-1", State: fleet.NodeActive, Liveness: fleet.LivenessReady, CreateTime: now}
	require.NoError(t, cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		if err := fleet.NodeInsert(ctx, tx, node); err != nil {
			return err
		}
		// Two GPUs: the first quarantined (for lift), the second in service.
		for i := range 2 {
			if _, err := tx.Exec(ctx, `INSERT INTO gpus (uuid, node_id, idx, model, memory_mib, pci_bus_id, numa_node, mig_mode, update_time)
				VALUES ($1, $2, $3, 'T4', 16384, '0000:01:00.0', 0, 'disabled', $4)`, fmt.Sprintf("GPU-acme-%d", i), node.ID, i, now); err != nil {
				return err
			}
		}
		return nil
	}))
	_, err = admin.Health.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "acme", Gpu: "GPU-acme-0", Reason: "safety"}))
	require.NoError(t, err)
	cmd, err := admin.Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: "gpu-1", Kind: "inventory.refresh"}))
	require.NoError(t, err)
	cmdID := cmd.Msg.GetCommand().GetId()
	jt, err := admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web"}))
	require.NoError(t, err)
	jtID := jt.Msg.GetJoinToken().GetId()
	// A trust anchor of acme's: a pinned EK, so no certificate is needed.
	anc, err := admin.TrustAnchors.Create(ctx, connect.NewRequest(&apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "ek",
		Attestor: "tpm", EkPublicSha256: strings.Repeat("ab", 32)}))
	require.NoError(t, err)
	ancID := anc.Msg.GetTrustAnchor().GetId()
	jrq := &fleet.JoinRequest{ID: envelope.NewID(fleet.JoinRequestIDPrefix, now), TenantID: acme.GetId(), TokenID: jtID,
		CSRSHA256: "csr", HardwareKey: "hw-2", Identity: "placeholder", Reason: "test", CreateTime: now}
	require.NoError(t, cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error { return fleet.JoinRequestInsert(ctx, tx, jrq) }))

	// A pending command batch of acme, written as Create would.
	batch := quorum.Batch{ID: envelope.NewID(quorum.BatchIDPrefix, now), TenantID: acme.GetId(), State: quorum.StatePending,
		Root: strings.Repeat("0", 64), Epoch: 1, Threshold: 1, TrustDomain: "example.org", PayloadBytes: 2, CreatedBy: "test",
		CreateTime: now, ExpireTime: now.Add(time.Hour), UpdateTime: now}
	require.NoError(t, cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return quorum.BatchInsert(ctx, tx, &batch, []quorum.Leaf{{Index: 0, Kind: fleet.KindDiskWipe, Subject: node.ID, TargetID: node.ID,
			Params: "{}", ParamsSHA256: strings.Repeat("0", 64)}})
	}))
	evilKey := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
	evilApproval := &apiv1.KeySignature{Key: evilKey, Signature: []byte("sig")}

	pl, err := admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)
	poolID := pl.Msg.GetPool().GetId()

	// A quota of acme's project web, written as Set would.
	quo := quota.Quota{ID: envelope.NewID(quota.IDPrefix, now), TenantID: acme.GetId(), ProjectID: web.GetId(), Model: "H100",
		GPUs: 4, GPUHours: quota.Unlimited, CreatedBy: "test", CreateTime: now, UpdateTime: now}
	require.NoError(t, cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error { return quota.Upsert(ctx, tx, &quo) }))
	evilGPUs := int32(1000)
	// A budget of acme, written as Set would.
	bud := budget.Budget{ID: envelope.NewID(budget.IDPrefix, now), TenantID: acme.GetId(), Period: budget.PeriodMonth,
		Amount: 100_000_000, Enforcement: budget.Hard, Thresholds: budget.DefaultThresholds, CreatedBy: "test", CreateTime: now, UpdateTime: now}
	require.NoError(t, cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error { return budget.Upsert(ctx, tx, &bud) }))

	// A webhook of acme (its filter matches nothing, so nothing is sent)
	// with a dead delivery.
	wh, err := admin.Webhooks.Create(ctx, connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: "acme",
		Url: "http://127.0.0.1:9/acme", Types: []string{"webhook.never_emitted"}}))
	require.NoError(t, err)
	whID := wh.Msg.GetWebhook().GetId()
	dead := &webhooks.Delivery{ID: envelope.NewID(webhooks.DeliveryIDPrefix, now), WebhookID: whID, TenantID: acme.GetId(),
		EventID: "1", EventType: "webhook.test", Payload: []byte("{}"), State: webhooks.DeliveryDead, NextAttemptTime: now,
		CreateTime: now, UpdateTime: now}
	require.NoError(t, cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error { return webhooks.DeliveryInsert(ctx, tx, dead) }))
	evilURL := "http://127.0.0.1:9/evil"

	// A reservation of acme's project web waiting in pool h100, written as
	// Create would.
	rsvID := envelope.NewID(reservation.IDPrefix, now)
	require.NoError(t, cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO reservations (id, tenant_id, project_id, pool_id, state, gpus, binding, starts_at, ends_at,
			created_by, create_time, update_time) VALUES ($1, $2, $3, $4, 'pending', 1, 'node', $5, $6, 'test', $5, $5)`,
			rsvID, acme.GetId(), web.GetId(), poolID, now, now.Add(time.Hour))
		return err
	}))
	evilBooking := &apiv1.CreateReservationRequest{Tenant: "acme", Project: "web", Pool: "h100", Gpus: 1}

	// An image of acme, a key on acme's allowlist and evil's own key with a
	// signature of acme's image.
	imgBytes := []byte("acme's disk")
	imgSum := sha256.Sum256(imgBytes)
	imgHdr := &apiv1.PushImageHeader{Tenant: "acme", Name: "disk", Kind: "raw", Sha256: hex.EncodeToString(imgSum[:]), SizeBytes: int64(len(imgBytes))}
	pushed, err := admin.PushImage(ctx, imgHdr, bytes.NewReader(imgBytes), "")
	require.NoError(t, err)
	imgID := pushed.GetImage().GetId()
	acmeSigner, _, err := imagesig.GenerateKey(imagesig.AlgEd25519)
	require.NoError(t, err)
	_, err = admin.SignerKeys.Add(ctx, connect.NewRequest(&apiv1.AddSignerKeyRequest{Tenant: "acme", Name: "ci", PublicKey: acmeSigner.Public.PEM()}))
	require.NoError(t, err)
	evilSigner, _, err := imagesig.GenerateKey(imagesig.AlgEd25519)
	require.NoError(t, err)
	evilSig, err := evilSigner.Sign(imagesig.Payload("disk", "raw", imgHdr.GetSha256()))
	require.NoError(t, err)

	// A site of acme with a machine enrolled on loopback.
	site, err := admin.Sites.Create(ctx, connect.NewRequest(&apiv1.CreateSiteRequest{Tenant: "acme", Name: "dc1", Networks: []string{"127.0.0.0/8"}}))
	require.NoError(t, err)
	siteID := site.Msg.GetSite().GetId()
	mch, err := admin.Machines.Enroll(ctx, connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "acme", Site: "dc1", Name: "m1",
		BmcDriver: "ipmi", BmcAddress: "127.0.0.2", BmcUsername: "admin", BmcPassword: "secret", Mac: "02:00:00:00:00:01"}))
	require.NoError(t, err)
	machineID := mch.Msg.GetMachine().GetId()
	// A workflow id of the shape the engine makes; none exists, in acme or
	// anywhere.
	sfWorkflowID := envelope.NewID("wf", time.Now())

	// A flavor and an IP pool of acme.
	flv, err := admin.Flavors.Create(ctx, connect.NewRequest(&apiv1.CreateFlavorRequest{Tenant: "acme", Name: "small", Vcpus: 2,
		MemoryMib: 2048, DiskGib: 10}))
	require.NoError(t, err)
	flavorID := flv.Msg.GetFlavor().GetId()
	ipp, err := admin.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Tenant: "acme", Name: "lan", Cidr: "10.9.0.0/24"}))
	require.NoError(t, err)
	ipPoolID := ipp.Msg.GetIpPool().GetId()
	// An instance of acme with a volume, written as Create would (no host
	// answers here).
	inst := vps.Instance{ID: envelope.NewID(vps.InstanceIDPrefix, now), TenantID: acme.GetId(), ProjectID: web.GetId(), Name: "vm1",
		State: vps.StateRunning, FlavorID: flavorID, FlavorName: "small", VCPUs: 2, MemoryMiB: 2048, DiskGiB: 10, Image: "debian-12",
		IPPoolID: ipPoolID, IPPoolName: "lan", Address: "10.9.0.2", PrefixLen: 24, Gateway: "10.9.0.1", MAC: "52:54:00:00:00:01",
		NetworkPolicy: "egress", NodeID: node.ID, NodeName: "gpu-1", CreatedBy: "test", CreateTime: now, UpdateTime: now}
	vol := vps.Volume{ID: envelope.NewID(vps.VolumeIDPrefix, now), TenantID: acme.GetId(), Name: "data", SizeGiB: 5, Format: "qcow2",
		State: vps.VolumeAvailable, NodeID: node.ID, CreateTime: now, UpdateTime: now}
	require.NoError(t, cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return errors.Join(vps.InstanceInsert(ctx, tx, &inst), vps.VolumeInsert(ctx, tx, &vol))
	}))
	sec, err := admin.Secrets.Put(ctx, connect.NewRequest(&apiv1.PutSecretRequest{Tenant: "acme", Name: "db", Value: []byte("acme-db-password")}))
	require.NoError(t, err)
	secretID := sec.Msg.GetSecret().GetId()
	pac, err := admin.ProviderAccounts.Create(ctx, connect.NewRequest(&apiv1.CreateProviderAccountRequest{Tenant: "acme", Name: "hc",
		Type: "hetzner-cloud", SecretRefs: map[string]string{"token": "secret://db"}}))
	require.NoError(t, err)
	pacID := pac.Msg.GetAccount().GetId()
	prof, err := admin.Profiles.Create(ctx, connect.NewRequest(&apiv1.CreateProfileRequest{Tenant: "acme", Document: sfProfileDoc("acme-deploy")}))
	require.NoError(t, err)
	profID := prof.Msg.GetProfile().GetId()
	// A sandbox template of acme's and a sandbox on vm1, written as Create
	// would.
	tpl := sandbox.Template{ID: envelope.NewID(sandbox.TemplateIDPrefix, now), TenantID: acme.GetId(), Name: "t1", Image: "debian-12",
		FlavorID: flavorID, FlavorName: "small", PoolID: poolID, IPPoolID: ipPoolID, DefaultTTL: time.Hour, MaxTTL: 2 * time.Hour,
		Env: map[string]string{"DB": "secret://db"}, NetworkPolicy: "egress", Shape: "s1", State: sandbox.TemplateActive, CreatedBy: "test",
		CreateTime: now, UpdateTime: now}
	sbx := sandbox.Sandbox{ID: envelope.NewID(sandbox.SandboxIDPrefix, now), TenantID: acme.GetId(), TemplateID: tpl.ID, TemplateName: "t1",
		InstanceID: inst.ID, State: sandbox.SandboxActive, Origin: sandbox.OriginCold, CreatedBy: "test", ExpireTime: now.Add(time.Hour),
		CreateTime: now, UpdateTime: now}
	sbs := sandbox.Snapshot{ID: envelope.NewID(sandbox.SnapshotIDPrefix, now), TenantID: acme.GetId(), SandboxID: sbx.ID, TemplateID: tpl.ID,
		NodeID: inst.NodeID, Shape: "s1", State: "ready", CreateTime: now, InstanceID: inst.ID, Image: "debian-12", DiskGiB: 10, Keep: true}
	require.NoError(t, cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return errors.Join(sandbox.TemplateInsert(ctx, tx, &tpl), sandbox.SandboxInsert(ctx, tx, &sbx), sandbox.SnapshotInsert(ctx, tx, &sbs))
	}))
	evilPush := proto.CloneOf(imgHdr)
	evilPush.Name = "evil"

	type call func() error
	cases := map[string][]call{
		apiv1connect.TenantServiceCreateProcedure: {func() error {
			_, err := evil.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme-2"}))
			return err
		}},
		apiv1connect.TenantServiceGetProcedure: {
			func() error {
				_, err := evil.Tenants.Get(ctx, connect.NewRequest(&apiv1.GetTenantRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.Tenants.Get(ctx, connect.NewRequest(&apiv1.GetTenantRequest{Tenant: acme.GetId()}))
				return err
			},
		},
		apiv1connect.TenantServiceListProcedure: {func() error {
			_, err := evil.Tenants.List(ctx, connect.NewRequest(&apiv1.ListTenantsRequest{}))
			return err
		}},
		apiv1connect.TenantServiceSuspendProcedure: {
			func() error {
				_, err := evil.Tenants.Suspend(ctx, connect.NewRequest(&apiv1.SuspendTenantRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.Tenants.Suspend(ctx, connect.NewRequest(&apiv1.SuspendTenantRequest{Tenant: acme.GetId()}))
				return err
			},
		},
		apiv1connect.TenantServiceResumeProcedure: {func() error {
			_, err := evil.Tenants.Resume(ctx, connect.NewRequest(&apiv1.ResumeTenantRequest{Tenant: acme.GetId()}))
			return err
		}},
		apiv1connect.TenantServiceDeleteProcedure: {
			func() error {
				_, err := evil.Tenants.Delete(ctx, connect.NewRequest(&apiv1.DeleteTenantRequest{Tenant: "acme", DryRun: true}))
				return err
			},
			func() error {
				_, err := evil.Tenants.Delete(ctx, connect.NewRequest(&apiv1.DeleteTenantRequest{Tenant: acme.GetId()}))
				return err
			},
		},
		apiv1connect.ProjectServiceCreateProcedure: {func() error {
			_, err := evil.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: acme.GetId(), Name: "evil"}))
			return err
		}},
		apiv1connect.ProjectServiceGetProcedure: {
			func() error {
				_, err := evil.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "acme", Project: "web"}))
				return err
			},
			func() error {
				_, err := evil.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "other", Project: web.GetId()}))
				return err
			},
		},
		apiv1connect.ProjectServiceListProcedure: {func() error {
			_, err := evil.Projects.List(ctx, connect.NewRequest(&apiv1.ListProjectsRequest{Tenant: "acme"}))
			return err
		}},
		apiv1connect.ProjectServiceDeleteProcedure: {
			func() error {
				_, err := evil.Projects.Delete(ctx, connect.NewRequest(&apiv1.DeleteProjectRequest{Tenant: "acme", Project: web.GetId()}))
				return err
			},
			func() error {
				_, err := evil.Projects.Delete(ctx, connect.NewRequest(&apiv1.DeleteProjectRequest{Tenant: "other", Project: web.GetId()}))
				return err
			},
		},
		apiv1connect.ApiKeyServiceCreateProcedure: {
			func() error {
				_, err := evil.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin"}))
				return err
			},
			func() error {
				_, err := evil.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{}))
				return err
			},
		},
		apiv1connect.ApiKeyServiceListProcedure: {
			func() error {
				_, err := evil.ApiKeys.List(ctx, connect.NewRequest(&apiv1.ListApiKeysRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.ApiKeys.List(ctx, connect.NewRequest(&apiv1.ListApiKeysRequest{}))
				return err
			},
		},
		apiv1connect.ApiKeyServiceRevokeProcedure: {
			func() error {
				_, err := evil.ApiKeys.Revoke(ctx, connect.NewRequest(&apiv1.RevokeApiKeyRequest{Tenant: "acme", Id: acmeKey.GetId()}))
				return err
			},
			func() error {
				_, err := evil.ApiKeys.Revoke(ctx, connect.NewRequest(&apiv1.RevokeApiKeyRequest{Tenant: "other", Id: acmeKey.GetId()}))
				return err
			},
			func() error {
				_, err := evil.ApiKeys.Revoke(ctx, connect.NewRequest(&apiv1.RevokeApiKeyRequest{Id: acmeKey.GetId()}))
				return err
			},
		},
		apiv1connect.IdentityServiceWhoAmIProcedure: nil, // KindSelf: the one exception
		apiv1connect.PolicyServiceGetProcedure: {func() error {
			_, err := evil.Policies.Get(ctx, connect.NewRequest(&apiv1.GetPolicyRequest{Tenant: "acme", Id: "extra"}))
			return err
		}},
		apiv1connect.PolicyServicePutProcedure: {func() error {
			_, err := evil.Policies.Put(ctx, connect.NewRequest(&apiv1.PutPolicyRequest{Tenant: "acme", Id: "extra", Text: `@id("open")
permit (principal, action, resource);`}))
			return err
		}},
		apiv1connect.PolicyServiceListProcedure: {func() error {
			_, err := evil.Policies.List(ctx, connect.NewRequest(&apiv1.ListPoliciesRequest{Tenant: "acme"}))
			return err
		}},
		apiv1connect.ConfirmationServiceListProcedure: {func() error {
			_, err := evil.Confirmations.List(ctx, connect.NewRequest(&apiv1.ListConfirmationsRequest{Tenant: "acme"}))
			return err
		}},
		apiv1connect.ConfirmationServiceApproveProcedure: {
			func() error {
				_, err := evil.Confirmations.Approve(ctx, connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: cfmID}))
				return err
			},
			func() error {
				_, err := evil.Confirmations.Approve(ctx, connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "other", Id: cfmID}))
				return err
			},
		},
		apiv1connect.AuditServiceListProcedure: {
			func() error {
				_, err := evil.Audit.List(ctx, connect.NewRequest(&apiv1.ListAuditRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.Audit.List(ctx, connect.NewRequest(&apiv1.ListAuditRequest{}))
				return err
			},
		},
		apiv1connect.AuditServiceProveInclusionProcedure: {
			func() error {
				_, err := evil.Audit.ProveInclusion(ctx, connect.NewRequest(&apiv1.ProveAuditInclusionRequest{EntryId: acmeAuditID}))
				return err
			},
		},
		apiv1connect.AuditServiceCheckLogProcedure: {
			func() error {
				_, err := evil.Audit.CheckLog(ctx, connect.NewRequest(&apiv1.CheckAuditLogRequest{}))
				return err
			},
		},
		// The tree's checkpoints, key and consistency proofs name no tenant
		// and show no entry: every principal may read them (open, below).
		apiv1connect.AuditServiceGetCheckpointProcedure: {
			func() error {
				_, err := evil.Audit.GetCheckpoint(ctx, connect.NewRequest(&apiv1.GetAuditCheckpointRequest{}))
				return err
			},
		},
		apiv1connect.AuditServiceGetLogKeyProcedure: {
			func() error {
				_, err := evil.Audit.GetLogKey(ctx, connect.NewRequest(&apiv1.GetAuditLogKeyRequest{}))
				return err
			},
		},
		apiv1connect.AuditServiceProveConsistencyProcedure: {
			func() error {
				_, err := evil.Audit.ProveConsistency(ctx, connect.NewRequest(&apiv1.ProveAuditConsistencyRequest{FromSize: 1}))
				return err
			},
		},
		apiv1connect.NodeServiceListProcedure: {
			func() error {
				_, err := evil.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.Nodes.List(ctx, connect.NewRequest(&apiv1.ListNodesRequest{}))
				return err
			},
		},
		apiv1connect.NodeServiceGetProcedure: {
			func() error {
				_, err := evil.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Tenant: "acme", Node: "gpu-1"}))
				return err
			},
			func() error {
				_, err := evil.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Tenant: "other", Node: node.ID}))
				return err
			},
			func() error {
				_, err := evil.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Node: "gpu-1"}))
				return err
			},
		},
		apiv1connect.NodeServiceDrainProcedure: {
			func() error {
				_, err := evil.Nodes.Drain(ctx, connect.NewRequest(&apiv1.DrainNodeRequest{Tenant: "acme", Node: "gpu-1"}))
				return err
			},
			func() error {
				_, err := evil.Nodes.Drain(ctx, connect.NewRequest(&apiv1.DrainNodeRequest{Tenant: "other", Node: node.ID}))
				return err
			},
			func() error {
				_, err := evil.Nodes.Drain(ctx, connect.NewRequest(&apiv1.DrainNodeRequest{Node: node.ID}))
				return err
			},
		},
		apiv1connect.NodeServiceUndrainProcedure: {
			func() error {
				_, err := evil.Nodes.Undrain(ctx, connect.NewRequest(&apiv1.UndrainNodeRequest{Tenant: "acme", Node: "gpu-1"}))
				return err
			},
			func() error {
				_, err := evil.Nodes.Undrain(ctx, connect.NewRequest(&apiv1.UndrainNodeRequest{Node: node.ID}))
				return err
			},
		},
		apiv1connect.HealthServiceGetNodeHealthProcedure: {
			func() error {
				_, err := evil.Health.GetNodeHealth(ctx, connect.NewRequest(&apiv1.GetNodeHealthRequest{Tenant: "acme", Node: "gpu-1"}))
				return err
			},
			func() error {
				_, err := evil.Health.GetNodeHealth(ctx, connect.NewRequest(&apiv1.GetNodeHealthRequest{Tenant: "other", Node: node.ID}))
				return err
			},
		},
		apiv1connect.HealthServiceListFindingsProcedure: {
			func() error {
				_, err := evil.Health.ListFindings(ctx, connect.NewRequest(&apiv1.ListFindingsRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.Health.ListFindings(ctx, connect.NewRequest(&apiv1.ListFindingsRequest{Tenant: "other", Node: node.ID}))
				return err
			},
			func() error {
				_, err := evil.Health.ListFindings(ctx, connect.NewRequest(&apiv1.ListFindingsRequest{Tenant: "other", Pool: poolID}))
				return err
			},
		},
		apiv1connect.HealthServiceListRemediationsProcedure: {
			func() error {
				_, err := evil.Health.ListRemediations(ctx, connect.NewRequest(&apiv1.ListRemediationsRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.Health.ListRemediations(ctx, connect.NewRequest(&apiv1.ListRemediationsRequest{Tenant: "other", Node: node.ID}))
				return err
			},
		},
		apiv1connect.HealthServiceGetPoolHealthProcedure: {
			func() error {
				_, err := evil.Health.GetPoolHealth(ctx, connect.NewRequest(&apiv1.GetPoolHealthRequest{Tenant: "acme", Pool: "h100"}))
				return err
			},
			func() error {
				_, err := evil.Health.GetPoolHealth(ctx, connect.NewRequest(&apiv1.GetPoolHealthRequest{Tenant: "other", Pool: poolID}))
				return err
			},
		},
		apiv1connect.HealthServiceQuarantineGpuProcedure: {
			func() error {
				_, err := evil.Health.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "acme", Gpu: "GPU-acme-1", Reason: "r"}))
				return err
			},
			func() error {
				_, err := evil.Health.QuarantineGpu(ctx, connect.NewRequest(&apiv1.QuarantineGpuRequest{Tenant: "other", Gpu: "GPU-acme-1", Reason: "r"}))
				return err
			},
		},
		apiv1connect.HealthServiceLiftGpuProcedure: {
			func() error {
				_, err := evil.Health.LiftGpu(ctx, connect.NewRequest(&apiv1.LiftGpuRequest{Tenant: "acme", Gpu: "GPU-acme-0", Reason: "r"}))
				return err
			},
			func() error {
				_, err := evil.Health.LiftGpu(ctx, connect.NewRequest(&apiv1.LiftGpuRequest{Tenant: "other", Gpu: "GPU-acme-0", Reason: "r"}))
				return err
			},
		},
		apiv1connect.HealthServiceResetBreakerProcedure: {
			func() error {
				_, err := evil.Health.ResetBreaker(ctx, connect.NewRequest(&apiv1.ResetBreakerRequest{Tenant: "acme", Pool: "h100", Reason: "r"}))
				return err
			},
			func() error {
				_, err := evil.Health.ResetBreaker(ctx, connect.NewRequest(&apiv1.ResetBreakerRequest{Tenant: "other", Pool: poolID, Reason: "r"}))
				return err
			},
		},
		apiv1connect.NodeServiceDeleteProcedure: {
			func() error {
				_, err := evil.Nodes.Delete(ctx, connect.NewRequest(&apiv1.DeleteNodeRequest{Tenant: "acme", Node: "gpu-1"}))
				return err
			},
			func() error {
				_, err := evil.Nodes.Delete(ctx, connect.NewRequest(&apiv1.DeleteNodeRequest{Tenant: "other", Node: node.ID}))
				return err
			},
			func() error {
				_, err := evil.Nodes.Delete(ctx, connect.NewRequest(&apiv1.DeleteNodeRequest{Node: node.ID}))
				return err
			},
		},
		apiv1connect.CommandServiceRunProcedure: {
			func() error {
				_, err := evil.Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "acme", Node: "gpu-1", Kind: "inventory.refresh"}))
				return err
			},
			func() error {
				_, err := evil.Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Tenant: "other", Node: node.ID, Kind: "node.drain"}))
				return err
			},
			func() error {
				_, err := evil.Commands.Run(ctx, connect.NewRequest(&apiv1.RunCommandRequest{Node: "gpu-1", Kind: "node.drain"}))
				return err
			},
		},
		apiv1connect.CommandServiceGetProcedure: {
			func() error {
				_, err := evil.Commands.Get(ctx, connect.NewRequest(&apiv1.GetCommandRequest{Tenant: "acme", Id: cmdID}))
				return err
			},
			func() error {
				_, err := evil.Commands.Get(ctx, connect.NewRequest(&apiv1.GetCommandRequest{Tenant: "other", Id: cmdID}))
				return err
			},
			func() error {
				_, err := evil.Commands.Get(ctx, connect.NewRequest(&apiv1.GetCommandRequest{Id: cmdID}))
				return err
			},
		},
		apiv1connect.CommandServiceListProcedure: {
			func() error {
				_, err := evil.Commands.List(ctx, connect.NewRequest(&apiv1.ListCommandsRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.Commands.List(ctx, connect.NewRequest(&apiv1.ListCommandsRequest{Node: "gpu-1"}))
				return err
			},
			func() error {
				_, err := evil.Commands.List(ctx, connect.NewRequest(&apiv1.ListCommandsRequest{}))
				return err
			},
		},
		apiv1connect.CommandServiceCancelProcedure: {
			func() error {
				_, err := evil.Commands.Cancel(ctx, connect.NewRequest(&apiv1.CancelCommandRequest{Tenant: "acme", Id: cmdID}))
				return err
			},
			func() error {
				_, err := evil.Commands.Cancel(ctx, connect.NewRequest(&apiv1.CancelCommandRequest{Tenant: "other", Id: cmdID}))
				return err
			},
			func() error {
				_, err := evil.Commands.Cancel(ctx, connect.NewRequest(&apiv1.CancelCommandRequest{Id: cmdID}))
				return err
			},
		},
		apiv1connect.CommandBatchServiceCreateProcedure: {
			func() error {
				_, err := evil.CommandBatches.Create(ctx, connect.NewRequest(&apiv1.CreateCommandBatchRequest{Tenant: "acme",
					Leaves: []*apiv1.CommandBatchLeafSpec{{Kind: fleet.KindDiskWipe, Subject: node.ID}}}))
				return err
			},
			func() error {
				_, err := evil.CommandBatches.Create(ctx, connect.NewRequest(&apiv1.CreateCommandBatchRequest{Tenant: "other",
					Leaves: []*apiv1.CommandBatchLeafSpec{{Kind: fleet.KindDiskWipe, Subject: node.ID}}}))
				return err
			},
		},
		apiv1connect.CommandBatchServiceGetProcedure: {
			func() error {
				_, err := evil.CommandBatches.Get(ctx, connect.NewRequest(&apiv1.GetCommandBatchRequest{Tenant: "acme", Id: batch.ID}))
				return err
			},
			func() error {
				_, err := evil.CommandBatches.Get(ctx, connect.NewRequest(&apiv1.GetCommandBatchRequest{Tenant: "other", Id: batch.ID}))
				return err
			},
		},
		apiv1connect.CommandBatchServiceListProcedure: {
			func() error {
				_, err := evil.CommandBatches.List(ctx, connect.NewRequest(&apiv1.ListCommandBatchesRequest{Tenant: "acme"}))
				return err
			},
		},
		apiv1connect.CommandBatchServiceApproveProcedure: {
			func() error {
				_, err := evil.CommandBatches.Approve(ctx, connect.NewRequest(&apiv1.ApproveCommandBatchRequest{Tenant: "acme", Id: batch.ID,
					Root: batch.Root, Approval: evilApproval}))
				return err
			},
			func() error {
				_, err := evil.CommandBatches.Approve(ctx, connect.NewRequest(&apiv1.ApproveCommandBatchRequest{Tenant: "other", Id: batch.ID,
					Root: batch.Root, Approval: evilApproval}))
				return err
			},
		},
		apiv1connect.CommandBatchServiceCancelProcedure: {
			func() error {
				_, err := evil.CommandBatches.Cancel(ctx, connect.NewRequest(&apiv1.CancelCommandBatchRequest{Tenant: "acme", Id: batch.ID}))
				return err
			},
			func() error {
				_, err := evil.CommandBatches.Cancel(ctx, connect.NewRequest(&apiv1.CancelCommandBatchRequest{Tenant: "other", Id: batch.ID}))
				return err
			},
		},
		apiv1connect.CommandBatchServiceRunProcedure: {
			func() error {
				_, err := evil.CommandBatches.Run(ctx, connect.NewRequest(&apiv1.RunCommandBatchRequest{Tenant: "acme", Id: batch.ID}))
				return err
			},
			func() error {
				_, err := evil.CommandBatches.Run(ctx, connect.NewRequest(&apiv1.RunCommandBatchRequest{Tenant: "other", Id: batch.ID}))
				return err
			},
		},
		apiv1connect.CommandBatchServicePutApproverSetProcedure: {
			func() error {
				_, err := evil.CommandBatches.PutApproverSet(ctx, connect.NewRequest(&apiv1.PutApproverSetRequest{Tenant: "acme",
					Threshold: 1, PublicKeys: []string{evilKey}}))
				return err
			},
		},
		apiv1connect.CommandBatchServiceGetApproverSetProcedure: {
			func() error {
				_, err := evil.CommandBatches.GetApproverSet(ctx, connect.NewRequest(&apiv1.GetApproverSetRequest{Tenant: "acme"}))
				return err
			},
		},
		apiv1connect.PoolServiceCreateProcedure: {
			func() error {
				_, err := evil.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "evil"}))
				return err
			},
			func() error {
				_, err := evil.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: acme.GetId(), Name: "h100"}))
				return err
			},
		},
		apiv1connect.PoolServiceListProcedure: {
			func() error {
				_, err := evil.Pools.List(ctx, connect.NewRequest(&apiv1.ListPoolsRequest{Tenant: "acme", IncludeArchived: true}))
				return err
			},
			func() error {
				_, err := evil.Pools.List(ctx, connect.NewRequest(&apiv1.ListPoolsRequest{}))
				return err
			},
		},
		apiv1connect.PoolServiceGetProcedure: {
			func() error {
				_, err := evil.Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: "acme", Pool: "h100"}))
				return err
			},
			func() error {
				_, err := evil.Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: "acme", Pool: poolID}))
				return err
			},
			func() error {
				_, err := evil.Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: "other", Pool: poolID}))
				return err
			},
		},
		apiv1connect.PoolServiceUpdateProcedure: {
			func() error {
				_, err := evil.Pools.Update(ctx, connect.NewRequest(&apiv1.UpdatePoolRequest{Tenant: "acme", Pool: "h100", Policy: &apiv1.PoolPolicy{SingleTenant: true}}))
				return err
			},
			func() error {
				_, err := evil.Pools.Update(ctx, connect.NewRequest(&apiv1.UpdatePoolRequest{Tenant: "acme", Pool: poolID, Policy: &apiv1.PoolPolicy{SingleTenant: true}}))
				return err
			},
			func() error {
				_, err := evil.Pools.Update(ctx, connect.NewRequest(&apiv1.UpdatePoolRequest{Tenant: "other", Pool: poolID, Policy: &apiv1.PoolPolicy{SingleTenant: true}}))
				return err
			},
		},
		apiv1connect.PoolServiceArchiveProcedure: {
			func() error {
				_, err := evil.Pools.Archive(ctx, connect.NewRequest(&apiv1.ArchivePoolRequest{Tenant: "acme", Pool: "h100"}))
				return err
			},
			func() error {
				_, err := evil.Pools.Archive(ctx, connect.NewRequest(&apiv1.ArchivePoolRequest{Tenant: "acme", Pool: poolID}))
				return err
			},
			func() error {
				_, err := evil.Pools.Archive(ctx, connect.NewRequest(&apiv1.ArchivePoolRequest{Tenant: "other", Pool: poolID}))
				return err
			},
		},
		apiv1connect.PoolServiceOfferProcedure: {
			func() error {
				_, err := evil.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "acme", Pool: "h100", To: []string{"other"}}))
				return err
			},
			func() error {
				_, err := evil.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "other", Pool: poolID, To: []string{"all"}}))
				return err
			},
			func() error {
				_, err := evil.Pools.Offer(ctx, connect.NewRequest(&apiv1.OfferPoolRequest{Tenant: "acme", Pool: poolID, To: []string{"all"}}))
				return err
			},
		},
		apiv1connect.WebhookServiceCreateProcedure: {
			func() error {
				_, err := evil.Webhooks.Create(ctx, connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: "acme", Url: evilURL}))
				return err
			},
			func() error {
				_, err := evil.Webhooks.Create(ctx, connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: acme.GetId(), Url: evilURL}))
				return err
			},
		},
		apiv1connect.WebhookServiceGetProcedure: {
			func() error {
				_, err := evil.Webhooks.Get(ctx, connect.NewRequest(&apiv1.GetWebhookRequest{Tenant: "acme", Webhook: whID}))
				return err
			},
			func() error {
				_, err := evil.Webhooks.Get(ctx, connect.NewRequest(&apiv1.GetWebhookRequest{Tenant: "other", Webhook: whID}))
				return err
			},
		},
		apiv1connect.WebhookServiceListProcedure: {
			func() error {
				_, err := evil.Webhooks.List(ctx, connect.NewRequest(&apiv1.ListWebhooksRequest{Tenant: "acme"}))
				return err
			},
		},
		apiv1connect.WebhookServiceUpdateProcedure: {
			func() error {
				_, err := evil.Webhooks.Update(ctx, connect.NewRequest(&apiv1.UpdateWebhookRequest{Tenant: "acme", Webhook: whID, Url: &evilURL}))
				return err
			},
			func() error {
				_, err := evil.Webhooks.Update(ctx, connect.NewRequest(&apiv1.UpdateWebhookRequest{Tenant: "other", Webhook: whID, Url: &evilURL}))
				return err
			},
		},
		apiv1connect.WebhookServiceDeleteProcedure: {
			func() error {
				_, err := evil.Webhooks.Delete(ctx, connect.NewRequest(&apiv1.DeleteWebhookRequest{Tenant: "acme", Webhook: whID}))
				return err
			},
			func() error {
				_, err := evil.Webhooks.Delete(ctx, connect.NewRequest(&apiv1.DeleteWebhookRequest{Tenant: "other", Webhook: whID}))
				return err
			},
		},
		apiv1connect.WebhookServiceTestProcedure: {
			func() error {
				_, err := evil.Webhooks.Test(ctx, connect.NewRequest(&apiv1.TestWebhookRequest{Tenant: "acme", Webhook: whID}))
				return err
			},
			func() error {
				_, err := evil.Webhooks.Test(ctx, connect.NewRequest(&apiv1.TestWebhookRequest{Tenant: "other", Webhook: whID}))
				return err
			},
		},
		apiv1connect.WebhookServiceRotateSecretProcedure: {
			func() error {
				_, err := evil.Webhooks.RotateSecret(ctx, connect.NewRequest(&apiv1.RotateWebhookSecretRequest{Tenant: "acme", Webhook: whID}))
				return err
			},
			func() error {
				_, err := evil.Webhooks.RotateSecret(ctx, connect.NewRequest(&apiv1.RotateWebhookSecretRequest{Tenant: "other", Webhook: whID}))
				return err
			},
		},
		apiv1connect.WebhookServiceListDeliveriesProcedure: {
			func() error {
				_, err := evil.Webhooks.ListDeliveries(ctx, connect.NewRequest(&apiv1.ListWebhookDeliveriesRequest{Tenant: "acme", Webhook: whID}))
				return err
			},
			func() error {
				_, err := evil.Webhooks.ListDeliveries(ctx, connect.NewRequest(&apiv1.ListWebhookDeliveriesRequest{Tenant: "other", Webhook: whID}))
				return err
			},
		},
		apiv1connect.WebhookServiceRedeliverProcedure: {
			func() error {
				_, err := evil.Webhooks.Redeliver(ctx, connect.NewRequest(&apiv1.RedeliverWebhookRequest{Tenant: "acme", Webhook: whID, Delivery: dead.ID}))
				return err
			},
			func() error {
				_, err := evil.Webhooks.Redeliver(ctx, connect.NewRequest(&apiv1.RedeliverWebhookRequest{Tenant: "other", Webhook: whID, Delivery: dead.ID}))
				return err
			},
		},
		apiv1connect.CapacityServiceByConsumerProcedure: {
			func() error {
				_, err := evil.Capacity.ByConsumer(ctx, connect.NewRequest(&apiv1.CapacityByConsumerRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.Capacity.ByConsumer(ctx, connect.NewRequest(&apiv1.CapacityByConsumerRequest{Tenant: "other", Pool: poolID}))
				return err
			},
		},
		apiv1connect.QuotaServiceSetProcedure: {
			func() error {
				_, err := evil.Quotas.Set(ctx, connect.NewRequest(&apiv1.SetQuotaRequest{Tenant: "acme", Project: "web", Gpus: &evilGPUs}))
				return err
			},
			func() error {
				_, err := evil.Quotas.Set(ctx, connect.NewRequest(&apiv1.SetQuotaRequest{Tenant: acme.GetId(), Project: web.GetId(), Model: "H100", Gpus: &evilGPUs}))
				return err
			},
			func() error {
				_, err := evil.Quotas.Set(ctx, connect.NewRequest(&apiv1.SetQuotaRequest{Tenant: "other", Project: web.GetId(), Gpus: &evilGPUs}))
				return err
			},
			func() error {
				_, err := evil.Quotas.Set(ctx, connect.NewRequest(&apiv1.SetQuotaRequest{Tenant: "other", Project: "web", Pool: poolID, Gpus: &evilGPUs}))
				return err
			},
		},
		apiv1connect.QuotaServiceGetProcedure: {
			func() error {
				_, err := evil.Quotas.Get(ctx, connect.NewRequest(&apiv1.GetQuotaRequest{Tenant: "acme", Quota: quo.ID}))
				return err
			},
			func() error {
				_, err := evil.Quotas.Get(ctx, connect.NewRequest(&apiv1.GetQuotaRequest{Tenant: "other", Quota: quo.ID}))
				return err
			},
		},
		apiv1connect.QuotaServiceListProcedure: {
			func() error {
				_, err := evil.Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{Tenant: "acme", Project: "web"}))
				return err
			},
			func() error {
				_, err := evil.Quotas.List(ctx, connect.NewRequest(&apiv1.ListQuotasRequest{}))
				return err
			},
		},
		apiv1connect.BudgetServiceSetProcedure: {
			func() error {
				_, err := evil.Budgets.Set(ctx, connect.NewRequest(&apiv1.SetBudgetRequest{Tenant: "acme", Period: "month", Amount: "999999"}))
				return err
			},
			func() error {
				_, err := evil.Budgets.Set(ctx, connect.NewRequest(&apiv1.SetBudgetRequest{Tenant: acme.GetId(), Period: "day", Amount: "1", Enforcement: "soft"}))
				return err
			},
		},
		apiv1connect.BudgetServiceGetProcedure: {
			func() error {
				_, err := evil.Budgets.Get(ctx, connect.NewRequest(&apiv1.GetBudgetRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.Budgets.Get(ctx, connect.NewRequest(&apiv1.GetBudgetRequest{Tenant: acme.GetId()}))
				return err
			},
		},
		apiv1connect.BudgetServiceListProcedure: {
			func() error {
				_, err := evil.Budgets.List(ctx, connect.NewRequest(&apiv1.ListBudgetsRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.Budgets.List(ctx, connect.NewRequest(&apiv1.ListBudgetsRequest{}))
				return err
			},
		},
		apiv1connect.BudgetServiceDeleteProcedure: {
			func() error {
				_, err := evil.Budgets.Delete(ctx, connect.NewRequest(&apiv1.DeleteBudgetRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.Budgets.Delete(ctx, connect.NewRequest(&apiv1.DeleteBudgetRequest{Tenant: acme.GetId()}))
				return err
			},
		},
		apiv1connect.CapacityServiceSummaryProcedure: {
			func() error {
				_, err := evil.Capacity.Summary(ctx, connect.NewRequest(&apiv1.CapacitySummaryRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.Capacity.Summary(ctx, connect.NewRequest(&apiv1.CapacitySummaryRequest{}))
				return err
			},
		},
		apiv1connect.CapacityServiceByPoolProcedure: {
			func() error {
				_, err := evil.Capacity.ByPool(ctx, connect.NewRequest(&apiv1.CapacityByPoolRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.Capacity.ByPool(ctx, connect.NewRequest(&apiv1.CapacityByPoolRequest{Tenant: "acme", Pool: "h100"}))
				return err
			},
			func() error {
				_, err := evil.Capacity.ByPool(ctx, connect.NewRequest(&apiv1.CapacityByPoolRequest{Pool: poolID}))
				return err
			},
			func() error {
				_, err := evil.Capacity.ByPool(ctx, connect.NewRequest(&apiv1.CapacityByPoolRequest{Tenant: "other", Pool: poolID}))
				return err
			},
			func() error {
				_, err := evil.Capacity.ByPool(ctx, connect.NewRequest(&apiv1.CapacityByPoolRequest{}))
				return err
			},
		},
		apiv1connect.CapacityServiceTimelineProcedure: {
			func() error {
				_, err := evil.Capacity.Timeline(ctx, connect.NewRequest(&apiv1.CapacityTimelineRequest{Tenant: "acme", Pool: "h100"}))
				return err
			},
			func() error {
				_, err := evil.Capacity.Timeline(ctx, connect.NewRequest(&apiv1.CapacityTimelineRequest{Pool: poolID}))
				return err
			},
			func() error {
				_, err := evil.Capacity.Timeline(ctx, connect.NewRequest(&apiv1.CapacityTimelineRequest{Tenant: "other", Pool: poolID}))
				return err
			},
		},
		apiv1connect.CapacityServiceRebuildProcedure: {func() error {
			_, err := evil.Capacity.Rebuild(ctx, connect.NewRequest(&apiv1.RebuildCapacityRequest{}))
			return err
		}},
		apiv1connect.ReservationServiceCreateProcedure: {
			func() error {
				_, err := evil.Reservations.Create(ctx, connect.NewRequest(evilBooking))
				return err
			},
			func() error {
				_, err := evil.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: acme.GetId(),
					Project: web.GetId(), Pool: poolID, Gpus: 1}))
				return err
			},
			func() error {
				_, err := evil.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "other",
					Project: web.GetId(), Pool: poolID, Gpus: 1}))
				return err
			},
			func() error {
				_, err := evil.Reservations.Create(ctx, connect.NewRequest(&apiv1.CreateReservationRequest{Tenant: "other",
					Project: "web", Pool: "h100", Gpus: 1}))
				return err
			},
		},
		apiv1connect.ReservationServiceCreateReservationsProcedure: {
			func() error {
				_, err := evil.Reservations.CreateReservations(ctx, connect.NewRequest(&apiv1.CreateReservationsRequest{Template: evilBooking, Count: 2}))
				return err
			},
			func() error {
				_, err := evil.Reservations.CreateReservations(ctx, connect.NewRequest(&apiv1.CreateReservationsRequest{Count: 2,
					Template: &apiv1.CreateReservationRequest{Tenant: acme.GetId(), Project: web.GetId(), Pool: poolID, Gpus: 1}}))
				return err
			},
			func() error {
				_, err := evil.Reservations.CreateReservations(ctx, connect.NewRequest(&apiv1.CreateReservationsRequest{Count: 2, MinCount: 1,
					Template: &apiv1.CreateReservationRequest{Tenant: "other", Project: "web", Pool: "h100", Gpus: 1}}))
				return err
			},
		},
		apiv1connect.ReservationServicePreviewProcedure: {
			func() error {
				_, err := evil.Reservations.Preview(ctx, connect.NewRequest(&apiv1.PreviewReservationRequest{Request: evilBooking}))
				return err
			},
			func() error {
				_, err := evil.Reservations.Preview(ctx, connect.NewRequest(&apiv1.PreviewReservationRequest{Request: &apiv1.CreateReservationRequest{
					Tenant: "other", Project: web.GetId(), Pool: poolID, Gpus: 1}}))
				return err
			},
		},
		apiv1connect.ReservationServiceGetProcedure: {
			func() error {
				_, err := evil.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: rsvID}))
				return err
			},
			func() error {
				_, err := evil.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "other", Reservation: rsvID}))
				return err
			},
		},
		apiv1connect.ReservationServiceListProcedure: {
			func() error {
				_, err := evil.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{}))
				return err
			},
			func() error {
				_, err := evil.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: "other", Pool: poolID}))
				return err
			},
			func() error {
				_, err := evil.Reservations.List(ctx, connect.NewRequest(&apiv1.ListReservationsRequest{Tenant: "other", Project: web.GetId()}))
				return err
			},
		},
		apiv1connect.ReservationServiceWatchProcedure: {
			func() error {
				return sfWatchReservations(ctx, evil, &apiv1.WatchReservationsRequest{Tenant: "acme"})
			},
			func() error {
				return sfWatchReservations(ctx, evil, &apiv1.WatchReservationsRequest{Tenant: acme.GetId(), Reservation: rsvID})
			},
			func() error {
				return sfWatchReservations(ctx, evil, &apiv1.WatchReservationsRequest{Tenant: "other", Reservation: rsvID})
			},
		},
		apiv1connect.ReservationServiceExtendProcedure: {
			func() error {
				_, err := evil.Reservations.Extend(ctx, connect.NewRequest(&apiv1.ExtendReservationRequest{Tenant: "acme", Reservation: rsvID,
					ExtendSeconds: 3600}))
				return err
			},
			func() error {
				_, err := evil.Reservations.Extend(ctx, connect.NewRequest(&apiv1.ExtendReservationRequest{Tenant: "other", Reservation: rsvID,
					ExtendSeconds: 3600}))
				return err
			},
		},
		apiv1connect.ReservationServiceReleaseProcedure: {
			func() error {
				_, err := evil.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "acme", Reservation: rsvID}))
				return err
			},
			func() error {
				_, err := evil.Reservations.Release(ctx, connect.NewRequest(&apiv1.ReleaseReservationRequest{Tenant: "other", Reservation: rsvID}))
				return err
			},
		},
		apiv1connect.ReservationServiceExecProcedure: {
			func() error {
				return sfExec(ctx, evil, &apiv1.ExecReservationRequest{Tenant: "acme", Reservation: rsvID, Argv: []string{"id"}})
			},
			func() error {
				return sfExec(ctx, evil, &apiv1.ExecReservationRequest{Tenant: "other", Reservation: rsvID, Argv: []string{"id"}})
			},
		},
		apiv1connect.ReservationServiceCancelProcedure: {
			func() error {
				_, err := evil.Reservations.Cancel(ctx, connect.NewRequest(&apiv1.CancelReservationRequest{Tenant: "acme", Reservation: rsvID}))
				return err
			},
			func() error {
				_, err := evil.Reservations.Cancel(ctx, connect.NewRequest(&apiv1.CancelReservationRequest{Tenant: "other", Reservation: rsvID}))
				return err
			},
		},
		apiv1connect.UsageServiceListProcedure: {
			func() error {
				_, err := evil.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: acme.GetId(), Project: "web"}))
				return err
			},
			func() error {
				_, err := evil.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{Tenant: "other", Project: web.GetId()}))
				return err
			},
			func() error {
				_, err := evil.Usage.List(ctx, connect.NewRequest(&apiv1.ListUsageRequest{}))
				return err
			},
		},
		apiv1connect.UsageServiceExportProcedure: {
			func() error {
				_, err := evil.Usage.Export(ctx, connect.NewRequest(&apiv1.ExportUsageRequest{Tenant: "acme", Format: "csv"}))
				return err
			},
			func() error {
				_, err := evil.Usage.Export(ctx, connect.NewRequest(&apiv1.ExportUsageRequest{Tenant: "other", Project: web.GetId(), Format: "cloudevents"}))
				return err
			},
			func() error {
				_, err := evil.Usage.Export(ctx, connect.NewRequest(&apiv1.ExportUsageRequest{Format: "cloudevents"}))
				return err
			},
		},
		apiv1connect.JoinTokenServiceCreateProcedure: {
			func() error {
				_, err := evil.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "web"}))
				return err
			},
			func() error {
				_, err := evil.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "other", Project: web.GetId()}))
				return err
			},
		},
		apiv1connect.JoinTokenServiceListProcedure: {
			func() error {
				_, err := evil.JoinTokens.List(ctx, connect.NewRequest(&apiv1.ListJoinTokensRequest{Tenant: "acme", IncludeInactive: true}))
				return err
			},
			func() error {
				_, err := evil.JoinTokens.List(ctx, connect.NewRequest(&apiv1.ListJoinTokensRequest{}))
				return err
			},
		},
		apiv1connect.JoinTokenServiceRevokeProcedure: {
			func() error {
				_, err := evil.JoinTokens.Revoke(ctx, connect.NewRequest(&apiv1.RevokeJoinTokenRequest{Tenant: "acme", Id: jtID}))
				return err
			},
			func() error {
				_, err := evil.JoinTokens.Revoke(ctx, connect.NewRequest(&apiv1.RevokeJoinTokenRequest{Tenant: "other", Id: jtID}))
				return err
			},
			func() error {
				_, err := evil.JoinTokens.Revoke(ctx, connect.NewRequest(&apiv1.RevokeJoinTokenRequest{Id: jtID}))
				return err
			},
		},
		apiv1connect.TrustAnchorServiceCreateProcedure: {
			func() error {
				_, err := evil.TrustAnchors.Create(ctx, connect.NewRequest(&apiv1.CreateTrustAnchorRequest{Tenant: "acme", Name: "evil",
					Attestor: "tpm", EkPublicSha256: strings.Repeat("cd", 32)}))
				return err
			},
		},
		apiv1connect.TrustAnchorServiceListProcedure: {
			func() error {
				_, err := evil.TrustAnchors.List(ctx, connect.NewRequest(&apiv1.ListTrustAnchorsRequest{Tenant: "acme"}))
				return err
			},
		},
		apiv1connect.TrustAnchorServiceDeleteProcedure: {
			func() error {
				_, err := evil.TrustAnchors.Delete(ctx, connect.NewRequest(&apiv1.DeleteTrustAnchorRequest{Tenant: "acme", TrustAnchor: ancID}))
				return err
			},
			func() error {
				_, err := evil.TrustAnchors.Delete(ctx, connect.NewRequest(&apiv1.DeleteTrustAnchorRequest{Tenant: "other", TrustAnchor: ancID}))
				return err
			},
		},
		apiv1connect.JoinRequestServiceListProcedure: {
			func() error {
				_, err := evil.JoinRequests.List(ctx, connect.NewRequest(&apiv1.ListJoinRequestsRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.JoinRequests.List(ctx, connect.NewRequest(&apiv1.ListJoinRequestsRequest{}))
				return err
			},
		},
		apiv1connect.JoinRequestServiceApproveProcedure: {
			func() error {
				_, err := evil.JoinRequests.Approve(ctx, connect.NewRequest(&apiv1.ApproveJoinRequestRequest{Tenant: "acme", Id: jrq.ID}))
				return err
			},
			func() error {
				_, err := evil.JoinRequests.Approve(ctx, connect.NewRequest(&apiv1.ApproveJoinRequestRequest{Tenant: "other", Id: jrq.ID}))
				return err
			},
			func() error {
				_, err := evil.JoinRequests.Approve(ctx, connect.NewRequest(&apiv1.ApproveJoinRequestRequest{Id: jrq.ID}))
				return err
			},
		},
		apiv1connect.JoinRequestServiceRejectProcedure: {
			func() error {
				_, err := evil.JoinRequests.Reject(ctx, connect.NewRequest(&apiv1.RejectJoinRequestRequest{Tenant: "acme", Id: jrq.ID}))
				return err
			},
			func() error {
				_, err := evil.JoinRequests.Reject(ctx, connect.NewRequest(&apiv1.RejectJoinRequestRequest{Id: jrq.ID}))
				return err
			},
		},
		apiv1connect.InventoryServiceGetProcedure: {
			func() error {
				_, err := evil.Inventory.Get(ctx, connect.NewRequest(&apiv1.GetInventoryRequest{Tenant: "acme", Node: "gpu-1"}))
				return err
			},
			func() error {
				_, err := evil.Inventory.Get(ctx, connect.NewRequest(&apiv1.GetInventoryRequest{Node: node.ID}))
				return err
			},
		},
		apiv1connect.EventServiceWatchProcedure: {
			func() error {
				ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				return evil.Watch(ctx, &apiv1.WatchEventsRequest{Tenant: "acme"}, func(*apiv1.Event) error { return nil })
			},
			// No tenant is the key's own tenant's stream (TestSSEResumeAndScope
			// shows it carries none of acme's events), not the platform's.
		},
		apiv1connect.EventServiceListProcedure: {
			func() error {
				_, err := evil.Events.List(ctx, connect.NewRequest(&apiv1.ListEventsRequest{Tenant: "acme"}))
				return err
			},
			// No tenant lists the key's own tenant (TestEventsList shows it
			// holds none of acme's events), not the platform's.
		},
		apiv1connect.ImageServicePushProcedure: {func() error {
			_, err := evil.PushImage(ctx, evilPush, bytes.NewReader(imgBytes), "")
			return err
		}},
		apiv1connect.ImageServiceGetProcedure: {
			func() error {
				_, err := evil.Images.Get(ctx, connect.NewRequest(&apiv1.GetImageRequest{Tenant: "acme", Image: "disk"}))
				return err
			},
			func() error {
				_, err := evil.Images.Get(ctx, connect.NewRequest(&apiv1.GetImageRequest{Tenant: "other", Image: imgID}))
				return err
			},
		},
		apiv1connect.ImageServicePullProcedure: {
			func() error {
				_, err := evil.PullImage(ctx, &apiv1.PullImageRequest{Tenant: "acme", Image: imgID}, io.Discard)
				return err
			},
			func() error {
				_, err := evil.PullImage(ctx, &apiv1.PullImageRequest{Tenant: "other", Image: imgID}, io.Discard)
				return err
			},
		},
		apiv1connect.ImageServiceListProcedure: {func() error {
			_, err := evil.Images.List(ctx, connect.NewRequest(&apiv1.ListImagesRequest{Tenant: acme.GetId()}))
			return err
		}},
		apiv1connect.ImageServiceSignProcedure: {
			func() error {
				_, err := evil.Images.Sign(ctx, connect.NewRequest(&apiv1.SignImageRequest{Tenant: "acme", Image: imgID,
					KeyFingerprint: evilSigner.Public.Fingerprint, Signature: evilSig}))
				return err
			},
			func() error {
				_, err := evil.Images.Sign(ctx, connect.NewRequest(&apiv1.SignImageRequest{Tenant: "other", Image: imgID,
					KeyFingerprint: evilSigner.Public.Fingerprint, Signature: evilSig}))
				return err
			},
		},
		apiv1connect.ImageServicePromoteProcedure: {
			func() error {
				_, err := evil.Images.Promote(ctx, connect.NewRequest(&apiv1.PromoteImageRequest{Tenant: "acme", Image: imgID}))
				return err
			},
			func() error {
				_, err := evil.Images.Promote(ctx, connect.NewRequest(&apiv1.PromoteImageRequest{Tenant: "other", Image: imgID}))
				return err
			},
		},
		apiv1connect.ImageServiceDeleteProcedure: {
			func() error {
				_, err := evil.Images.Delete(ctx, connect.NewRequest(&apiv1.DeleteImageRequest{Tenant: "acme", Image: "disk"}))
				return err
			},
			func() error {
				_, err := evil.Images.Delete(ctx, connect.NewRequest(&apiv1.DeleteImageRequest{Tenant: "other", Image: imgID}))
				return err
			},
		},
		apiv1connect.SignerKeyServiceAddProcedure: {func() error {
			_, err := evil.SignerKeys.Add(ctx, connect.NewRequest(&apiv1.AddSignerKeyRequest{Tenant: "acme", Name: "evil", PublicKey: evilSigner.Public.PEM()}))
			return err
		}},
		apiv1connect.SignerKeyServiceListProcedure: {func() error {
			_, err := evil.SignerKeys.List(ctx, connect.NewRequest(&apiv1.ListSignerKeysRequest{Tenant: "acme"}))
			return err
		}},
		apiv1connect.SignerKeyServiceRemoveProcedure: {
			func() error {
				_, err := evil.SignerKeys.Remove(ctx, connect.NewRequest(&apiv1.RemoveSignerKeyRequest{Tenant: "acme", Key: "ci"}))
				return err
			},
			func() error {
				_, err := evil.SignerKeys.Remove(ctx, connect.NewRequest(&apiv1.RemoveSignerKeyRequest{Tenant: "other", Key: acmeSigner.Public.Fingerprint}))
				return err
			},
		},
		apiv1connect.SiteServiceCreateProcedure: {func() error {
			_, err := evil.Sites.Create(ctx, connect.NewRequest(&apiv1.CreateSiteRequest{Tenant: "acme", Name: "evil", Networks: []string{"10.0.0.0/8"}}))
			return err
		}},
		apiv1connect.SiteServiceGetProcedure: {
			func() error {
				_, err := evil.Sites.Get(ctx, connect.NewRequest(&apiv1.GetSiteRequest{Tenant: "acme", Site: "dc1"}))
				return err
			},
			func() error {
				_, err := evil.Sites.Get(ctx, connect.NewRequest(&apiv1.GetSiteRequest{Tenant: "other", Site: siteID}))
				return err
			},
		},
		apiv1connect.SiteServiceListProcedure: {func() error {
			_, err := evil.Sites.List(ctx, connect.NewRequest(&apiv1.ListSitesRequest{Tenant: "acme"}))
			return err
		}},
		apiv1connect.SiteServiceUpdateProcedure: {
			func() error {
				_, err := evil.Sites.Update(ctx, connect.NewRequest(&apiv1.UpdateSiteRequest{Tenant: "acme", Site: "dc1",
					UpdateNetworks: true, Networks: []string{"10.0.0.0/8"}}))
				return err
			},
			func() error {
				_, err := evil.Sites.Update(ctx, connect.NewRequest(&apiv1.UpdateSiteRequest{Tenant: "other", Site: siteID,
					UpdateNetworks: true, Networks: []string{"10.0.0.0/8"}}))
				return err
			},
		},
		apiv1connect.SiteServiceListDriversProcedure: {
			func() error {
				_, err := evil.Sites.ListDrivers(ctx, connect.NewRequest(&apiv1.ListSiteDriversRequest{Tenant: "acme", Site: "dc1"}))
				return err
			},
			func() error {
				_, err := evil.Sites.ListDrivers(ctx, connect.NewRequest(&apiv1.ListSiteDriversRequest{Tenant: "acme", Site: siteID}))
				return err
			},
			func() error {
				_, err := evil.Sites.ListDrivers(ctx, connect.NewRequest(&apiv1.ListSiteDriversRequest{Tenant: "other", Site: siteID}))
				return err
			},
		},
		apiv1connect.SiteServiceDeleteProcedure: {
			func() error {
				_, err := evil.Sites.Delete(ctx, connect.NewRequest(&apiv1.DeleteSiteRequest{Tenant: "acme", Site: "dc1"}))
				return err
			},
			func() error {
				_, err := evil.Sites.Delete(ctx, connect.NewRequest(&apiv1.DeleteSiteRequest{Tenant: "other", Site: siteID}))
				return err
			},
		},
		apiv1connect.MachineServiceEnrollProcedure: {func() error {
			_, err := evil.Machines.Enroll(ctx, connect.NewRequest(&apiv1.EnrollMachineRequest{Tenant: "acme", Site: "dc1", Name: "evil",
				BmcDriver: "ipmi", BmcAddress: "127.0.0.9", BmcUsername: "u", BmcPassword: "p", Mac: "02:00:00:00:00:99"}))
			return err
		}},
		apiv1connect.MachineServiceGetProcedure: {
			func() error {
				_, err := evil.Machines.Get(ctx, connect.NewRequest(&apiv1.GetMachineRequest{Tenant: "acme", Machine: "m1"}))
				return err
			},
			func() error {
				_, err := evil.Machines.Get(ctx, connect.NewRequest(&apiv1.GetMachineRequest{Tenant: "other", Machine: machineID}))
				return err
			},
		},
		apiv1connect.MachineServiceListProcedure: {func() error {
			_, err := evil.Machines.List(ctx, connect.NewRequest(&apiv1.ListMachinesRequest{Tenant: "acme"}))
			return err
		}},
		apiv1connect.MachineServiceInspectProcedure: {
			func() error {
				_, err := evil.Machines.Inspect(ctx, connect.NewRequest(&apiv1.InspectMachineRequest{Tenant: "acme", Machine: "m1"}))
				return err
			},
			func() error {
				_, err := evil.Machines.Inspect(ctx, connect.NewRequest(&apiv1.InspectMachineRequest{Tenant: "other", Machine: machineID}))
				return err
			},
		},
		apiv1connect.MachineServiceCommissionProcedure: {
			func() error {
				_, err := evil.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "acme", Machine: "m1"}))
				return err
			},
			func() error {
				_, err := evil.Machines.Commission(ctx, connect.NewRequest(&apiv1.CommissionMachineRequest{Tenant: "other", Machine: machineID}))
				return err
			},
		},
		apiv1connect.MachineServiceDeployProcedure: {
			func() error {
				_, err := evil.Machines.Deploy(ctx, connect.NewRequest(&apiv1.DeployMachineRequest{Tenant: "acme", Machine: "m1", Image: "disk"}))
				return err
			},
			func() error {
				_, err := evil.Machines.Deploy(ctx, connect.NewRequest(&apiv1.DeployMachineRequest{Tenant: "other", Machine: machineID, Image: imgID}))
				return err
			},
		},
		apiv1connect.MachineServiceReleaseProcedure: {
			func() error {
				_, err := evil.Machines.Release(ctx, connect.NewRequest(&apiv1.ReleaseMachineRequest{Tenant: "acme", Machine: "m1"}))
				return err
			},
			func() error {
				_, err := evil.Machines.Release(ctx, connect.NewRequest(&apiv1.ReleaseMachineRequest{Tenant: "other", Machine: machineID}))
				return err
			},
		},
		apiv1connect.MachineServiceRetireProcedure: {
			func() error {
				_, err := evil.Machines.Retire(ctx, connect.NewRequest(&apiv1.RetireMachineRequest{Tenant: "acme", Machine: "m1"}))
				return err
			},
			func() error {
				_, err := evil.Machines.Retire(ctx, connect.NewRequest(&apiv1.RetireMachineRequest{Tenant: "other", Machine: machineID}))
				return err
			},
		},
		apiv1connect.FlavorServiceCreateProcedure: {func() error {
			_, err := evil.Flavors.Create(ctx, connect.NewRequest(&apiv1.CreateFlavorRequest{Tenant: "acme", Name: "evil", Vcpus: 1,
				MemoryMib: 512, DiskGib: 1}))
			return err
		}},
		apiv1connect.FlavorServiceGetProcedure: {
			func() error {
				_, err := evil.Flavors.Get(ctx, connect.NewRequest(&apiv1.GetFlavorRequest{Tenant: "acme", Flavor: "small"}))
				return err
			},
			func() error {
				_, err := evil.Flavors.Get(ctx, connect.NewRequest(&apiv1.GetFlavorRequest{Tenant: "other", Flavor: flavorID}))
				return err
			},
		},
		apiv1connect.FlavorServiceListProcedure: {func() error {
			_, err := evil.Flavors.List(ctx, connect.NewRequest(&apiv1.ListFlavorsRequest{Tenant: "acme"}))
			return err
		}},
		apiv1connect.FlavorServiceDeleteProcedure: {
			func() error {
				_, err := evil.Flavors.Delete(ctx, connect.NewRequest(&apiv1.DeleteFlavorRequest{Tenant: "acme", Flavor: "small"}))
				return err
			},
			func() error {
				_, err := evil.Flavors.Delete(ctx, connect.NewRequest(&apiv1.DeleteFlavorRequest{Tenant: "other", Flavor: flavorID}))
				return err
			},
		},
		apiv1connect.SandboxTemplateServiceCreateProcedure: {
			func() error {
				_, err := evil.SandboxTemplates.Create(ctx, connect.NewRequest(&apiv1.CreateSandboxTemplateRequest{Tenant: "acme", Name: "evil",
					Flavor: "small", Env: map[string]string{"DB": "secret://db"}}))
				return err
			},
		},
		apiv1connect.SandboxTemplateServiceGetProcedure: {
			func() error {
				_, err := evil.SandboxTemplates.Get(ctx, connect.NewRequest(&apiv1.GetSandboxTemplateRequest{Tenant: "acme", Template: "t1"}))
				return err
			},
			func() error {
				_, err := evil.SandboxTemplates.Get(ctx, connect.NewRequest(&apiv1.GetSandboxTemplateRequest{Tenant: "other", Template: tpl.ID}))
				return err
			},
		},
		apiv1connect.SandboxTemplateServiceListProcedure: {func() error {
			_, err := evil.SandboxTemplates.List(ctx, connect.NewRequest(&apiv1.ListSandboxTemplatesRequest{Tenant: "acme"}))
			return err
		}},
		apiv1connect.SandboxTemplateServiceDeleteProcedure: {
			func() error {
				_, err := evil.SandboxTemplates.Delete(ctx, connect.NewRequest(&apiv1.DeleteSandboxTemplateRequest{Tenant: "acme", Template: "t1"}))
				return err
			},
			func() error {
				_, err := evil.SandboxTemplates.Delete(ctx, connect.NewRequest(&apiv1.DeleteSandboxTemplateRequest{Tenant: "other", Template: tpl.ID}))
				return err
			},
		},
		apiv1connect.SandboxServiceCreateProcedure: {
			func() error {
				_, err := evil.Sandboxes.Create(ctx, connect.NewRequest(&apiv1.CreateSandboxRequest{Tenant: "acme", Template: "t1"}))
				return err
			},
			func() error {
				_, err := evil.Sandboxes.Create(ctx, connect.NewRequest(&apiv1.CreateSandboxRequest{Tenant: "other", Template: tpl.ID}))
				return err
			},
		},
		apiv1connect.SandboxServiceGetProcedure: {
			func() error {
				_, err := evil.Sandboxes.Get(ctx, connect.NewRequest(&apiv1.GetSandboxRequest{Tenant: "acme", Sandbox: sbx.ID}))
				return err
			},
			func() error {
				_, err := evil.Sandboxes.Get(ctx, connect.NewRequest(&apiv1.GetSandboxRequest{Tenant: "other", Sandbox: sbx.ID}))
				return err
			},
		},
		apiv1connect.SandboxServiceListProcedure: {func() error {
			_, err := evil.Sandboxes.List(ctx, connect.NewRequest(&apiv1.ListSandboxesRequest{Tenant: "acme"}))
			return err
		}},
		apiv1connect.SandboxServiceExtendProcedure: {
			func() error {
				_, err := evil.Sandboxes.Extend(ctx, connect.NewRequest(&apiv1.ExtendSandboxRequest{Tenant: "acme", Sandbox: sbx.ID,
					Ttl: durationpb.New(time.Hour)}))
				return err
			},
			func() error {
				_, err := evil.Sandboxes.Extend(ctx, connect.NewRequest(&apiv1.ExtendSandboxRequest{Tenant: "other", Sandbox: sbx.ID,
					Ttl: durationpb.New(time.Hour)}))
				return err
			},
		},
		apiv1connect.SandboxServiceDeleteProcedure: {
			func() error {
				_, err := evil.Sandboxes.Delete(ctx, connect.NewRequest(&apiv1.DeleteSandboxRequest{Tenant: "acme", Sandbox: sbx.ID}))
				return err
			},
			func() error {
				_, err := evil.Sandboxes.Delete(ctx, connect.NewRequest(&apiv1.DeleteSandboxRequest{Tenant: "other", Sandbox: sbx.ID}))
				return err
			},
		},
		apiv1connect.WorkloadIdentityServiceIssueTokenProcedure: {
			func() error {
				_, err := evil.WorkloadIdentity.IssueToken(ctx, connect.NewRequest(&apiv1.IssueWorkloadTokenRequest{Tenant: "acme",
					WorkloadKind: "sandbox", Workload: sbx.ID, Audience: "https://store.example"}))
				return err
			},
			func() error {
				_, err := evil.WorkloadIdentity.IssueToken(ctx, connect.NewRequest(&apiv1.IssueWorkloadTokenRequest{Tenant: "other",
					WorkloadKind: "reservation", Workload: rsvID, Audience: "https://store.example"}))
				return err
			},
		},
		apiv1connect.SandboxServiceExecProcedure: {
			func() error {
				_, err := evil.Sandboxes.Exec(ctx, connect.NewRequest(&apiv1.ExecSandboxRequest{Tenant: "acme", Sandbox: sbx.ID, PublicKey: evilSSHKey}))
				return err
			},
			func() error {
				_, err := evil.Sandboxes.Exec(ctx, connect.NewRequest(&apiv1.ExecSandboxRequest{Tenant: "other", Sandbox: sbx.ID, PublicKey: evilSSHKey}))
				return err
			},
		},
		apiv1connect.SandboxServiceSnapshotProcedure: {
			func() error {
				_, err := evil.Sandboxes.Snapshot(ctx, connect.NewRequest(&apiv1.SnapshotSandboxRequest{Tenant: "acme", Sandbox: sbx.ID}))
				return err
			},
			func() error {
				_, err := evil.Sandboxes.Snapshot(ctx, connect.NewRequest(&apiv1.SnapshotSandboxRequest{Tenant: "other", Sandbox: sbx.ID}))
				return err
			},
		},
		apiv1connect.SandboxServiceRestoreProcedure: {
			func() error {
				_, err := evil.Sandboxes.Restore(ctx, connect.NewRequest(&apiv1.RestoreSandboxRequest{Tenant: "acme", Sandbox: sbx.ID, Snapshot: sbs.ID}))
				return err
			},
			func() error {
				_, err := evil.Sandboxes.Restore(ctx, connect.NewRequest(&apiv1.RestoreSandboxRequest{Tenant: "other", Sandbox: sbx.ID, Snapshot: sbs.ID}))
				return err
			},
		},
		apiv1connect.SandboxServiceListSnapshotsProcedure: {
			func() error {
				_, err := evil.Sandboxes.ListSnapshots(ctx, connect.NewRequest(&apiv1.ListSandboxSnapshotsRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.Sandboxes.ListSnapshots(ctx, connect.NewRequest(&apiv1.ListSandboxSnapshotsRequest{Tenant: "acme", Sandbox: sbx.ID}))
				return err
			},
		},
		apiv1connect.SandboxServiceDeleteSnapshotProcedure: {
			func() error {
				_, err := evil.Sandboxes.DeleteSnapshot(ctx, connect.NewRequest(&apiv1.DeleteSandboxSnapshotRequest{Tenant: "acme", Snapshot: sbs.ID}))
				return err
			},
			func() error {
				_, err := evil.Sandboxes.DeleteSnapshot(ctx, connect.NewRequest(&apiv1.DeleteSandboxSnapshotRequest{Tenant: "other", Snapshot: sbs.ID}))
				return err
			},
		},
		apiv1connect.SecretServicePutProcedure: {
			func() error {
				_, err := evil.Secrets.Put(ctx, connect.NewRequest(&apiv1.PutSecretRequest{Tenant: "acme", Name: "db", Value: []byte("evil")}))
				return err
			},
		},
		apiv1connect.SecretServiceGetProcedure: {
			func() error {
				_, err := evil.Secrets.Get(ctx, connect.NewRequest(&apiv1.GetSecretRequest{Tenant: "acme", Secret: "db"}))
				return err
			},
			func() error {
				_, err := evil.Secrets.Get(ctx, connect.NewRequest(&apiv1.GetSecretRequest{Tenant: "other", Secret: secretID}))
				return err
			},
		},
		apiv1connect.SecretServiceListProcedure: {func() error {
			_, err := evil.Secrets.List(ctx, connect.NewRequest(&apiv1.ListSecretsRequest{Tenant: "acme"}))
			return err
		}},
		apiv1connect.SecretServiceDeleteProcedure: {
			func() error {
				_, err := evil.Secrets.Delete(ctx, connect.NewRequest(&apiv1.DeleteSecretRequest{Tenant: "acme", Secret: "db"}))
				return err
			},
			func() error {
				_, err := evil.Secrets.Delete(ctx, connect.NewRequest(&apiv1.DeleteSecretRequest{Tenant: "other", Secret: secretID}))
				return err
			},
		},
		// Releases and rollouts are the platform's: another tenant's key
		// reads the published releases (every principal does) and is
		// refused the rest whatever it names.
		apiv1connect.ReleaseServiceCreateProcedure: {func() error {
			_, err := evil.CreateRelease(ctx, `{"payload_type":"x"}`, nil, "")
			return err
		}},
		apiv1connect.ReleaseServiceGetProcedure: {func() error {
			_, err := evil.Releases.Get(ctx, connect.NewRequest(&apiv1.GetReleaseRequest{Version: "v9.9.9"}))
			return err
		}},
		apiv1connect.ReleaseServiceListProcedure: {func() error {
			_, err := evil.Releases.List(ctx, connect.NewRequest(&apiv1.ListReleasesRequest{}))
			return err
		}},
		apiv1connect.ReleaseServiceDeleteProcedure: {func() error {
			_, err := evil.Releases.Delete(ctx, connect.NewRequest(&apiv1.DeleteReleaseRequest{Version: "v9.9.9"}))
			return err
		}},
		apiv1connect.RolloutServiceCreateProcedure: {func() error {
			_, err := evil.Rollouts.Create(ctx, connect.NewRequest(&apiv1.CreateRolloutRequest{Release: "v9.9.9", Pool: "h100", Waves: []string{"100%"}}))
			return err
		}},
		apiv1connect.RolloutServiceGetProcedure: {func() error {
			_, err := evil.Rollouts.Get(ctx, connect.NewRequest(&apiv1.GetRolloutRequest{Id: "rol_00000000000000000000000000"}))
			return err
		}},
		apiv1connect.RolloutServiceListProcedure: {func() error {
			_, err := evil.Rollouts.List(ctx, connect.NewRequest(&apiv1.ListRolloutsRequest{}))
			return err
		}},
		apiv1connect.RolloutServicePauseProcedure: {func() error {
			_, err := evil.Rollouts.Pause(ctx, connect.NewRequest(&apiv1.PauseRolloutRequest{Id: "rol_00000000000000000000000000"}))
			return err
		}},
		apiv1connect.RolloutServiceResumeProcedure: {func() error {
			_, err := evil.Rollouts.Resume(ctx, connect.NewRequest(&apiv1.ResumeRolloutRequest{Id: "rol_00000000000000000000000000"}))
			return err
		}},
		apiv1connect.RolloutServiceAbortProcedure: {func() error {
			_, err := evil.Rollouts.Abort(ctx, connect.NewRequest(&apiv1.AbortRolloutRequest{Id: "rol_00000000000000000000000000"}))
			return err
		}},
		apiv1connect.FleetConfigServiceSetMarkProcedure: {func() error {
			_, err := evil.FleetConfig.SetMark(ctx, connect.NewRequest(&apiv1.SetManagedMarkRequest{Tenant: "acme", Kind: "Pool", Name: "h100", SpecJson: "{}"}))
			return err
		}},
		apiv1connect.FleetConfigServiceListMarksProcedure: {func() error {
			_, err := evil.FleetConfig.ListMarks(ctx, connect.NewRequest(&apiv1.ListManagedMarksRequest{Tenant: "acme"}))
			return err
		}},
		apiv1connect.FleetConfigServiceDeleteMarkProcedure: {func() error {
			_, err := evil.FleetConfig.DeleteMark(ctx, connect.NewRequest(&apiv1.DeleteManagedMarkRequest{Tenant: "acme", Kind: "Pool", Name: "h100"}))
			return err
		}},
		apiv1connect.ProviderAccountServiceCreateProcedure: {func() error {
			_, err := evil.ProviderAccounts.Create(ctx, connect.NewRequest(&apiv1.CreateProviderAccountRequest{Tenant: "acme", Name: "evil",
				Type: "hetzner-cloud", SecretRefs: map[string]string{"token": "secret://db"}}))
			return err
		}},
		apiv1connect.ProviderAccountServiceGetProcedure: {
			func() error {
				_, err := evil.ProviderAccounts.Get(ctx, connect.NewRequest(&apiv1.GetProviderAccountRequest{Tenant: "acme", Account: "hc"}))
				return err
			},
			func() error {
				_, err := evil.ProviderAccounts.Get(ctx, connect.NewRequest(&apiv1.GetProviderAccountRequest{Tenant: "other", Account: pacID}))
				return err
			},
		},
		apiv1connect.ProviderAccountServiceListProcedure: {func() error {
			_, err := evil.ProviderAccounts.List(ctx, connect.NewRequest(&apiv1.ListProviderAccountsRequest{Tenant: "acme"}))
			return err
		}},
		apiv1connect.ProviderAccountServiceDeleteProcedure: {
			func() error {
				_, err := evil.ProviderAccounts.Delete(ctx, connect.NewRequest(&apiv1.DeleteProviderAccountRequest{Tenant: "acme", Account: "hc"}))
				return err
			},
			func() error {
				_, err := evil.ProviderAccounts.Delete(ctx, connect.NewRequest(&apiv1.DeleteProviderAccountRequest{Tenant: "other", Account: pacID}))
				return err
			},
		},
		// The provider types are the same catalog for everyone: nothing of
		// any tenant's.
		apiv1connect.ProviderAccountServiceListTypesProcedure: {func() error {
			_, err := evil.ProviderAccounts.ListTypes(ctx, connect.NewRequest(&apiv1.ListProviderTypesRequest{}))
			return err
		}},
		apiv1connect.ProfileServiceCreateProcedure: {func() error {
			_, err := evil.Profiles.Create(ctx, connect.NewRequest(&apiv1.CreateProfileRequest{Tenant: "acme", Document: sfProfileDoc("evil")}))
			return err
		}},
		apiv1connect.ProfileServiceGetProcedure: {
			func() error {
				_, err := evil.Profiles.Get(ctx, connect.NewRequest(&apiv1.GetProfileRequest{Tenant: "acme", Profile: "acme-deploy"}))
				return err
			},
			func() error {
				_, err := evil.Profiles.Get(ctx, connect.NewRequest(&apiv1.GetProfileRequest{Tenant: "other", Profile: profID}))
				return err
			},
			func() error {
				_, err := evil.Profiles.Get(ctx, connect.NewRequest(&apiv1.GetProfileRequest{Tenant: "other", Profile: "acme-deploy"}))
				return err
			},
		},
		apiv1connect.ProfileServiceListProcedure: {func() error {
			_, err := evil.Profiles.List(ctx, connect.NewRequest(&apiv1.ListProfilesRequest{Tenant: "acme"}))
			return err
		}},
		apiv1connect.ProfileServiceUpdateProcedure: {
			func() error {
				_, err := evil.Profiles.Update(ctx, connect.NewRequest(&apiv1.UpdateProfileRequest{Tenant: "acme", Profile: "acme-deploy",
					Document: sfProfileDoc("acme-deploy")}))
				return err
			},
			func() error {
				_, err := evil.Profiles.Update(ctx, connect.NewRequest(&apiv1.UpdateProfileRequest{Tenant: "other", Profile: profID,
					Document: sfProfileDoc("acme-deploy")}))
				return err
			},
		},
		apiv1connect.ProfileServiceDeleteProcedure: {
			func() error {
				_, err := evil.Profiles.Delete(ctx, connect.NewRequest(&apiv1.DeleteProfileRequest{Tenant: "acme", Profile: "acme-deploy"}))
				return err
			},
			func() error {
				_, err := evil.Profiles.Delete(ctx, connect.NewRequest(&apiv1.DeleteProfileRequest{Tenant: "other", Profile: profID}))
				return err
			},
		},
		apiv1connect.ProfileServiceValidateProcedure: {func() error {
			_, err := evil.Profiles.Validate(ctx, connect.NewRequest(&apiv1.ValidateProfileRequest{Tenant: "acme", Document: sfProfileDoc("x")}))
			return err
		}},
		apiv1connect.IPPoolServiceCreateProcedure: {func() error {
			_, err := evil.IPPools.Create(ctx, connect.NewRequest(&apiv1.CreateIPPoolRequest{Tenant: "acme", Name: "evil", Cidr: "10.8.0.0/24"}))
			return err
		}},
		apiv1connect.IPPoolServiceGetProcedure: {
			func() error {
				_, err := evil.IPPools.Get(ctx, connect.NewRequest(&apiv1.GetIPPoolRequest{Tenant: "acme", IpPool: "lan"}))
				return err
			},
			func() error {
				_, err := evil.IPPools.Get(ctx, connect.NewRequest(&apiv1.GetIPPoolRequest{Tenant: "other", IpPool: ipPoolID}))
				return err
			},
		},
		apiv1connect.IPPoolServiceListProcedure: {func() error {
			_, err := evil.IPPools.List(ctx, connect.NewRequest(&apiv1.ListIPPoolsRequest{Tenant: "acme"}))
			return err
		}},
		apiv1connect.IPPoolServiceListLeasesProcedure: {
			func() error {
				_, err := evil.IPPools.ListLeases(ctx, connect.NewRequest(&apiv1.ListIPLeasesRequest{Tenant: "acme", IpPool: "lan"}))
				return err
			},
			func() error {
				_, err := evil.IPPools.ListLeases(ctx, connect.NewRequest(&apiv1.ListIPLeasesRequest{Tenant: "other", IpPool: ipPoolID}))
				return err
			},
		},
		apiv1connect.IPPoolServiceDeleteProcedure: {
			func() error {
				_, err := evil.IPPools.Delete(ctx, connect.NewRequest(&apiv1.DeleteIPPoolRequest{Tenant: "acme", IpPool: "lan"}))
				return err
			},
			func() error {
				_, err := evil.IPPools.Delete(ctx, connect.NewRequest(&apiv1.DeleteIPPoolRequest{Tenant: "other", IpPool: ipPoolID}))
				return err
			},
		},
		apiv1connect.InstanceServiceCreateProcedure: {func() error {
			_, err := evil.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "evil", Flavor: "small",
				Image: "debian-12", IpPool: "lan"}))
			return err
		}},
		apiv1connect.InstanceServiceGetProcedure: {
			func() error {
				_, err := evil.Instances.Get(ctx, connect.NewRequest(&apiv1.GetInstanceRequest{Tenant: "acme", Instance: "vm1"}))
				return err
			},
			func() error {
				_, err := evil.Instances.Get(ctx, connect.NewRequest(&apiv1.GetInstanceRequest{Tenant: "other", Instance: inst.ID}))
				return err
			},
		},
		apiv1connect.InstanceServiceListProcedure: {func() error {
			_, err := evil.Instances.List(ctx, connect.NewRequest(&apiv1.ListInstancesRequest{Tenant: "acme"}))
			return err
		}},
		apiv1connect.InstanceServiceWatchProcedure: {
			func() error { return sfWatchInstances(ctx, evil, &apiv1.WatchInstancesRequest{Tenant: "acme"}) },
			func() error {
				return sfWatchInstances(ctx, evil, &apiv1.WatchInstancesRequest{Tenant: "other", Instance: inst.ID})
			},
		},
		apiv1connect.InstanceServiceStartProcedure: {
			func() error {
				_, err := evil.Instances.Start(ctx, connect.NewRequest(&apiv1.StartInstanceRequest{Tenant: "acme", Instance: "vm1"}))
				return err
			},
			func() error {
				_, err := evil.Instances.Start(ctx, connect.NewRequest(&apiv1.StartInstanceRequest{Tenant: "other", Instance: inst.ID}))
				return err
			},
		},
		apiv1connect.InstanceServiceStopProcedure: {
			func() error {
				_, err := evil.Instances.Stop(ctx, connect.NewRequest(&apiv1.StopInstanceRequest{Tenant: "acme", Instance: "vm1"}))
				return err
			},
			func() error {
				_, err := evil.Instances.Stop(ctx, connect.NewRequest(&apiv1.StopInstanceRequest{Tenant: "other", Instance: inst.ID}))
				return err
			},
		},
		apiv1connect.InstanceServiceSshProcedure: {
			func() error {
				_, err := evil.Instances.Ssh(ctx, connect.NewRequest(&apiv1.SshInstanceRequest{Tenant: "acme", Instance: "vm1", PublicKey: evilSSHKey}))
				return err
			},
			func() error {
				_, err := evil.Instances.Ssh(ctx, connect.NewRequest(&apiv1.SshInstanceRequest{Tenant: "other", Instance: inst.ID, PublicKey: evilSSHKey}))
				return err
			},
		},
		apiv1connect.InstanceServiceRebootProcedure: {
			func() error {
				_, err := evil.Instances.Reboot(ctx, connect.NewRequest(&apiv1.RebootInstanceRequest{Tenant: "acme", Instance: "vm1"}))
				return err
			},
			func() error {
				_, err := evil.Instances.Reboot(ctx, connect.NewRequest(&apiv1.RebootInstanceRequest{Tenant: "other", Instance: inst.ID}))
				return err
			},
		},
		apiv1connect.InstanceServiceDeleteProcedure: {
			func() error {
				_, err := evil.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: "vm1"}))
				return err
			},
			func() error {
				_, err := evil.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "other", Instance: inst.ID}))
				return err
			},
		},
		apiv1connect.VolumeServiceCreateProcedure: {
			func() error {
				_, err := evil.Volumes.Create(ctx, connect.NewRequest(&apiv1.CreateVolumeRequest{Tenant: "acme", Name: "evil", SizeGib: 1, Instance: "vm1"}))
				return err
			},
			func() error {
				_, err := evil.Volumes.Create(ctx, connect.NewRequest(&apiv1.CreateVolumeRequest{Tenant: "other", Name: "evil", SizeGib: 1, Instance: inst.ID}))
				return err
			},
		},
		apiv1connect.VolumeServiceListProcedure: {func() error {
			_, err := evil.Volumes.List(ctx, connect.NewRequest(&apiv1.ListVolumesRequest{Tenant: "acme"}))
			return err
		}},
		apiv1connect.VolumeServiceGetProcedure: {
			func() error {
				_, err := evil.Volumes.Get(ctx, connect.NewRequest(&apiv1.GetVolumeRequest{Tenant: "acme", Volume: "data"}))
				return err
			},
			func() error {
				_, err := evil.Volumes.Get(ctx, connect.NewRequest(&apiv1.GetVolumeRequest{Tenant: "other", Volume: vol.ID}))
				return err
			},
		},
		apiv1connect.VolumeServiceAttachProcedure: {
			func() error {
				_, err := evil.Volumes.Attach(ctx, connect.NewRequest(&apiv1.AttachVolumeRequest{Tenant: "acme", Volume: "data", Instance: "vm1"}))
				return err
			},
			func() error {
				_, err := evil.Volumes.Attach(ctx, connect.NewRequest(&apiv1.AttachVolumeRequest{Tenant: "other", Volume: vol.ID, Instance: inst.ID}))
				return err
			},
		},
		apiv1connect.VolumeServiceDetachProcedure: {
			func() error {
				_, err := evil.Volumes.Detach(ctx, connect.NewRequest(&apiv1.DetachVolumeRequest{Tenant: "acme", Volume: "data"}))
				return err
			},
			func() error {
				_, err := evil.Volumes.Detach(ctx, connect.NewRequest(&apiv1.DetachVolumeRequest{Tenant: "other", Volume: vol.ID}))
				return err
			},
		},
		apiv1connect.VolumeServiceDeleteProcedure: {
			func() error {
				_, err := evil.Volumes.Delete(ctx, connect.NewRequest(&apiv1.DeleteVolumeRequest{Tenant: "acme", Volume: "data"}))
				return err
			},
			func() error {
				_, err := evil.Volumes.Delete(ctx, connect.NewRequest(&apiv1.DeleteVolumeRequest{Tenant: "other", Volume: vol.ID}))
				return err
			},
		},
		apiv1connect.MachineServiceRescueProcedure: {
			func() error {
				_, err := evil.Machines.Rescue(ctx, connect.NewRequest(&apiv1.RescueMachineRequest{Tenant: "acme", Machine: "m1", SshPublicKey: sfSSHKey}))
				return err
			},
			func() error {
				_, err := evil.Machines.Rescue(ctx, connect.NewRequest(&apiv1.RescueMachineRequest{Tenant: "other", Machine: machineID, SshPublicKey: sfSSHKey}))
				return err
			},
		},
		apiv1connect.MachineServicePowerProcedure: {
			func() error {
				_, err := evil.Machines.Power(ctx, connect.NewRequest(&apiv1.PowerMachineRequest{Tenant: "acme", Machine: "m1", Action: "off"}))
				return err
			},
			func() error {
				_, err := evil.Machines.Power(ctx, connect.NewRequest(&apiv1.PowerMachineRequest{Tenant: "other", Machine: machineID, Action: "off"}))
				return err
			},
		},
		apiv1connect.MachineServiceRotateBMCPasswordProcedure: {
			func() error {
				_, err := evil.Machines.RotateBMCPassword(ctx, connect.NewRequest(&apiv1.RotateBMCPasswordRequest{Tenant: "acme", Machine: "m1"}))
				return err
			},
			func() error {
				_, err := evil.Machines.RotateBMCPassword(ctx, connect.NewRequest(&apiv1.RotateBMCPasswordRequest{Tenant: "other", Machine: machineID}))
				return err
			},
		},
		apiv1connect.MachineServiceGetPowerStatusProcedure: {
			func() error {
				_, err := evil.Machines.GetPowerStatus(ctx, connect.NewRequest(&apiv1.GetMachinePowerStatusRequest{Tenant: "acme", Machine: "m1"}))
				return err
			},
			func() error {
				_, err := evil.Machines.GetPowerStatus(ctx, connect.NewRequest(&apiv1.GetMachinePowerStatusRequest{Tenant: "other", Machine: machineID}))
				return err
			},
		},
		apiv1connect.MachineServiceAbortProcedure: {
			func() error {
				_, err := evil.Machines.Abort(ctx, connect.NewRequest(&apiv1.AbortMachineRequest{Tenant: "acme", Machine: "m1"}))
				return err
			},
			func() error {
				_, err := evil.Machines.Abort(ctx, connect.NewRequest(&apiv1.AbortMachineRequest{Tenant: "other", Machine: machineID}))
				return err
			},
		},
		apiv1connect.MachineServiceListWorkflowsProcedure: {
			func() error {
				_, err := evil.Machines.ListWorkflows(ctx, connect.NewRequest(&apiv1.ListMachineWorkflowsRequest{Tenant: "acme"}))
				return err
			},
			func() error {
				_, err := evil.Machines.ListWorkflows(ctx, connect.NewRequest(&apiv1.ListMachineWorkflowsRequest{Tenant: "other", Machine: machineID}))
				return err
			},
		},
		apiv1connect.MachineServiceGetWorkflowProcedure: {
			func() error {
				_, err := evil.Machines.GetWorkflow(ctx, connect.NewRequest(&apiv1.GetMachineWorkflowRequest{Tenant: "acme", Workflow: sfWorkflowID}))
				return err
			},
			func() error {
				_, err := evil.Machines.GetWorkflow(ctx, connect.NewRequest(&apiv1.GetMachineWorkflowRequest{Tenant: "other", Workflow: sfWorkflowID}))
				return err
			},
		},
		apiv1connect.MachineServicePauseWorkflowProcedure: {
			func() error {
				_, err := evil.Machines.PauseWorkflow(ctx, connect.NewRequest(&apiv1.PauseMachineWorkflowRequest{Tenant: "acme", Workflow: sfWorkflowID}))
				return err
			},
			func() error {
				_, err := evil.Machines.PauseWorkflow(ctx, connect.NewRequest(&apiv1.PauseMachineWorkflowRequest{Tenant: "other", Workflow: sfWorkflowID}))
				return err
			},
		},
		apiv1connect.MachineServiceResumeWorkflowProcedure: {
			func() error {
				_, err := evil.Machines.ResumeWorkflow(ctx, connect.NewRequest(&apiv1.ResumeMachineWorkflowRequest{Tenant: "acme", Workflow: sfWorkflowID}))
				return err
			},
			func() error {
				_, err := evil.Machines.ResumeWorkflow(ctx, connect.NewRequest(&apiv1.ResumeMachineWorkflowRequest{Tenant: "other", Workflow: sfWorkflowID}))
				return err
			},
		},
		apiv1connect.MachineServiceRetryWorkflowProcedure: {
			func() error {
				_, err := evil.Machines.RetryWorkflow(ctx, connect.NewRequest(&apiv1.RetryMachineWorkflowRequest{Tenant: "acme", Workflow: sfWorkflowID, FromStep: "power-on"}))
				return err
			},
			func() error {
				_, err := evil.Machines.RetryWorkflow(ctx, connect.NewRequest(&apiv1.RetryMachineWorkflowRequest{Tenant: "other", Workflow: sfWorkflowID, FromStep: "power-on"}))
				return err
			},
		},
		apiv1connect.MachineServiceAbortWorkflowProcedure: {
			func() error {
				_, err := evil.Machines.AbortWorkflow(ctx, connect.NewRequest(&apiv1.AbortMachineWorkflowRequest{Tenant: "acme", Workflow: sfWorkflowID}))
				return err
			},
			func() error {
				_, err := evil.Machines.AbortWorkflow(ctx, connect.NewRequest(&apiv1.AbortMachineWorkflowRequest{Tenant: "other", Workflow: sfWorkflowID}))
				return err
			},
		},
		apiv1connect.MachineServiceLeaseProcedure: {
			func() error {
				_, err := evil.Machines.Lease(ctx, connect.NewRequest(&apiv1.LeaseMachineRequest{Tenant: "acme", Machine: "m1", Lessee: "other"}))
				return err
			},
			func() error {
				_, err := evil.Machines.Lease(ctx, connect.NewRequest(&apiv1.LeaseMachineRequest{Tenant: "other", Machine: machineID, Lessee: "other"}))
				return err
			},
		},
		apiv1connect.MachineServiceAcceptLeaseProcedure: {
			func() error {
				_, err := evil.Machines.AcceptLease(ctx, connect.NewRequest(&apiv1.AcceptMachineLeaseRequest{Tenant: "acme", Lease: sfLeaseID,
					Image: "img", SshKey: sfSSHKey}))
				return err
			},
			func() error {
				_, err := evil.Machines.AcceptLease(ctx, connect.NewRequest(&apiv1.AcceptMachineLeaseRequest{Tenant: "other", Lease: sfLeaseID,
					Image: "img", SshKey: sfSSHKey}))
				return err
			},
		},
		apiv1connect.MachineServiceReleaseLeaseProcedure: {
			func() error {
				_, err := evil.Machines.ReleaseLease(ctx, connect.NewRequest(&apiv1.ReleaseMachineLeaseRequest{Tenant: "acme", Lease: sfLeaseID}))
				return err
			},
			func() error {
				_, err := evil.Machines.ReleaseLease(ctx, connect.NewRequest(&apiv1.ReleaseMachineLeaseRequest{Tenant: "other", Lease: sfLeaseID}))
				return err
			},
		},
		apiv1connect.MachineServiceGetLeaseProcedure: {
			func() error {
				_, err := evil.Machines.GetLease(ctx, connect.NewRequest(&apiv1.GetMachineLeaseRequest{Tenant: "acme", Lease: sfLeaseID}))
				return err
			},
			func() error {
				_, err := evil.Machines.GetLease(ctx, connect.NewRequest(&apiv1.GetMachineLeaseRequest{Tenant: "other", Lease: sfLeaseID}))
				return err
			},
		},
	}

	open := map[string]bool{apiv1connect.AuditServiceGetCheckpointProcedure: true, apiv1connect.AuditServiceGetLogKeyProcedure: true,
		apiv1connect.AuditServiceProveConsistencyProcedure: true, apiv1connect.ProviderAccountServiceListTypesProcedure: true,
		apiv1connect.ReleaseServiceListProcedure: true}
	for _, m := range envelope.Catalog() {
		t.Run(m.Procedure, func(t *testing.T) {
			calls, ok := cases[m.Procedure]
			require.True(t, ok, "catalog row %s has no cross-tenant case: add one", m.Procedure)
			if open[m.Procedure] {
				for i, call := range calls {
					before := sfCounts(t, cp)
					require.NoError(t, call(), "case %d", i)
					sfRequireDelta(t, before, sfCounts(t, cp), nil, "case %d", i)
				}
				return
			}
			if m.Kind == envelope.KindSelf {
				require.Empty(t, calls)
				who, err := evil.Identity.WhoAmI(ctx, connect.NewRequest(&apiv1.WhoAmIRequest{}))
				require.NoError(t, err)
				require.Equal(t, "other", who.Msg.GetTenantName())
				return
			}
			require.NotEmpty(t, calls)
			for i, call := range calls {
				before := sfCounts(t, cp)
				err := call()
				require.Error(t, err, "case %d must fail", i)
				require.Contains(t, []string{"PERMISSION_DENIED", "NOT_FOUND"}, client.Code(err), "case %d: %v", i, err)
				after := sfCounts(t, cp)
				delta := map[string]int{}
				if m.Kind == envelope.KindMutation && client.Code(err) == "PERMISSION_DENIED" {
					delta["audit_log"] = 1
				}
				sfRequireDelta(t, before, after, delta, "case %d", i)
			}
		})
	}
	require.Len(t, cases, len(envelope.Catalog()), "a case for a procedure the catalog does not have")

	// acme is intact.
	_, err = admin.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "acme", Project: "web"}))
	require.NoError(t, err)
	pol, err := admin.Policies.Get(ctx, connect.NewRequest(&apiv1.GetPolicyRequest{Tenant: "acme", Id: "extra"}))
	require.NoError(t, err)
	require.Equal(t, sfHarmlessPolicy, pol.Msg.GetPolicy().GetText())
	cfms, err := admin.Confirmations.List(ctx, connect.NewRequest(&apiv1.ListConfirmationsRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, cfms.Msg.GetConfirmations(), 1)
	require.Equal(t, envelope.ConfirmationPending, cfms.Msg.GetConfirmations()[0].GetState())
	n, err := admin.Nodes.Get(ctx, connect.NewRequest(&apiv1.GetNodeRequest{Node: node.ID}))
	require.NoError(t, err)
	require.Equal(t, fleet.NodeActive, n.Msg.GetNode().GetState())
	c, err := admin.Commands.Get(ctx, connect.NewRequest(&apiv1.GetCommandRequest{Id: cmdID}))
	require.NoError(t, err)
	require.Equal(t, fleet.CommandPending, c.Msg.GetCommand().GetState())
	jts, err := admin.JoinTokens.List(ctx, connect.NewRequest(&apiv1.ListJoinTokensRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, jts.Msg.GetJoinTokens(), 1, "the token is still active")
	jrs, err := admin.JoinRequests.List(ctx, connect.NewRequest(&apiv1.ListJoinRequestsRequest{Tenant: "acme", State: fleet.JoinRequestPending}))
	require.NoError(t, err)
	require.Len(t, jrs.Msg.GetJoinRequests(), 1)
	pg, err := admin.Pools.Get(ctx, connect.NewRequest(&apiv1.GetPoolRequest{Tenant: "acme", Pool: poolID}))
	require.NoError(t, err)
	require.Equal(t, "active", pg.Msg.GetPool().GetState())
	require.False(t, pg.Msg.GetPool().GetPolicy().GetSingleTenant())
	rsv, err := admin.Reservations.Get(ctx, connect.NewRequest(&apiv1.GetReservationRequest{Tenant: "acme", Reservation: rsvID}))
	require.NoError(t, err)
	require.Equal(t, "pending", rsv.Msg.GetReservation().GetState(), "acme's reservation is untouched")
	require.Equal(t, now.Add(time.Hour).UTC().Truncate(time.Microsecond), rsv.Msg.GetReservation().GetEndTime().AsTime())
	gotWh, err := admin.Webhooks.Get(ctx, connect.NewRequest(&apiv1.GetWebhookRequest{Tenant: "acme", Webhook: whID}))
	require.NoError(t, err)
	require.Equal(t, "http://127.0.0.1:9/acme", gotWh.Msg.GetWebhook().GetUrl(), "acme's webhook is untouched")
	require.Nil(t, gotWh.Msg.GetWebhook().GetPreviousSecretExpireTime(), "its secret was not rotated")
	require.NoError(t, cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		got, err := quota.Get(ctx, tx, acme.GetId(), quo.ID)
		require.NoError(t, err)
		require.Equal(t, 4, got.GPUs, "acme's quota is untouched")
		return nil
	}))
	img, err := admin.Images.Get(ctx, connect.NewRequest(&apiv1.GetImageRequest{Tenant: "acme", Image: imgID}))
	require.NoError(t, err)
	require.Empty(t, img.Msg.GetImage().GetSignatures(), "acme's image is untouched")
	require.Equal(t, "private", img.Msg.GetImage().GetVisibility())
	keys, err := admin.SignerKeys.List(ctx, connect.NewRequest(&apiv1.ListSignerKeysRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, keys.Msg.GetSignerKeys(), 1)
	gotSite, err := admin.Sites.Get(ctx, connect.NewRequest(&apiv1.GetSiteRequest{Tenant: "acme", Site: siteID}))
	require.NoError(t, err)
	require.Equal(t, []string{"127.0.0.0/8"}, gotSite.Msg.GetSite().GetNetworks(), "acme's site is untouched")
	gotM, err := admin.Machines.Get(ctx, connect.NewRequest(&apiv1.GetMachineRequest{Tenant: "acme", Machine: machineID}))
	require.NoError(t, err)
	require.Equal(t, "enrolled", gotM.Msg.GetMachine().GetState(), "acme's machine is untouched")
	require.Empty(t, gotM.Msg.GetMachine().GetWorkflowId())
	_, err = admin.Flavors.Get(ctx, connect.NewRequest(&apiv1.GetFlavorRequest{Tenant: "acme", Flavor: flavorID}))
	require.NoError(t, err, "acme's flavor is untouched")
	_, err = admin.IPPools.Get(ctx, connect.NewRequest(&apiv1.GetIPPoolRequest{Tenant: "acme", IpPool: ipPoolID}))
	require.NoError(t, err, "acme's ip pool is untouched")
	gotSec, err := admin.Secrets.Get(ctx, connect.NewRequest(&apiv1.GetSecretRequest{Tenant: "acme", Secret: secretID}))
	require.NoError(t, err)
	require.EqualValues(t, 1, gotSec.Msg.GetSecret().GetVersion(), "acme's secret is untouched")
}

// sfSSHKey is a well-formed OpenSSH public key line.
const sfSSHKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl ops@example"

// evilSSHKey is the cross-tenant cases' SSH public key.
const evilSSHKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGqL6xRVEXhP4Se+YuNJyr0Z5mDN3j0pHHs2cEXbQu5h evil@bc"

// sfProfileDoc is a small valid deploy profile document.
func sfProfileDoc(name string) string {
	return "apiVersion: bettercompute.io/v1\nkind: DeployProfile\nmetadata: {name: " + name + "}\n" +
		"spec:\n  steps:\n    - {name: cycle, kind: power.cycle, destructive: true}\n"
}
