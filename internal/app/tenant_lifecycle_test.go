package app_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/authn"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/iam"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/tenancy"
)

func TestTenantSuspend(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	sfTenant(t, admin, "acme")
	sfTenant(t, admin, "other")
	acmeSecret, _ := sfKey(t, admin, "acme", "admin", 0)
	otherSecret, _ := sfKey(t, admin, "other", "admin", 0)
	acme, other := cp.Client(acmeSecret), cp.Client(otherSecret)
	sfProject(t, acme, "acme", "web")

	// Neither the tenant itself nor another tenant suspends a tenant.
	for name, c := range map[string]*client.Client{"acme": acme, "other": other} {
		_, err := c.Tenants.Suspend(ctx, connect.NewRequest(&apiv1.SuspendTenantRequest{Tenant: "acme"}))
		sfRequireCode(t, err, "PERMISSION_DENIED", name)
	}

	res, err := admin.Tenants.Suspend(ctx, connect.NewRequest(&apiv1.SuspendTenantRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Equal(t, "suspended", res.Msg.GetTenant().GetState())

	// Its keys read, but every mutation is refused, naming the suspension;
	// resuming itself is a mutation too.
	got, err := acme.Tenants.Get(ctx, connect.NewRequest(&apiv1.GetTenantRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Equal(t, "suspended", got.Msg.GetTenant().GetState())
	_, err = acme.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "acme", Project: "web"}))
	require.NoError(t, err)
	before := sfCounts(t, cp)
	_, err = acme.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "api"}))
	sfRequireCode(t, err, "TENANT_SUSPENDED")
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.Contains(t, err.Error(), "suspended")
	_, err = acme.Secrets.Put(ctx, connect.NewRequest(&apiv1.PutSecretRequest{Tenant: "acme", Name: "tok", Value: []byte("x")}))
	sfRequireCode(t, err, "TENANT_SUSPENDED")
	_, err = acme.Tenants.Resume(ctx, connect.NewRequest(&apiv1.ResumeTenantRequest{Tenant: "acme"}))
	sfRequireCode(t, err, "TENANT_SUSPENDED")
	sfRequireDelta(t, before, sfCounts(t, cp), nil, "a refused mutation writes nothing")

	// Another tenant is unaffected, and the platform still acts in acme.
	sfProject(t, other, "other", "web")
	sfProject(t, admin, "acme", "ops")

	// A repeated suspend answers the same; resume lets the keys write again.
	_, err = admin.Tenants.Suspend(ctx, connect.NewRequest(&apiv1.SuspendTenantRequest{Tenant: "acme"}))
	require.NoError(t, err)
	res2, err := admin.Tenants.Resume(ctx, connect.NewRequest(&apiv1.ResumeTenantRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Equal(t, "active", res2.Msg.GetTenant().GetState())
	sfProject(t, acme, "acme", "api")

	_, err = admin.Tenants.Suspend(ctx, connect.NewRequest(&apiv1.SuspendTenantRequest{Tenant: "nope"}))
	sfRequireCode(t, err, "NOT_FOUND")
}

// tenantTables lists every table with a tenant_id column, so a table added
// later is covered without touching the test.
func tenantTables(t *testing.T, cp *bctest.ControlPlane) []string {
	t.Helper()
	var out []string
	err := cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		q := `SELECT m.name FROM sqlite_master m, pragma_table_info(m.name) p
			WHERE m.type = 'table' AND p.name = 'tenant_id' ORDER BY m.name`
		if tx.Dialect() == store.Postgres {
			// Base tables only: a view (events_visible) shows rows of one.
			q = `SELECT c.table_name FROM information_schema.columns c
				JOIN information_schema.tables t ON t.table_schema = c.table_schema AND t.table_name = c.table_name
				WHERE c.column_name = 'tenant_id' AND c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
				ORDER BY c.table_name`
		}
		var err error
		out, err = store.Strings(tx.Query(ctx, q))
		return err
	})
	require.NoError(t, err)
	require.Contains(t, out, "api_keys")
	return out
}

// tenantRowCounts counts a tenant's rows in every table that has a
// tenant_id column (and the tenant row itself).
func tenantRowCounts(t *testing.T, cp *bctest.ControlPlane, tenantID string) map[string]int {
	t.Helper()
	out := map[string]int{}
	tables := tenantTables(t, cp)
	err := cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		for _, tbl := range tables {
			var n int
			if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM `+tbl+` WHERE tenant_id = $1`, tenantID).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				out[tbl] = n
			}
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM tenants WHERE id = $1`, tenantID).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			out["tenants"] = n
		}
		return nil
	})
	require.NoError(t, err)
	return out
}

// secondHuman adds a platform administrator who is a person (as OIDC would
// sign one in): a confirmation is approved by someone other than its
// requester.
func secondHuman(t *testing.T, cp *bctest.ControlPlane) *client.Client {
	t.Helper()
	secret, hash, err := authn.NewSecret()
	require.NoError(t, err)
	err = cp.App.DB.Write(context.Background(), func(ctx context.Context, tx store.Tx) error {
		now := cp.Clock.Now()
		return authn.KeyInsert(ctx, tx, authn.ApiKey{ID: envelope.NewID("key", now), Name: "second", Role: string(iam.RolePlatformAdmin),
			Kind: string(iam.KindUser), Prefix: secret[:8], SecretHash: hash, CreatedBy: "test", CreateTime: now})
	})
	require.NoError(t, err)
	return cp.Client(secret)
}

func TestTenantDeleteLeavesNoRow(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	acmeT := sfTenant(t, admin, "acme")
	otherT := sfTenant(t, admin, "other")
	acmeSecret, _ := sfKey(t, admin, "acme", "admin", 0)
	sfKey(t, admin, "acme", "member", 0)
	otherSecret, _ := sfKey(t, admin, "other", "admin", 0)
	acme, other := cp.Client(acmeSecret), cp.Client(otherSecret)
	sfProject(t, acme, "acme", "web")
	sfProject(t, other, "other", "web")
	_, err := acme.Webhooks.Create(ctx, connect.NewRequest(&apiv1.CreateWebhookRequest{Tenant: "acme", Url: "http://127.0.0.1:9/hook",
		// Deliveries fan out from events in the background: a type nothing
		// here emits keeps the row counts still between dry run and delete.
		Types: []string{"instance.deleted"}}))
	require.NoError(t, err)
	_, err = acme.Secrets.Put(ctx, connect.NewRequest(&apiv1.PutSecretRequest{Tenant: "acme", Name: "tok", Value: []byte("x")}))
	require.NoError(t, err)
	gpus := int32(4)
	_, err = acme.Quotas.Set(ctx, connect.NewRequest(&apiv1.SetQuotaRequest{Tenant: "acme", Project: "web", Model: "h100", Gpus: &gpus}))
	require.NoError(t, err)
	// A budget and a profile document of its own go too.
	_, err = acme.Budgets.Set(ctx, connect.NewRequest(&apiv1.SetBudgetRequest{Tenant: "acme", Period: "month", Amount: "100"}))
	require.NoError(t, err)
	_, err = acme.Profiles.Create(ctx, connect.NewRequest(&apiv1.CreateProfileRequest{Tenant: "acme", Document: "apiVersion: bettercompute.io/v1\n" +
		"kind: DeployProfile\nmetadata: {name: mine}\nspec:\n  steps:\n    - {name: off, kind: power.off, destructive: true}\n"}))
	require.NoError(t, err)
	// Bare metal: a site and an enrolled machine.
	f := &matrixFixture{cp: cp, admin: admin, keys: map[string]string{}}
	f.matrixMachine(t, metal.StateReady)
	otherBefore := tenantRowCounts(t, cp, otherT.GetId())

	del := func(c *client.Client, dry bool, cfm string) (*apiv1.DeleteTenantResponse, error) {
		req := connect.NewRequest(&apiv1.DeleteTenantRequest{Tenant: "acme", DryRun: dry})
		if cfm != "" {
			req = sfWithHeader(req.Msg, client.HeaderConfirmationID, cfm)
		}
		res, err := c.Tenants.Delete(ctx, req)
		if err != nil {
			return nil, err
		}
		return res.Msg, nil
	}

	// Only the platform deletes a tenant, and only a suspended one.
	_, err = del(acme, true, "")
	sfRequireCode(t, err, "PERMISSION_DENIED")
	_, err = del(other, true, "")
	sfRequireCode(t, err, "PERMISSION_DENIED")
	_, err = del(admin, true, "")
	sfRequireCode(t, err, "FAILED_PRECONDITION")
	_, err = admin.Tenants.Suspend(ctx, connect.NewRequest(&apiv1.SuspendTenantRequest{Tenant: "acme"}))
	require.NoError(t, err)

	// The dry run changes nothing and lists every row that will go.
	plan, err := del(admin, true, "")
	require.NoError(t, err)
	require.True(t, plan.GetDryRun())
	planned := map[string]int{}
	for _, r := range plan.GetRows() {
		planned[r.GetTable()]++
	}
	after := tenantRowCounts(t, cp, acmeT.GetId())
	audits := after["audit_log"]
	delete(after, "audit_log")
	require.Equal(t, after, planned, "the dry run lists exactly the tenant's rows (but its audit log)")
	for _, tbl := range []string{"api_keys", "webhooks", "secrets", "quotas", "sites", "machines", "projects", "tenants"} {
		require.NotZero(t, planned[tbl], "fixture has %s", tbl)
	}
	require.Equal(t, "tenants", plan.GetRows()[len(plan.GetRows())-1].GetTable(), "the tenant row goes last")
	require.Greater(t, after["events"], 0)

	// Without dry run a human approves the exact request first.
	_, err = del(admin, false, "")
	sfRequireCode(t, err, "CONFIRMATION_REQUIRED")
	cfm := client.Detail(err).GetConfirmationId()
	_, err = secondHuman(t, cp).Confirmations.Approve(ctx, connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: cfm}))
	require.NoError(t, err)
	gone, err := del(admin, false, cfm)
	require.NoError(t, err)
	require.False(t, gone.GetDryRun())
	went := map[string]int{}
	for _, r := range gone.GetRows() {
		went[r.GetTable()]++
	}
	// What went is what the dry run listed, and what the confirmation
	// itself added: its row and its two events (required, approved).
	planned["confirmations"]++
	planned["events"] += 2
	require.Equal(t, planned, went)

	// Nothing of acme is left but its audit rows (the delete's own among
	// them); the other tenant is untouched.
	left := tenantRowCounts(t, cp, acmeT.GetId())
	require.Greater(t, left["audit_log"], audits)
	delete(left, "audit_log")
	require.Empty(t, left)
	require.Equal(t, otherBefore, tenantRowCounts(t, cp, otherT.GetId()))
	_, err = acme.Tenants.Get(ctx, connect.NewRequest(&apiv1.GetTenantRequest{Tenant: "acme"}))
	sfRequireCode(t, err, "UNAUTHENTICATED", "acme's keys went with it")
	_, err = admin.Tenants.Get(ctx, connect.NewRequest(&apiv1.GetTenantRequest{Tenant: "acme"}))
	sfRequireCode(t, err, "NOT_FOUND")
	_, err = other.Projects.Get(ctx, connect.NewRequest(&apiv1.GetProjectRequest{Tenant: "other", Project: "web"}))
	require.NoError(t, err)
}

// TestTenantDeleteCascade deletes a tenant that owns a joined node and its
// pool, a running instance with a volume, a running sandbox, a reservation,
// a provider account and its secret: the delete waits for the live work to end, then leaves no
// row of the tenant but its audit log, and went exactly as its dry run said.
func TestTenantDeleteCascade(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	f := &matrixFixture{cp: cp, admin: admin, keys: map[string]string{}}
	acmeT := sfTenant(t, admin, "acme")
	otherT := sfTenant(t, admin, "other")
	sfProject(t, admin, "acme", "web")
	sfProject(t, admin, "other", "web")
	f.acme = acmeT.GetId()
	f.gpuPool = mxGPUPool(t, cp, admin, "acme", "web")
	f.matrixInstanceCatalog(t)
	vm, err := admin.Instances.Create(ctx, connect.NewRequest(&apiv1.CreateInstanceRequest{Tenant: "acme", Name: "vm",
		Flavor: "mx-tiny", Image: "debian-12", IpPool: "mx-lan", Project: "web", Pool: f.gpuPool}))
	require.NoError(t, err)
	vmID := vm.Msg.GetInstance().GetId()
	instanceIs := func(want string) func() bool {
		return func() bool {
			g, err := admin.Instances.Get(ctx, connect.NewRequest(&apiv1.GetInstanceRequest{Tenant: "acme", Instance: vmID}))
			require.NoError(t, err)
			return g.Msg.GetInstance().GetState() == want
		}
	}
	eventually(t, "instance running", instanceIs("running"))
	_, err = admin.Volumes.Create(ctx, connect.NewRequest(&apiv1.CreateVolumeRequest{Tenant: "acme", Name: "data", SizeGib: 1, Instance: vmID}))
	require.NoError(t, err)
	resID := f.matrixReservation(t)
	sbx, err := admin.Sandboxes.Create(ctx, connect.NewRequest(&apiv1.CreateSandboxRequest{Tenant: "acme", Template: mxSandboxTemplate(t, f)}))
	require.NoError(t, err)
	sbxID := sbx.Msg.GetSandbox().GetId()
	sandboxIs := func(want string) func() bool {
		return func() bool {
			g, err := admin.Sandboxes.Get(ctx, connect.NewRequest(&apiv1.GetSandboxRequest{Tenant: "acme", Sandbox: sbxID}))
			require.NoError(t, err)
			return g.Msg.GetSandbox().GetState() == want
		}
	}
	eventually(t, "sandbox running", sandboxIs("running"))
	_, err = admin.ProviderAccounts.Create(ctx, connect.NewRequest(&apiv1.CreateProviderAccountRequest{Tenant: "acme",
		Name: "hc", Type: "hetzner-cloud", SecretRefs: map[string]string{"token": f.providerSecret(t)}}))
	require.NoError(t, err)
	otherBefore := tenantRowCounts(t, cp, otherT.GetId())

	_, err = admin.Tenants.Suspend(ctx, connect.NewRequest(&apiv1.SuspendTenantRequest{Tenant: "acme"}))
	require.NoError(t, err)
	del := connect.NewRequest(&apiv1.DeleteTenantRequest{Tenant: "acme"})
	_, err = admin.Tenants.Delete(ctx, del)
	sfRequireCode(t, err, "CONFIRMATION_REQUIRED")
	cfm := client.Detail(err).GetConfirmationId()
	_, err = secondHuman(t, cp).Confirmations.Approve(ctx, connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: cfm}))
	require.NoError(t, err)

	// Live work stands in the way, named; nothing is deleted, and the
	// confirmation stays usable.
	before := tenantRowCounts(t, cp, acmeT.GetId())
	_, err = admin.Tenants.Delete(ctx, sfWithHeader(del.Msg, client.HeaderConfirmationID, cfm))
	sfRequireCode(t, err, "FAILED_PRECONDITION")
	require.Contains(t, err.Error(), resID)
	require.Equal(t, before, tenantRowCounts(t, cp, acmeT.GetId()))
	dry, err := admin.Tenants.Delete(ctx, connect.NewRequest(&apiv1.DeleteTenantRequest{Tenant: "acme", DryRun: true}))
	require.NoError(t, err)
	require.Contains(t, dry.Msg.GetBlocking(), "reservations "+resID, "a dry run names the live work too")

	// The platform ends it (a suspended tenant's own keys could not).
	_, err = admin.Instances.Delete(ctx, connect.NewRequest(&apiv1.DeleteInstanceRequest{Tenant: "acme", Instance: vmID}))
	require.NoError(t, err)
	eventually(t, "instance deleted", instanceIs("deleted"))
	_, err = admin.Sandboxes.Delete(ctx, connect.NewRequest(&apiv1.DeleteSandboxRequest{Tenant: "acme", Sandbox: sbxID}))
	require.NoError(t, err)
	eventually(t, "sandbox deleted", sandboxIs("deleted"))
	_, err = admin.Reservations.Cancel(ctx, connect.NewRequest(&apiv1.CancelReservationRequest{Tenant: "acme", Reservation: resID}))
	require.NoError(t, err)

	// The dry run names what the delete still waits for: the released
	// bookings of the instance and the sandbox end on their hosts' word.
	var plan *connect.Response[apiv1.DeleteTenantResponse]
	eventually(t, "no live work", func() bool {
		plan, err = admin.Tenants.Delete(ctx, connect.NewRequest(&apiv1.DeleteTenantRequest{Tenant: "acme", DryRun: true}))
		require.NoError(t, err)
		return len(plan.Msg.GetBlocking()) == 0
	})
	planned := map[string]int{}
	for _, r := range plan.Msg.GetRows() {
		planned[r.GetTable()]++
	}
	for _, tbl := range []string{"reservations", "instances", "volumes", "sandboxes", "sandbox_templates", "nodes", "pools", "join_tokens",
		"secrets", "provider_accounts", "flavors", "ip_pools"} {
		require.NotZero(t, planned[tbl], "the fixture has %s", tbl)
	}
	gone, err := admin.Tenants.Delete(ctx, sfWithHeader(del.Msg, client.HeaderConfirmationID, cfm))
	require.NoError(t, err)
	went := map[string]int{}
	for _, r := range gone.Msg.GetRows() {
		went[r.GetTable()]++
	}
	// Events keep arriving from the node in the background (the sim still
	// reports); every other table went exactly as planned.
	delete(planned, "events")
	delete(went, "events")
	require.Equal(t, planned, went)
	left := tenantRowCounts(t, cp, acmeT.GetId())
	delete(left, "audit_log")
	require.Empty(t, left, "nothing of acme is left but its audit log")
	require.Equal(t, otherBefore, tenantRowCounts(t, cp, otherT.GetId()))

	// What hangs off its nodes and pools without a tenant_id went too.
	for _, r := range plan.Msg.GetRows() {
		switch r.GetTable() {
		case "nodes":
			for _, tbl := range []string{"atoms", "host_resources", "gpus"} {
				require.Zero(t, countRows(t, cp, `SELECT COUNT(*) FROM `+tbl+` WHERE node_id = '`+r.GetId()+`'`), "%s of node %s", tbl, r.GetId())
			}
		case "pools":
			for _, tbl := range []string{"pool_versions", "capacity_deltas", "placer_owners"} {
				require.Zero(t, countRows(t, cp, `SELECT COUNT(*) FROM `+tbl+` WHERE pool_id = '`+r.GetId()+`'`), "%s of pool %s", tbl, r.GetId())
			}
		}
	}
	require.NotZero(t, planned["atoms"], "the node's GPUs were booked as atoms")
}

// TestTenantDeleteInterrupted: a delete that dies midway (here a cleaner
// that removed its rows, then failed, as a crash before the commit would)
// leaves the tenant whole, and the same confirmed request run again
// finishes the job.
func TestTenantDeleteInterrupted(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	admin := cp.Admin()
	acmeT := sfTenant(t, admin, "acme")
	sfKey(t, admin, "acme", "admin", 0)
	_, err := admin.Secrets.Put(ctx, connect.NewRequest(&apiv1.PutSecretRequest{Tenant: "acme", Name: "tok", Value: []byte("x")}))
	require.NoError(t, err)
	_, err = admin.Tenants.Suspend(ctx, connect.NewRequest(&apiv1.SuspendTenantRequest{Tenant: "acme"}))
	require.NoError(t, err)

	// A second TenantService on the same envelope whose cascade dies right
	// after the secrets went.
	cleaners := app.TenantCleaners(cp.App.Sandboxes)
	for i, c := range cleaners {
		if c.Name == "secrets" {
			del := c.Delete
			cleaners[i].Delete = func(ctx context.Context, tx store.Tx, tenantID string) error {
				if err := del(ctx, tx, tenantID); err != nil {
					return err
				}
				return errors.New("killed midway")
			}
		}
	}
	svc := tenancy.NewTenantService(cp.App.Envelope)
	svc.SetCleaners(cleaners)
	mux := http.NewServeMux()
	mux.Handle(apiv1connect.NewTenantServiceHandler(svc, connect.WithInterceptors(envelope.NewInterceptor(cp.App.Envelope, cp.App.Authn, nil))))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	dying := apiv1connect.NewTenantServiceClient(srv.Client(), srv.URL)
	auth := func(req *connect.Request[apiv1.DeleteTenantRequest], cfm string) *connect.Request[apiv1.DeleteTenantRequest] {
		req.Header().Set("Authorization", "Bearer "+cp.AdminKey)
		if cfm != "" {
			req.Header().Set(client.HeaderConfirmationID, cfm)
		}
		return req
	}

	_, err = dying.Delete(ctx, auth(connect.NewRequest(&apiv1.DeleteTenantRequest{Tenant: "acme"}), ""))
	sfRequireCode(t, err, "CONFIRMATION_REQUIRED")
	cfm := client.Detail(err).GetConfirmationId()
	_, err = secondHuman(t, cp).Confirmations.Approve(ctx, connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: "acme", Id: cfm}))
	require.NoError(t, err)

	before := tenantRowCounts(t, cp, acmeT.GetId())
	_, err = dying.Delete(ctx, auth(connect.NewRequest(&apiv1.DeleteTenantRequest{Tenant: "acme"}), cfm))
	sfRequireCode(t, err, "INTERNAL")
	after := tenantRowCounts(t, cp, acmeT.GetId())
	delete(before, "audit_log")
	delete(after, "audit_log")
	require.Equal(t, before, after, "nothing went: the secrets' delete rolled back with the rest")
	require.NotZero(t, after["secrets"])

	// The real service finishes it with the same confirmation.
	_, err = admin.Tenants.Delete(ctx, sfWithHeader(&apiv1.DeleteTenantRequest{Tenant: "acme"}, client.HeaderConfirmationID, cfm))
	require.NoError(t, err)
	left := tenantRowCounts(t, cp, acmeT.GetId())
	delete(left, "audit_log")
	require.Empty(t, left)
}
