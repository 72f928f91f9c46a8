package secrets_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/secrets"
	"github.com/better-compute/better-compute/internal/store"
)

type fixture struct {
	cp     *bctest.ControlPlane
	admin  *client.Client
	acme   *client.Client // acme's admin
	member *client.Client // acme's member
	globex *client.Client // another tenant's admin
	sealer *pki.Sealer
	acmeID string
}

func setup(t *testing.T) *fixture {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	f := &fixture{cp: cp, admin: cp.Admin()}
	ctx := context.Background()
	key := func(tenant, role string) *client.Client {
		k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: tenant, Role: role}))
		require.NoError(t, err)
		return cp.Client(k.Msg.GetSecret())
	}
	for _, n := range []string{"acme", "globex"} {
		res, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: n}))
		require.NoError(t, err)
		if n == "acme" {
			f.acmeID = res.Msg.GetTenant().GetId()
		}
	}
	f.acme, f.member, f.globex = key("acme", "admin"), key("acme", "member"), key("globex", "admin")
	var err error
	f.sealer, err = pki.NewSealer(cp.Secret)
	require.NoError(t, err)
	return f
}

func (f *fixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, query, args...).Scan(&n)
	}))
	return n
}

func (f *fixture) open(t *testing.T, tenantID, ref string) (secrets.Value, error) {
	t.Helper()
	var v secrets.Value
	err := f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		v, err = secrets.Open(ctx, tx, f.sealer, tenantID, ref)
		return err
	})
	return v, err
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

// TestSecretLifecycle: put makes version 1, a second put version 2; reads
// show metadata only; the value is sealed at rest, appears in no response,
// event or audit row, and opens (latest version) only in-process.
func TestSecretLifecycle(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	const v1, v2 = "hunter2-first-value", "correct-horse-battery-staple"
	put, err := f.acme.Secrets.Put(ctx, connect.NewRequest(&apiv1.PutSecretRequest{Name: "db-password", Value: []byte(v1),
		Description: "the app's database"}))
	require.NoError(t, err)
	s := put.Msg.GetSecret()
	require.EqualValues(t, 1, s.GetVersion())
	require.EqualValues(t, len(v1), s.GetSizeBytes())
	require.Equal(t, "secret://db-password", s.GetRef())
	require.Equal(t, f.acmeID, s.GetTenantId())

	put2, err := f.acme.Secrets.Put(ctx, connect.NewRequest(&apiv1.PutSecretRequest{Name: "db-password", Value: []byte(v2)}))
	require.NoError(t, err)
	require.Equal(t, s.GetId(), put2.Msg.GetSecret().GetId(), "a put of the same name is a new version of one secret")
	require.EqualValues(t, 2, put2.Msg.GetSecret().GetVersion())

	// The member reads metadata, by name and by id.
	got, err := f.member.Secrets.Get(ctx, connect.NewRequest(&apiv1.GetSecretRequest{Secret: s.GetId()}))
	require.NoError(t, err)
	require.Equal(t, "db-password", got.Msg.GetSecret().GetName())
	list, err := f.member.Secrets.List(ctx, connect.NewRequest(&apiv1.ListSecretsRequest{}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetSecrets(), 1)
	for _, b := range [][]byte{mustJSON(t, put.Msg), mustJSON(t, put2.Msg), mustJSON(t, got.Msg), mustJSON(t, list.Msg)} {
		require.NotContains(t, string(b), v1)
		require.NotContains(t, string(b), v2)
	}
	for _, v := range []string{v1, v2} {
		require.Zero(t, f.count(t, `SELECT COUNT(*) FROM events WHERE CAST(data AS TEXT) LIKE $1`, "%"+v+"%"))
		require.Zero(t, f.count(t, `SELECT COUNT(*) FROM audit_log WHERE detail LIKE $1`, "%"+v+"%"))
	}
	require.Equal(t, 2, f.count(t, `SELECT COUNT(*) FROM events WHERE resource_id = $1 AND type = 'secret.put'`, s.GetId()))

	// Sealed at rest; opened in-process, the latest version.
	var raw []byte
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT value FROM secrets WHERE id = $1`, s.GetId()).Scan(&raw)
	}))
	require.False(t, bytes.Contains(raw, []byte(v2)), "the value is sealed at rest")
	v, err := f.open(t, f.acmeID, "secret://db-password")
	require.NoError(t, err)
	require.Equal(t, v2, string(v.Bytes))
	require.EqualValues(t, 2, v.Version)

	_, err = f.acme.Secrets.Delete(ctx, connect.NewRequest(&apiv1.DeleteSecretRequest{Secret: "db-password"}))
	require.NoError(t, err)
	_, err = f.open(t, f.acmeID, "secret://db-password")
	require.ErrorIs(t, err, secrets.ErrNotFound)
	_, err = f.acme.Secrets.Get(ctx, connect.NewRequest(&apiv1.GetSecretRequest{Secret: "db-password"}))
	refused(t, err, "NOT_FOUND", "", `secret "db-password" not found`)
}

func mustJSON(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := protojson.Marshal(m)
	require.NoError(t, err)
	return b
}

// TestSecretIsolation: another tenant neither reads nor opens acme's
// secret; a platform secret never opens for a workload; a member cannot put
// or delete; a sealed value moved onto another secret's row does not open.
func TestSecretIsolation(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	_, err := f.acme.Secrets.Put(ctx, connect.NewRequest(&apiv1.PutSecretRequest{Name: "token", Value: []byte("acme-only")}))
	require.NoError(t, err)
	_, err = f.globex.Secrets.Get(ctx, connect.NewRequest(&apiv1.GetSecretRequest{Tenant: "acme", Secret: "token"}))
	refused(t, err, "PERMISSION_DENIED", "", "")
	_, err = f.globex.Secrets.Get(ctx, connect.NewRequest(&apiv1.GetSecretRequest{Secret: "token"}))
	refused(t, err, "NOT_FOUND", "", `secret "token" not found`)
	_, err = f.globex.Secrets.Put(ctx, connect.NewRequest(&apiv1.PutSecretRequest{Tenant: "acme", Name: "token", Value: []byte("overwrite")}))
	refused(t, err, "PERMISSION_DENIED", "", "")

	_, err = f.member.Secrets.Put(ctx, connect.NewRequest(&apiv1.PutSecretRequest{Name: "mine", Value: []byte("x")}))
	refused(t, err, "PERMISSION_DENIED", "", "")
	_, err = f.member.Secrets.Delete(ctx, connect.NewRequest(&apiv1.DeleteSecretRequest{Secret: "token"}))
	refused(t, err, "PERMISSION_DENIED", "", "")

	// The platform's own secret: the platform admin's scope, never opened
	// for a tenant's workload.
	_, err = f.admin.Secrets.Put(ctx, connect.NewRequest(&apiv1.PutSecretRequest{Name: "fleet-token", Value: []byte("fleet")}))
	require.NoError(t, err)
	_, err = f.open(t, "", "secret://fleet-token")
	require.ErrorIs(t, err, secrets.ErrNotFound)
	_, err = f.open(t, f.acmeID, "secret://fleet-token")
	require.ErrorIs(t, err, secrets.ErrNotFound)
	_, err = f.open(t, f.acmeID, "token")
	require.ErrorContains(t, err, "not a secret://<name> reference")
	v, err := f.open(t, f.acmeID, "secret://token")
	require.NoError(t, err)
	require.Equal(t, "acme-only", string(v.Bytes))

	// A sealed value copied onto another row is bound to its own id.
	_, err = f.acme.Secrets.Put(ctx, connect.NewRequest(&apiv1.PutSecretRequest{Name: "other", Value: []byte("other")}))
	require.NoError(t, err)
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE secrets SET value = (SELECT value FROM secrets WHERE name = 'token' AND tenant_id = $1)
			WHERE name = 'other' AND tenant_id = $1`, f.acmeID)
		return err
	}))
	_, err = f.open(t, f.acmeID, "secret://other")
	require.Error(t, err)
	require.False(t, errors.Is(err, secrets.ErrNotFound))
}

// TestSecretBadInput: each refusal names its field and writes nothing.
func TestSecretBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	rows := func() [2]int {
		return [2]int{f.count(t, `SELECT COUNT(*) FROM secrets`), f.count(t, `SELECT COUNT(*) FROM events`)}
	}
	before := rows()
	for _, c := range []struct {
		req                 *apiv1.PutSecretRequest
		code, field, reason string
	}{
		{&apiv1.PutSecretRequest{Value: []byte("x")}, "INVALID_ARGUMENT", "name", "is required"},
		{&apiv1.PutSecretRequest{Name: "Bad_Name", Value: []byte("x")}, "INVALID_ARGUMENT", "name", "must match"},
		{&apiv1.PutSecretRequest{Name: "empty"}, "INVALID_ARGUMENT", "value", "is required"},
		{&apiv1.PutSecretRequest{Name: "big", Value: bytes.Repeat([]byte("x"), secrets.MaxValueBytes+1)}, "INVALID_ARGUMENT", "value", "at most 65536 bytes"},
		{&apiv1.PutSecretRequest{Name: "long", Value: []byte("x"), Description: strings.Repeat("d", 1025)}, "INVALID_ARGUMENT", "description", "at most"},
		{&apiv1.PutSecretRequest{Tenant: "no-such", Name: "x", Value: []byte("x")}, "NOT_FOUND", "", `tenant "no-such" not found`},
	} {
		_, err := f.admin.Secrets.Put(ctx, connect.NewRequest(c.req))
		refused(t, err, c.code, c.field, c.reason)
	}
	_, err := f.acme.Secrets.Delete(ctx, connect.NewRequest(&apiv1.DeleteSecretRequest{Secret: "missing"}))
	refused(t, err, "NOT_FOUND", "", `secret "missing" not found`)
	_, err = f.acme.Secrets.Get(ctx, connect.NewRequest(&apiv1.GetSecretRequest{Secret: "sec_bad!"}))
	refused(t, err, "INVALID_ARGUMENT", "secret", "")
	require.Equal(t, before, rows())
}

func (f *fixture) openForNode(t *testing.T, tenantID, ref string) (secrets.Value, error) {
	t.Helper()
	var v secrets.Value
	err := f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		v, err = secrets.OpenForNode(ctx, tx, f.sealer, tenantID, ref)
		return err
	})
	return v, err
}

// TestSecretNodeReadable: node_readable is off for a new secret, set and
// kept across puts that do not name it, and OpenForNode opens only the
// tenant's own secret marked so; a platform secret refuses the mark.
func TestSecretNodeReadable(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	yes, no := true, false
	put := func(name, value string, nodeReadable *bool) *apiv1.Secret {
		t.Helper()
		res, err := f.acme.Secrets.Put(ctx, connect.NewRequest(&apiv1.PutSecretRequest{Name: name, Value: []byte(value), NodeReadable: nodeReadable}))
		require.NoError(t, err)
		return res.Msg.GetSecret()
	}
	require.False(t, put("plain", "p", nil).GetNodeReadable(), "off unless asked")
	_, err := f.openForNode(t, f.acmeID, "secret://plain")
	require.ErrorIs(t, err, secrets.ErrNotFound, "a secret not marked is not found for nodes")
	_, err = f.openForNode(t, f.acmeID, "secret://missing")
	require.ErrorIs(t, err, secrets.ErrNotFound)

	require.True(t, put("db", "v1", &yes).GetNodeReadable())
	require.True(t, put("db", "v2", nil).GetNodeReadable(), "a put that does not name the grant keeps it")
	v, err := f.openForNode(t, f.acmeID, "secret://db")
	require.NoError(t, err)
	require.Equal(t, "v2", string(v.Bytes))
	require.EqualValues(t, 2, v.Version)
	require.NotEmpty(t, v.ID)

	got, err := f.member.Secrets.Get(ctx, connect.NewRequest(&apiv1.GetSecretRequest{Secret: "db"}))
	require.NoError(t, err)
	require.True(t, got.Msg.GetSecret().GetNodeReadable())

	// Another tenant's node asks by the same name: nothing (its own scope).
	var globexID string
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT id FROM tenants WHERE name = 'globex'`).Scan(&globexID)
	}))
	_, err = f.openForNode(t, globexID, "secret://db")
	require.ErrorIs(t, err, secrets.ErrNotFound)
	_, err = f.openForNode(t, "", "secret://db")
	require.ErrorIs(t, err, secrets.ErrNotFound)

	require.False(t, put("db", "v3", &no).GetNodeReadable(), "withdrawn")
	_, err = f.openForNode(t, f.acmeID, "secret://db")
	require.ErrorIs(t, err, secrets.ErrNotFound)

	// A platform secret is never delivered to nodes.
	before := f.count(t, `SELECT COUNT(*) FROM secrets`)
	_, err = f.admin.Secrets.Put(ctx, connect.NewRequest(&apiv1.PutSecretRequest{Name: "fleet", Value: []byte("x"), NodeReadable: &yes}))
	refused(t, err, "INVALID_ARGUMENT", "node_readable", "never delivered to nodes")
	require.Equal(t, before, f.count(t, `SELECT COUNT(*) FROM secrets`))
}
