package app_test

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/metal"
	"github.com/better-compute/better-compute/internal/pki"
	"github.com/better-compute/better-compute/internal/secrets"
	"github.com/better-compute/better-compute/internal/store"
	"github.com/better-compute/better-compute/internal/vps"
	"github.com/better-compute/better-compute/internal/webhooks"
)

// sealLegacy seals the way releases before the derived key did (raw key
// id, nonce, AES-256-GCM under the raw secret), so a test can plant what
// an upgraded database holds. Only tests ever seal this way.
func sealLegacy(t *testing.T, secret, ref string, plaintext []byte) []byte {
	t.Helper()
	raw, err := base64.StdEncoding.DecodeString(secret)
	require.NoError(t, err)
	block, err := aes.NewCipher(raw)
	require.NoError(t, err)
	aead, err := cipher.NewGCM(block)
	require.NoError(t, err)
	id := sha256.Sum256(raw)
	out := make([]byte, 8+aead.NonceSize())
	copy(out, id[:8])
	_, err = rand.Read(out[8:])
	require.NoError(t, err)
	return aead.Seal(out, out[8:], plaintext, []byte(ref))
}

// TestStartResealsLegacyValues: a start moves every value a module keeps
// sealed under the raw secret (an earlier release's) under the derived
// key — secrets, webhook secrets and previous secrets, BMC passwords, the
// SSH CA's key, instances' user data — each still opening to what it was,
// logs how many, leaves current values byte for byte and a legacy value
// that does not open as it is (with a warning), and a second start
// changes nothing.
func TestStartResealsLegacyValues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clk := bctest.NewSimClock(time.Now())
	storeCfg := bctest.NewStoreConfig(t, clk)
	secret, err := pki.GenerateSecret()
	require.NoError(t, err)
	sealer, err := pki.NewSealer(secret)
	require.NoError(t, err)
	imagesDir := t.TempDir()
	start := func() string {
		t.Helper()
		var logs bytes.Buffer
		a, err := app.NewWithDB(ctx, app.Config{Clock: clk, Secret: secret, ImagesDir: imagesDir,
			GatewayListen: "127.0.0.1:0", ReplicaListen: "127.0.0.1:0",
			Logger: slog.New(slog.NewTextHandler(&logs, nil))}, bctest.OpenDB(t, storeCfg))
		require.NoError(t, err)
		a.Stop()
		return logs.String()
	}
	start() // the tables and the PKI

	// What an earlier release left: every sealed column, legacy; and one
	// value already current, which no start may touch.
	type value struct {
		name, ref, plain string
		read             func(tx store.Tx) []byte
	}
	col := func(query, id string) func(tx store.Tx) []byte {
		return func(tx store.Tx) []byte {
			var b []byte
			require.NoError(t, tx.QueryRow(ctx, query, id).Scan(&b))
			return b
		}
	}
	legacy := func(ref, plain string) []byte { return sealLegacy(t, secret, ref, []byte(plain)) }
	values := []value{
		{"secret", "secret/sec_old", "db password", col(`SELECT value FROM secrets WHERE id = $1`, "sec_old")},
		{"webhook secret", "webhook/whk_1", "whsec_new", col(`SELECT secret FROM webhooks WHERE id = $1`, "whk_1")},
		{"webhook previous secret", "webhook/whk_1", "whsec_old", col(`SELECT previous_secret FROM webhooks WHERE id = $1`, "whk_1")},
		{"BMC password", "machine-bmc/bmccred_1", "bmc password", col(`SELECT bmc_credential FROM machines WHERE id = $1`, "mch_1")},
		{"user data", "instance/ins_1/user_data", "#cloud-config\n", col(`SELECT user_data_sealed FROM instances WHERE id = $1`, "ins_1")},
		{"SSH CA key", "vps/ssh_ca/default", "-----BEGIN OPENSSH PRIVATE KEY-----", func(tx store.Tx) []byte {
			var s string
			require.NoError(t, tx.QueryRow(ctx, `SELECT sealed_key FROM ssh_cas WHERE id = 'default'`).Scan(&s))
			b, err := base64.StdEncoding.DecodeString(s)
			require.NoError(t, err)
			return b
		}},
	}
	cur, err := sealer.Seal("secret/sec_current", []byte("already current"))
	require.NoError(t, err)
	moved := legacy("secret/sec_elsewhere", "moved")
	now := clk.Now()
	db := bctest.OpenDB(t, storeCfg)
	require.NoError(t, db.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		for _, s := range []secrets.Secret{
			{ID: "sec_old", Name: "old", Version: 1, Value: legacy("secret/sec_old", "db password"), SizeBytes: 11, CreateTime: now, UpdateTime: now},
			{ID: "sec_current", Name: "current", Version: 1, Value: cur, SizeBytes: 15, CreateTime: now, UpdateTime: now},
			// Moved from another row: legacy, but it opens nowhere.
			{ID: "sec_moved", Name: "moved", Version: 1, Value: moved, SizeBytes: 5, CreateTime: now, UpdateTime: now},
		} {
			require.NoError(t, secrets.Insert(ctx, tx, &s))
		}
		require.NoError(t, webhooks.WebhookInsert(ctx, tx, &webhooks.Webhook{ID: "whk_1", TenantID: "", URL: "https://hooks.example/x",
			State: webhooks.StateEnabled, Secret: legacy("webhook/whk_1", "whsec_new"), PreviousSecret: legacy("webhook/whk_1", "whsec_old"),
			PreviousExpireTime: &now, CreatedBy: "test", CreateTime: now, UpdateTime: now}))
		require.NoError(t, metal.SiteInsert(ctx, tx, &metal.Site{ID: "site_1", Name: "dc1", Networks: []string{"10.0.0.0/24"},
			DHCPMode: metal.DHCPFull, CreateTime: now, UpdateTime: now}))
		require.NoError(t, metal.MachineInsert(ctx, tx, &metal.Machine{ID: "mch_1", SiteID: "site_1", Name: "m1", BMCDriver: "redfish",
			BMCAddress: "10.0.0.2", BMCHost: "10.0.0.2", BMCUsername: "admin", BMCCredentialRef: "bmccred_1",
			BMCCredential: legacy("machine-bmc/bmccred_1", "bmc password"), MAC: "02:00:00:00:00:01", State: metal.StateEnrolled,
			Inventory: map[string]any{}, EraseRecord: map[string]any{}, CreateTime: now, UpdateTime: now}))
		require.NoError(t, vps.InstanceInsert(ctx, tx, &vps.Instance{ID: "ins_1", TenantID: "ten_1", ProjectID: "prj_1", Name: "i1",
			State: vps.StateRunning, UserDataSealed: legacy("instance/ins_1/user_data", "#cloud-config\n"), CreatedBy: "test",
			CreateTime: now, UpdateTime: now}))
		_, err := tx.Exec(ctx, `INSERT INTO ssh_cas (id, public_key, sealed_key, create_time) VALUES ('default', 'ssh-ed25519 AAAA', $1, $2)`,
			base64.StdEncoding.EncodeToString(legacy("vps/ssh_ca/default", "-----BEGIN OPENSSH PRIVATE KEY-----")), now)
		return err
	}))
	read := func() (got [][]byte, current, unopened []byte) {
		t.Helper()
		require.NoError(t, db.Read(ctx, func(ctx context.Context, tx store.Tx) error {
			for _, v := range values {
				got = append(got, v.read(tx))
			}
			current = col(`SELECT value FROM secrets WHERE id = $1`, "sec_current")(tx)
			unopened = col(`SELECT value FROM secrets WHERE id = $1`, "sec_moved")(tx)
			return nil
		}))
		return got, current, unopened
	}
	before, _, _ := read()
	for i, v := range values {
		require.True(t, sealer.Legacy(before[i]), "planted %s is legacy", v.name)
	}

	logs := start()
	after, gotCurrent, gotMoved := read()
	for i, v := range values {
		require.False(t, sealer.Legacy(after[i]), "%s resealed under the derived key at start", v.name)
		pt, err := sealer.Open(v.ref, after[i])
		require.NoError(t, err, v.name)
		require.Equal(t, v.plain, string(pt), v.name)
	}
	require.Equal(t, cur, gotCurrent, "a current value is left alone")
	require.Equal(t, moved, gotMoved, "a legacy value that does not open is left, and the start goes on")
	require.Contains(t, logs, "sec_moved")
	for _, want := range []string{"module=secrets count=1", "module=webhooks count=2", "module=metal count=1", "module=vps count=2"} {
		require.Contains(t, logs, want)
	}

	logs = start()
	again, gotCurrent, gotMoved := read()
	require.Equal(t, after, again, "a second start changes nothing")
	require.Equal(t, cur, gotCurrent)
	require.Equal(t, moved, gotMoved)
	require.NotContains(t, logs, "resealed", "nothing to log when nothing moved")
}
