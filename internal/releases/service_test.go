package releases_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
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
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/app"
	"github.com/better-compute/better-compute/internal/release"
	"github.com/better-compute/better-compute/internal/releases"
	"github.com/better-compute/better-compute/internal/store"
)

type fixture struct {
	cp     *bctest.ControlPlane
	admin  *client.Client // platform admin
	key    release.Key
	other  release.Key // a key the control plane does not trust
	tenant map[string]*client.Client
}

func setup(t *testing.T) *fixture {
	t.Helper()
	key, _, err := release.GenerateKey(release.AlgEd25519)
	require.NoError(t, err)
	other, _, err := release.GenerateKey(release.AlgECDSAP256)
	require.NoError(t, err)
	pub := filepath.Join(t.TempDir(), "release.pub")
	require.NoError(t, os.WriteFile(pub, key.Public.PEM(), 0o644))
	cp := bctest.NewControlPlane(t, func(c *app.Config) { c.ReleasePubkeys = []string{pub} })
	f := &fixture{cp: cp, admin: cp.Admin(), key: key, other: other, tenant: map[string]*client.Client{}}
	ctx := context.Background()
	_, err = f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: "acme"}))
	require.NoError(t, err)
	for _, role := range []string{"admin", "viewer"} {
		k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: role}))
		require.NoError(t, err)
		f.tenant[role] = cp.Client(k.Msg.GetSecret())
	}
	return f
}

// bundle is a signed release and its files, as `release sign` leaves them.
type bundle struct {
	manifest release.Manifest
	envelope []byte
	files    map[string][]byte
}

func random(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return b
}

func digest(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// makeRelease signs a release of version with key for both platforms.
func makeRelease(t *testing.T, key release.Key, version string) bundle {
	t.Helper()
	b := bundle{files: map[string][]byte{}}
	b.manifest = release.Manifest{Schema: release.Schema, Version: version, MinControlPlaneVersion: "v0.1.0",
		CreatedAt: time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)}
	for _, p := range release.Platforms {
		// More than one chunk, so a file crosses chunk boundaries.
		bin := random(t, client.PushChunkBytes+1234)
		bom := []byte(`{"bomFormat":"CycloneDX","platform":"` + p + `"}`)
		name := "bcd-" + p
		b.files[name], b.files[release.SBOMName(name)] = bin, bom
		b.manifest.Binaries = append(b.manifest.Binaries, release.Binary{Platform: p, Name: name, SHA256: digest(bin), Size: int64(len(bin)),
			SBOM: release.File{Name: release.SBOMName(name), SHA256: digest(bom), Size: int64(len(bom))}})
	}
	var err error
	b.envelope, err = release.Sign(b.manifest, key)
	require.NoError(t, err)
	return b
}

// upload sends the bundle's files in name order.
func (b bundle) upload(names ...string) []client.ReleaseFile {
	if names == nil {
		for name := range b.files {
			names = append(names, name)
		}
	}
	var out []client.ReleaseFile
	for _, n := range names {
		out = append(out, client.ReleaseFile{Name: n, Content: bytes.NewReader(b.files[n])})
	}
	return out
}

func create(c *client.Client, b bundle, files []client.ReleaseFile) (*apiv1.CreateReleaseResponse, error) {
	return c.CreateRelease(context.Background(), string(b.envelope), files, "")
}

func (f *fixture) download(t *testing.T, path string) (int, []byte) {
	t.Helper()
	res, err := http.Get(f.cp.URL + path)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, body
}

// blobFiles lists the blob directory's blobs and its uploads in flight.
func (f *fixture) blobFiles(t *testing.T) (blobs, uploads []string) {
	t.Helper()
	dir := filepath.Dir(filepath.Dir(f.cp.App.Blobs.Path("x")))
	for _, sub := range []string{"sha256", "uploads"} {
		es, err := os.ReadDir(filepath.Join(dir, sub))
		require.NoError(t, err)
		for _, e := range es {
			if sub == "sha256" {
				blobs = append(blobs, e.Name())
			} else {
				uploads = append(uploads, e.Name())
			}
		}
	}
	return blobs, uploads
}

func TestPublishServeDelete(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	b := makeRelease(t, f.key, "v1.4.0")

	res, err := create(f.admin, b, b.upload())
	require.NoError(t, err)
	r := res.GetRelease()
	require.Equal(t, "v1.4.0", r.GetVersion())
	require.Equal(t, "v0.1.0", r.GetMinControlPlaneVersion())
	require.Equal(t, []string{"linux-amd64", "linux-arm64"}, r.GetPlatforms())
	require.Equal(t, f.key.Public.ID, r.GetKeyId())
	require.Equal(t, string(b.envelope), r.GetManifest())
	require.Len(t, r.GetFiles(), 4)

	// The Go API the rollout module reads.
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		got, err := releases.Get(ctx, tx, "v1.4.0")
		require.NoError(t, err)
		require.Equal(t, b.envelope, got.Manifest)
		require.Equal(t, []string{"linux-amd64", "linux-arm64"}, got.Platforms)
		_, err = releases.Get(ctx, tx, "v9.9.9")
		require.ErrorIs(t, err, releases.ErrNotFound)
		return nil
	}))

	// A tenant's principal reads releases.
	got, err := f.tenant["viewer"].Releases.Get(ctx, connect.NewRequest(&apiv1.GetReleaseRequest{Version: "v1.4.0"}))
	require.NoError(t, err)
	require.Equal(t, r.GetKeyId(), got.Msg.GetRelease().GetKeyId())
	list, err := f.tenant["viewer"].Releases.List(ctx, connect.NewRequest(&apiv1.ListReleasesRequest{}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetReleases(), 1)

	// /downloads serves it, without credentials, and what it serves
	// verifies offline.
	code, manifest := f.download(t, "/downloads/bcd/v1.4.0/manifest.json")
	require.Equal(t, 200, code)
	m, _, err := release.Verify(manifest, []release.PublicKey{f.key.Public})
	require.NoError(t, err)
	for _, bin := range m.Binaries {
		code, body := f.download(t, "/downloads/bcd/v1.4.0/"+bin.Platform)
		require.Equal(t, 200, code)
		require.NoError(t, release.CheckBinary(bytes.NewReader(body), bin))
		code, body = f.download(t, "/downloads/bcd/v1.4.0/"+bin.Platform+".sha256")
		require.Equal(t, 200, code)
		require.Equal(t, bin.SHA256+"  bcd\n", string(body))
		code, body = f.download(t, "/downloads/bcd/v1.4.0/"+bin.Platform+".sbom.json")
		require.Equal(t, 200, code)
		require.NoError(t, release.CheckSBOM(bytes.NewReader(body), bin))
	}
	blobs, uploads := f.blobFiles(t)
	require.Len(t, blobs, 4)
	require.Empty(t, uploads)

	// A tenant may not delete it; the platform may, and its blobs go.
	_, err = f.tenant["admin"].Releases.Delete(ctx, connect.NewRequest(&apiv1.DeleteReleaseRequest{Version: "v1.4.0"}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err), "err: %v", err)
	_, err = f.admin.Releases.Delete(ctx, connect.NewRequest(&apiv1.DeleteReleaseRequest{Version: "v1.4.0"}))
	require.NoError(t, err)
	code, _ = f.download(t, "/downloads/bcd/v1.4.0/linux-amd64")
	require.Equal(t, 404, code)
	_, err = f.admin.Releases.Get(ctx, connect.NewRequest(&apiv1.GetReleaseRequest{Version: "v1.4.0"}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
	bctest.WaitFor(t, "the release's blobs are collected", func() bool { blobs, _ := f.blobFiles(t); return len(blobs) == 0 })

	// The audit log and the outbox recorded both.
	var events []string
	require.NoError(t, f.cp.App.DB.Read(ctx, func(ctx context.Context, tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT type FROM events WHERE resource_type = 'Release' ORDER BY seq`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var typ string
			if err := rows.Scan(&typ); err != nil {
				return err
			}
			events = append(events, typ)
		}
		return rows.Err()
	}))
	require.Equal(t, []string{"release.published", "release.deleted"}, events)
}

func TestCreateRefusalsKeepNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	good := makeRelease(t, f.key, "v1.5.0")
	untrusted := makeRelease(t, f.other, "v1.5.0")
	// A changed byte of the signature: the key is trusted, the signature
	// does not verify.
	badSig := good
	badSig.envelope = []byte(strings.Replace(string(good.envelope), `"signature": "`, `"signature": "AAAA`, 1))
	tampered := makeRelease(t, f.key, "v1.5.0")
	tamperedFiles := tampered.upload()
	for i, rf := range tamperedFiles {
		if rf.Name == "bcd-linux-arm64" {
			bad := bytes.Clone(tampered.files[rf.Name])
			bad[100] ^= 1
			tamperedFiles[i].Content = bytes.NewReader(bad)
		}
	}
	extra := good.upload()
	extra = append(extra, client.ReleaseFile{Name: "install.sh", Content: strings.NewReader("#!/bin/sh\n")})
	twice := append(good.upload(), client.ReleaseFile{Name: "bcd-linux-amd64", Content: bytes.NewReader(good.files["bcd-linux-amd64"])})

	tests := []struct {
		name  string
		b     bundle
		files []client.ReleaseFile
		code  string
		field string
	}{
		{"unknown key", untrusted, untrusted.upload(), "RELEASE_UNTRUSTED", "manifest.key_id"},
		{"bad signature", badSig, good.upload(), "", ""},
		{"tampered binary", tampered, tamperedFiles, "DIGEST_MISMATCH", "files[bcd-linux-arm64]"},
		{"missing file", good, good.upload("bcd-linux-amd64", "bcd-linux-amd64.sbom.json", "bcd-linux-arm64"), "INVALID_ARGUMENT", "files"},
		{"extra file", good, extra, "INVALID_ARGUMENT", "files[install.sh]"},
		{"file sent twice", good, twice, "INVALID_ARGUMENT", "files[bcd-linux-amd64]"},
		{"not an envelope", bundle{envelope: []byte(`{"manifest": 1}`)}, nil, "INVALID_ARGUMENT", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := create(f.admin, tt.b, tt.files)
			require.Error(t, err)
			d := client.Detail(err)
			require.NotNil(t, d, "err: %v", err)
			switch tt.name {
			case "bad signature":
				// A mangled base64 is malformed; a well-formed wrong one
				// does not verify: either names the signature.
				require.Contains(t, []string{"RELEASE_UNTRUSTED", "INVALID_ARGUMENT"}, d.GetCode(), "err: %v", err)
				require.Equal(t, "manifest.signature", d.GetViolations()[0].GetField(), "err: %v", err)
			case "not an envelope":
				require.Equal(t, tt.code, d.GetCode(), "err: %v", err)
				require.True(t, strings.HasPrefix(d.GetViolations()[0].GetField(), "manifest"), "err: %v", err)
			default:
				require.Equal(t, tt.code, d.GetCode(), "err: %v", err)
				require.Equal(t, tt.field, d.GetViolations()[0].GetField(), "err: %v", err)
				require.NotEmpty(t, d.GetViolations()[0].GetReason())
			}
			// Nothing committed, nothing kept.
			_, err = f.admin.Releases.Get(context.Background(), connect.NewRequest(&apiv1.GetReleaseRequest{Version: "v1.5.0"}))
			require.Equal(t, "NOT_FOUND", client.Code(err))
			blobs, uploads := f.blobFiles(t)
			require.Empty(t, blobs)
			require.Empty(t, uploads)
		})
	}

	// A well-formed signature by another key under the trusted key's id.
	forged := makeRelease(t, f.other, "v1.5.0")
	forged.envelope = []byte(strings.Replace(string(forged.envelope), f.other.Public.ID, f.key.Public.ID, 1))
	_, err := create(f.admin, forged, forged.upload())
	require.Equal(t, "RELEASE_UNTRUSTED", client.Code(err), "err: %v", err)
	require.Equal(t, "manifest.signature", client.Detail(err).GetViolations()[0].GetField())

	// Published once; the same version again is refused and changes
	// nothing.
	_, err = create(f.admin, good, good.upload())
	require.NoError(t, err)
	again := makeRelease(t, f.key, "v1.5.0")
	_, err = create(f.admin, again, again.upload())
	require.Equal(t, "ALREADY_EXISTS", client.Code(err), "err: %v", err)
	code, body := f.download(t, "/downloads/bcd/v1.5.0/manifest.json")
	require.Equal(t, 200, code)
	require.Equal(t, good.envelope, body)
}

func TestTenantCannotPublish(t *testing.T) {
	t.Parallel()
	f := setup(t)
	b := makeRelease(t, f.key, "v2.0.0")
	for _, role := range []string{"admin", "viewer"} {
		_, err := create(f.tenant[role], b, b.upload())
		require.Equal(t, "PERMISSION_DENIED", client.Code(err), "%s: %v", role, err)
	}
	_, err := f.admin.Releases.Get(context.Background(), connect.NewRequest(&apiv1.GetReleaseRequest{Version: "v2.0.0"}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
	blobs, uploads := f.blobFiles(t)
	require.Empty(t, blobs)
	require.Empty(t, uploads)
}

func TestNoReleaseKeyRefusesCreate(t *testing.T) {
	t.Parallel()
	cp := bctest.NewControlPlane(t)
	key, _, err := release.GenerateKey(release.AlgEd25519)
	require.NoError(t, err)
	b := makeRelease(t, key, "v1.0.0")
	_, err = create(cp.Admin(), b, b.upload())
	require.Equal(t, "FAILED_PRECONDITION", client.Code(err), "err: %v", err)
	require.Contains(t, err.Error(), "--release-pubkey")
}

// TestDeleteRefusedWhileRolledOut: a release an active rollout sends (even
// paused) is not deleted, FAILED_PRECONDITION naming the rollout, and
// stays served; once the rollout is aborted it may go.
func TestDeleteRefusedWhileRolledOut(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	b := makeRelease(t, f.key, "v1.5.0")
	_, err := create(f.admin, b, b.upload())
	require.NoError(t, err)
	_, err = f.admin.Projects.Create(ctx, connect.NewRequest(&apiv1.CreateProjectRequest{Tenant: "acme", Name: "default"}))
	require.NoError(t, err)
	sim, err := bctest.StartFleetSim(ctx, bctest.FleetSimConfig{
		Template: bctest.FakeDaemonConfig{Gateway: f.cp.GatewayAddr}, Root: t.TempDir(), N: 1,
		Token: func(ctx context.Context, _ int) (string, error) {
			tok, err := f.admin.JoinTokens.Create(ctx, connect.NewRequest(&apiv1.CreateJoinTokenRequest{Tenant: "acme", Project: "default"}))
			return tok.Msg.GetToken(), err
		},
	})
	require.NoError(t, err)
	t.Cleanup(sim.Stop)
	_, err = f.admin.Pools.Create(ctx, connect.NewRequest(&apiv1.CreatePoolRequest{Tenant: "acme", Name: "h100",
		Selector: []*apiv1.SelectorRequirement{{Key: "gpu.model", Operator: "In", Values: []string{"H100"}}}}))
	require.NoError(t, err)
	var ro *apiv1.Rollout
	bctest.WaitFor(t, "a rollout of the pool's node", func() bool {
		r, err := f.admin.Rollouts.Create(ctx, connect.NewRequest(&apiv1.CreateRolloutRequest{Release: "v1.5.0", Pool: "h100", Waves: []string{"100%"}}))
		if client.Code(err) == "INVALID_ARGUMENT" {
			return false // the node is not in the pool yet
		}
		require.NoError(t, err)
		ro = r.Msg.GetRollout()
		return true
	})
	_, err = f.admin.Rollouts.Pause(ctx, connect.NewRequest(&apiv1.PauseRolloutRequest{Id: ro.GetId()}))
	require.NoError(t, err)

	_, err = f.admin.Releases.Delete(ctx, connect.NewRequest(&apiv1.DeleteReleaseRequest{Version: "v1.5.0"}))
	require.Equal(t, "FAILED_PRECONDITION", client.Code(err), "err: %v", err)
	require.ErrorContains(t, err, ro.GetId())
	code, _ := f.download(t, "/downloads/bcd/v1.5.0/linux-amd64")
	require.Equal(t, 200, code, "refused: the release is still served")

	_, err = f.admin.Rollouts.Abort(ctx, connect.NewRequest(&apiv1.AbortRolloutRequest{Id: ro.GetId()}))
	require.NoError(t, err)
	_, err = f.admin.Releases.Delete(ctx, connect.NewRequest(&apiv1.DeleteReleaseRequest{Version: "v1.5.0"}))
	require.NoError(t, err)
}
