package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	bcapp "github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/release"
)

// TestReleasesAgainstAControlPlane publishes a release the way an operator
// does (release sign's directory, the binaries copied beside the
// manifest), reads it back, downloads it and deletes it.
func TestReleasesAgainstAControlPlane(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	key, _, err := release.GenerateKey(release.AlgEd25519)
	require.NoError(t, err)
	pubFile := filepath.Join(dir, "release.pub")
	require.NoError(t, os.WriteFile(pubFile, key.Public.PEM(), 0o644))
	cp := bctest.NewControlPlane(t, func(c *bcapp.Config) { c.ReleasePubkeys = []string{pubFile} })
	ctx := context.Background()
	_, err = cp.Admin().Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	k, err := cp.Admin().ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: "admin"}))
	require.NoError(t, err)
	cli := func(tok string, argv ...string) result {
		env := map[string]string{envConfig: filepath.Join(dir, "config.yaml"), envServer: cp.URL, envToken: tok, "HOME": dir}
		a := newApp("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok && v != "" })
		a.retryBackoff = time.Millisecond
		var out, errb bytes.Buffer
		code := run(t.Context(), a, argv, strings.NewReader(""), &out, &errb)
		return result{code: code, stdout: out.String(), stderr: errb.String()}
	}
	ok := func(argv ...string) string {
		t.Helper()
		r := cli(cp.AdminKey, argv...)
		require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
		return r.stdout
	}

	// release sign's output directory, binaries copied in.
	out := filepath.Join(dir, "release-v1.4.0")
	require.NoError(t, os.MkdirAll(out, 0o755))
	sum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	m := release.Manifest{Schema: release.Schema, Version: "v1.4.0", MinControlPlaneVersion: "v0.1.0", CreatedAt: time.Now().UTC()}
	for _, p := range release.Platforms {
		bin, bom := bytes.Repeat([]byte(p), 100<<10), []byte(`{"bomFormat":"CycloneDX"}`)
		name := "bcd-" + p
		require.NoError(t, os.WriteFile(filepath.Join(out, name), bin, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(out, release.SBOMName(name)), bom, 0o644))
		m.Binaries = append(m.Binaries, release.Binary{Platform: p, Name: name, SHA256: sum(bin), Size: int64(len(bin)),
			SBOM: release.File{Name: release.SBOMName(name), SHA256: sum(bom), Size: int64(len(bom))}})
	}
	env, err := release.Sign(m, key)
	require.NoError(t, err)
	manifest := filepath.Join(out, "manifest.json")
	require.NoError(t, os.WriteFile(manifest, env, 0o644))

	// A binary not copied beside the manifest is named before anything
	// is sent.
	require.NoError(t, os.Rename(filepath.Join(out, "bcd-linux-arm64"), filepath.Join(dir, "bcd-linux-arm64")))
	r := cli(cp.AdminKey, "releases", "create", "--manifest", manifest)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "bcd-linux-arm64")
	require.Contains(t, r.stderr, "--manifest")
	require.NoError(t, os.Rename(filepath.Join(dir, "bcd-linux-arm64"), filepath.Join(out, "bcd-linux-arm64")))

	// A tenant's admin may not publish.
	r = cli(k.Msg.GetSecret(), "releases", "create", "--manifest", manifest)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "PERMISSION_DENIED")

	require.Contains(t, ok("releases", "create", "--manifest", manifest), "v1.4.0")
	require.Contains(t, ok("releases", "list"), key.Public.ID)
	var got struct {
		Release struct {
			Version string `json:"version"`
			Files   []struct {
				Name string `json:"name"`
			} `json:"files"`
		} `json:"release"`
	}
	require.NoError(t, json.Unmarshal([]byte(ok("releases", "get", "v1.4.0", "-o", "json")), &got))
	require.Equal(t, "v1.4.0", got.Release.Version)
	require.Len(t, got.Release.Files, 4)
	var list struct {
		Releases []struct {
			Version string `json:"version"`
		} `json:"releases"`
	}
	require.NoError(t, json.Unmarshal([]byte(ok("releases", "list", "-o", "json")), &list))
	require.Len(t, list.Releases, 1)

	res, err := http.Get(cp.URL + "/downloads/bcd/v1.4.0/linux-arm64")
	require.NoError(t, err)
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, 200, res.StatusCode)
	b, _ := m.Binary("linux-arm64")
	require.NoError(t, release.CheckBinary(bytes.NewReader(body), b))

	r = cli(cp.AdminKey, "releases", "create", "--manifest", manifest)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "ALREADY_EXISTS")

	require.Contains(t, ok("releases", "delete", "v1.4.0"), "deleted release v1.4.0")
	r = cli(cp.AdminKey, "releases", "get", "v1.4.0")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "NOT_FOUND")
}
