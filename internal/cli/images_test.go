package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// TestImagesAgainstAControlPlane drives images and signer-keys against a
// real control plane: keygen, add the key, push, sign, get, and the
// refusals an operator meets.
func TestImagesAgainstAControlPlane(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	_, err := cp.Admin().Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	k, err := cp.Admin().ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin"}))
	require.NoError(t, err)
	dir := t.TempDir()
	cli := func(tok string, argv ...string) result {
		env := map[string]string{envConfig: filepath.Join(dir, "config.yaml"), envServer: cp.URL, envToken: tok, "HOME": dir}
		a := newApp("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" })
		a.retryBackoff = time.Millisecond
		var out, errb bytes.Buffer
		code := run(t.Context(), a, argv, strings.NewReader(""), &out, &errb)
		return result{code: code, stdout: out.String(), stderr: errb.String()}
	}
	acme := k.Msg.GetSecret()
	ok := func(argv ...string) string {
		t.Helper()
		r := cli(acme, argv...)
		require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
		return r.stdout
	}

	keyFile := filepath.Join(dir, "signing.key")
	pub := ok("images", "keygen", "--out", keyFile)
	require.Contains(t, pub, "BEGIN PUBLIC KEY")
	st, err := os.Stat(keyFile)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	pubFile := filepath.Join(dir, "signing.pub")
	require.NoError(t, os.WriteFile(pubFile, []byte(pub), 0o600))
	require.Contains(t, ok("signer-keys", "add", "ci", "--public-key", pubFile), "ed25519")

	disk := filepath.Join(dir, "disk.img")
	require.NoError(t, os.WriteFile(disk, bytes.Repeat([]byte{0xab}, 600<<10), 0o600))
	require.Contains(t, ok("images", "push", disk, "--name", "disk"), "unsigned")
	// Pushing the name again is a collision.
	r := cli(acme, "images", "push", disk, "--name", "disk")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "ALREADY_EXISTS")

	require.Contains(t, ok("images", "sign", "disk", "--key", keyFile), "tenant")
	var got struct {
		Image struct {
			Trusted    bool `json:"trusted"`
			Signatures []struct {
				KeyName string `json:"keyName"`
			} `json:"signatures"`
		} `json:"image"`
	}
	require.NoError(t, json.Unmarshal([]byte(ok("images", "get", "disk", "-o", "json")), &got))
	require.True(t, got.Image.Trusted)
	require.Equal(t, "ci", got.Image.Signatures[0].KeyName)
	require.Contains(t, ok("images", "list"), "disk")
	pulled := filepath.Join(dir, "pulled.img")
	ok("images", "pull", "disk", "--out", pulled)
	pb, err := os.ReadFile(pulled)
	require.NoError(t, err)
	db, err := os.ReadFile(disk)
	require.NoError(t, err)
	require.Equal(t, db, pb)

	// A tenant admin cannot promote.
	r = cli(acme, "images", "promote", "disk")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "PERMISSION_DENIED")

	// A key nobody allowlisted.
	other := filepath.Join(dir, "other.key")
	ok("images", "keygen", "--out", other, "--algorithm", "ecdsa-p256")
	r = cli(acme, "images", "sign", "disk", "--key", other)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "UNKNOWN_SIGNER")

	require.Contains(t, ok("signer-keys", "list"), "ci")
	ok("signer-keys", "remove", "ci")
	require.Contains(t, ok("images", "get", "disk"), "untrusted")
	ok("images", "delete", "disk")
	r = cli(acme, "images", "get", "disk")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "NOT_FOUND")
}
