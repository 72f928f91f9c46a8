package images_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/images"
	"github.com/better-compute/better-compute/internal/imagesig"
	"github.com/better-compute/better-compute/internal/store"
)

type fixture struct {
	cp    *bctest.ControlPlane
	admin *client.Client // platform admin
	keys  map[string]*client.Client
	acme  string // tenant id
	other string
}

func setup(t *testing.T) *fixture {
	t.Helper()
	cp := bctest.NewControlPlane(t)
	ctx := context.Background()
	f := &fixture{cp: cp, admin: cp.Admin(), keys: map[string]*client.Client{}}
	for _, name := range []string{"acme", "other"} {
		tn, err := f.admin.Tenants.Create(ctx, connect.NewRequest(&apiv1.CreateTenantRequest{Name: name}))
		require.NoError(t, err)
		if name == "acme" {
			f.acme = tn.Msg.GetTenant().GetId()
		} else {
			f.other = tn.Msg.GetTenant().GetId()
		}
	}
	for _, role := range []string{"admin", "viewer"} {
		k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "acme", Role: role}))
		require.NoError(t, err)
		f.keys[role] = cp.Client(k.Msg.GetSecret())
	}
	k, err := f.admin.ApiKeys.Create(ctx, connect.NewRequest(&apiv1.CreateApiKeyRequest{Tenant: "other", Role: "admin"}))
	require.NoError(t, err)
	f.keys["evil"] = cp.Client(k.Msg.GetSecret())
	return f
}

// content returns n random bytes and their sha256.
func content(t *testing.T, n int) ([]byte, string) {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	return b, hex.EncodeToString(sum[:])
}

func push(t *testing.T, c *client.Client, tenant, name, kind string, b []byte) (*apiv1.PushImageResponse, error) {
	t.Helper()
	sum := sha256.Sum256(b)
	return c.PushImage(context.Background(), &apiv1.PushImageHeader{Tenant: tenant, Name: name, Kind: kind,
		Sha256: hex.EncodeToString(sum[:]), SizeBytes: int64(len(b))}, bytes.NewReader(b), "")
}

// addKey makes a key and puts it on the allowlist of tenant ("" with the
// platform admin: the platform's).
func addKey(t *testing.T, c *client.Client, tenant, name, alg string) imagesig.Signer {
	t.Helper()
	s, _, err := imagesig.GenerateKey(alg)
	require.NoError(t, err)
	_, err = c.SignerKeys.Add(context.Background(), connect.NewRequest(&apiv1.AddSignerKeyRequest{Tenant: tenant, Name: name, PublicKey: s.Public.PEM()}))
	require.NoError(t, err)
	return s
}

func sign(t *testing.T, c *client.Client, tenant string, img *apiv1.Image, s imagesig.Signer) (*apiv1.Image, error) {
	t.Helper()
	sig, err := s.Sign(imagesig.Payload(img.GetName(), img.GetKind(), img.GetSha256()))
	require.NoError(t, err)
	res, err := c.Images.Sign(context.Background(), connect.NewRequest(&apiv1.SignImageRequest{Tenant: tenant, Image: img.GetId(),
		KeyFingerprint: s.Public.Fingerprint, Signature: sig}))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetImage(), nil
}

// verify runs the deploy path's check; a refusal comes back as a Connect
// error, as the deploy path's API would answer it.
func (f *fixture) verify(t *testing.T, tenantID, ref string) (images.Deployable, error) {
	t.Helper()
	var d images.Deployable
	err := f.cp.App.DB.Read(context.Background(), func(ctx context.Context, tx store.Tx) (err error) {
		d, err = images.Verify(ctx, tx, tenantID, ref)
		return err
	})
	if err != nil {
		return d, envelope.ToConnect(err)
	}
	return d, nil
}

// blobFiles lists the blob directory's blobs and uploads in flight.
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

func TestPushGetListDedup(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	c := f.keys["admin"]
	// Larger than a chunk, not a multiple of one.
	b, sum := content(t, 3*client.PushChunkBytes+17)

	res, err := push(t, c, "acme", "disk", "raw", b)
	require.NoError(t, err)
	img := res.GetImage()
	require.False(t, res.GetDeduplicated())
	require.Equal(t, sum, img.GetSha256())
	require.Equal(t, int64(len(b)), img.GetSizeBytes())
	require.Equal(t, f.acme, img.GetTenantId())
	require.Equal(t, "private", img.GetVisibility())
	require.Equal(t, "application/vnd.better-compute.image.raw", img.GetMediaType())
	require.False(t, img.GetTrusted())
	stored, err := os.ReadFile(f.cp.App.Blobs.Path(sum))
	require.NoError(t, err)
	require.Equal(t, b, stored)

	// The same bytes under another name share the blob.
	res2, err := push(t, c, "acme", "disk-copy", "raw", b)
	require.NoError(t, err)
	require.True(t, res2.GetDeduplicated())
	blobs, uploads := f.blobFiles(t)
	require.Equal(t, []string{sum}, blobs)
	require.Empty(t, uploads)

	// A name is unique in its tenant, whatever the bytes.
	other, _ := content(t, 100)
	_, err = push(t, c, "acme", "disk", "raw", other)
	require.Equal(t, "ALREADY_EXISTS", client.Code(err), "err: %v", err)
	blobs, uploads = f.blobFiles(t)
	require.Equal(t, []string{sum}, blobs, "the refused push kept nothing")
	require.Empty(t, uploads)
	// …but another tenant may use it.
	_, err = push(t, f.keys["evil"], "other", "disk", "raw", other)
	require.NoError(t, err)

	got, err := f.keys["viewer"].Images.Get(ctx, connect.NewRequest(&apiv1.GetImageRequest{Tenant: "acme", Image: "disk"}))
	require.NoError(t, err)
	require.Equal(t, img.GetId(), got.Msg.GetImage().GetId())
	list, err := f.keys["viewer"].Images.List(ctx, connect.NewRequest(&apiv1.ListImagesRequest{Tenant: "acme", PageSize: 1}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetImages(), 1)
	require.NotEmpty(t, list.Msg.GetNextPageToken())
	list, err = f.keys["viewer"].Images.List(ctx, connect.NewRequest(&apiv1.ListImagesRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetImages(), 2, "acme's two images; not other's private one")

	// A viewer reads, but does not push.
	_, err = push(t, f.keys["viewer"], "acme", "nope", "raw", other)
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
}

func TestPushBadContentKeepsNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	c := f.keys["admin"]
	b, sum := content(t, client.PushChunkBytes+5)
	count := func() int {
		l, err := c.Images.List(ctx, connect.NewRequest(&apiv1.ListImagesRequest{Tenant: "acme"}))
		require.NoError(t, err)
		return len(l.Msg.GetImages())
	}

	tampered := bytes.Clone(b)
	tampered[7] ^= 0xff
	shorter := b[:len(b)-1]
	longer := append(bytes.Clone(b), 0)
	for name, body := range map[string][]byte{"tampered": tampered, "shorter": shorter, "longer": longer} {
		_, err := c.PushImage(ctx, &apiv1.PushImageHeader{Tenant: "acme", Name: "disk", Kind: "raw", Sha256: sum, SizeBytes: int64(len(b))},
			bytes.NewReader(body), "")
		require.Equal(t, "DIGEST_MISMATCH", client.Code(err), "%s: %v", name, err)
		require.Equal(t, 0, count(), name)
		blobs, uploads := f.blobFiles(t)
		require.Empty(t, blobs, name)
		require.Empty(t, uploads, name)
	}

	tests := []struct {
		name  string
		hdr   *apiv1.PushImageHeader
		field string
	}{
		{"kind", &apiv1.PushImageHeader{Tenant: "acme", Name: "d", Kind: "iso", Sha256: sum, SizeBytes: 1}, "kind"},
		{"digest", &apiv1.PushImageHeader{Tenant: "acme", Name: "d", Kind: "raw", Sha256: "ABC", SizeBytes: 1}, "sha256"},
		{"size", &apiv1.PushImageHeader{Tenant: "acme", Name: "d", Kind: "raw", Sha256: sum, SizeBytes: 0}, "size_bytes"},
		{"name", &apiv1.PushImageHeader{Tenant: "acme", Name: "Bad Name", Kind: "raw", Sha256: sum, SizeBytes: 1}, "name"},
	}
	for _, tt := range tests {
		_, err := c.PushImage(ctx, tt.hdr, bytes.NewReader(b), "")
		require.Equal(t, "INVALID_ARGUMENT", client.Code(err), tt.name)
		require.Equal(t, tt.field, client.Detail(err).GetViolations()[0].GetField(), tt.name)
	}

	// A stream that starts with a chunk is refused.
	stream := c.Images.Push(ctx)
	require.NoError(t, stream.Send(&apiv1.PushImageRequest{Part: &apiv1.PushImageRequest_Chunk{Chunk: []byte("x")}}))
	_, err := stream.CloseAndReceive()
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err))
	require.Equal(t, 0, count())
}

func TestPushIdempotent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	b, sum := content(t, 1000)
	hdr := &apiv1.PushImageHeader{Tenant: "acme", Name: "disk", Kind: "raw", Sha256: sum, SizeBytes: int64(len(b))}
	key := client.NewIdempotencyKey()
	first, err := f.keys["admin"].PushImage(ctx, hdr, bytes.NewReader(b), key)
	require.NoError(t, err)
	again, err := f.keys["admin"].PushImage(ctx, hdr, bytes.NewReader(b), key)
	require.NoError(t, err)
	require.Equal(t, first.GetImage().GetId(), again.GetImage().GetId())
}

func TestSignVerifyPromote(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	c := f.keys["admin"]
	b, _ := content(t, 4096)
	res, err := push(t, c, "acme", "disk", "raw", b)
	require.NoError(t, err)
	img := res.GetImage()

	// Unsigned: private to acme, and not deployable even there.
	_, err = f.verify(t, f.acme, "disk")
	require.Equal(t, "IMAGE_UNTRUSTED", client.Code(err), "err: %v", err)
	_, err = f.verify(t, f.other, img.GetId())
	require.Equal(t, "NOT_FOUND", client.Code(err))

	// A key on no allowlist.
	stranger, _, err := imagesig.GenerateKey(imagesig.AlgEd25519)
	require.NoError(t, err)
	_, err = sign(t, c, "acme", img, stranger)
	require.Equal(t, "UNKNOWN_SIGNER", client.Code(err), "err: %v", err)
	// A key on another tenant's allowlist is no signer of acme's.
	otherKey := addKey(t, f.keys["evil"], "other", "ci", imagesig.AlgEd25519)
	_, err = sign(t, c, "acme", img, otherKey)
	require.Equal(t, "UNKNOWN_SIGNER", client.Code(err))

	acmeKey := addKey(t, c, "acme", "ci", imagesig.AlgECDSAP256)
	// A signature over another payload (another name) does not verify.
	bad, err := acmeKey.Sign(imagesig.Payload("other-name", img.GetKind(), img.GetSha256()))
	require.NoError(t, err)
	_, err = c.Images.Sign(ctx, connect.NewRequest(&apiv1.SignImageRequest{Tenant: "acme", Image: "disk",
		KeyFingerprint: acmeKey.Public.Fingerprint, Signature: bad}))
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err))
	require.Equal(t, "signature", client.Detail(err).GetViolations()[0].GetField())

	signed, err := sign(t, c, "acme", img, acmeKey)
	require.NoError(t, err)
	require.True(t, signed.GetTrusted())
	require.False(t, signed.GetPlatformSigned())
	require.Len(t, signed.GetSignatures(), 1)
	require.Equal(t, f.acme, signed.GetSignatures()[0].GetSigner())

	d, err := f.verify(t, f.acme, "disk")
	require.NoError(t, err)
	require.Equal(t, img.GetSha256(), d.Descriptor.SHA256)
	// What Verify hands the ramdisk checks the real bytes.
	_, err = imagesig.CopyVerified(&bytes.Buffer{}, bytes.NewReader(b), d.Descriptor, d.Trusted)
	require.NoError(t, err)
	_, err = f.verify(t, f.other, img.GetId())
	require.Equal(t, "NOT_FOUND", client.Code(err), "a private image of another tenant is not found")

	// Promotion: the platform's alone, and only with its signature.
	_, err = c.Images.Promote(ctx, connect.NewRequest(&apiv1.PromoteImageRequest{Tenant: "acme", Image: "disk"}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
	_, err = f.admin.Images.Promote(ctx, connect.NewRequest(&apiv1.PromoteImageRequest{Tenant: "acme", Image: "disk"}))
	require.Equal(t, "IMAGE_UNTRUSTED", client.Code(err))
	platformKey := addKey(t, f.admin, "", "release", imagesig.AlgEd25519)
	// The platform's key signs acme's image (the platform admin attaches it).
	signed, err = sign(t, f.admin, "acme", img, platformKey)
	require.NoError(t, err)
	require.True(t, signed.GetPlatformSigned())
	pr, err := f.admin.Images.Promote(ctx, connect.NewRequest(&apiv1.PromoteImageRequest{Tenant: "acme", Image: "disk"}))
	require.NoError(t, err)
	require.Equal(t, "public", pr.Msg.GetImage().GetVisibility())

	// Public now: other reads it by id and deploys it on the platform's
	// signature alone.
	got, err := f.keys["evil"].Images.Get(ctx, connect.NewRequest(&apiv1.GetImageRequest{Tenant: "other", Image: img.GetId()}))
	require.NoError(t, err)
	require.Equal(t, "public", got.Msg.GetImage().GetVisibility())
	list, err := f.keys["evil"].Images.List(ctx, connect.NewRequest(&apiv1.ListImagesRequest{Tenant: "other"}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetImages(), 1)
	d, err = f.verify(t, f.other, img.GetId())
	require.NoError(t, err)
	require.Len(t, d.Trusted, 1, "only the platform's key travels to another tenant")
	require.Equal(t, platformKey.Public.Fingerprint, d.Trusted[0].Fingerprint)
	// But other cannot change it.
	_, err = f.keys["evil"].Images.Delete(ctx, connect.NewRequest(&apiv1.DeleteImageRequest{Tenant: "other", Image: img.GetId()}))
	require.Equal(t, "NOT_FOUND", client.Code(err))

	// Removing the platform key withdraws its trust at once.
	_, err = f.admin.SignerKeys.Remove(ctx, connect.NewRequest(&apiv1.RemoveSignerKeyRequest{Key: "release"}))
	require.NoError(t, err)
	_, err = f.verify(t, f.other, img.GetId())
	require.Equal(t, "IMAGE_UNTRUSTED", client.Code(err))
	_, err = f.verify(t, f.acme, "disk")
	require.NoError(t, err, "acme's own key still counts for acme")
}

func TestRamdiskMustBePlatformSigned(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.keys["admin"]
	b, _ := content(t, 2048)
	res, err := push(t, c, "acme", "rd", "ramdisk", b)
	require.NoError(t, err)
	acmeKey := addKey(t, c, "acme", "ci", imagesig.AlgEd25519)
	_, err = sign(t, c, "acme", res.GetImage(), acmeKey)
	require.NoError(t, err)
	_, err = f.verify(t, f.acme, "rd")
	require.Equal(t, "IMAGE_UNTRUSTED", client.Code(err))

	// The platform's own ramdisk, platform-signed and public.
	pres, err := push(t, f.admin, "", "ramdisk", "ramdisk", b)
	require.NoError(t, err)
	require.Empty(t, pres.GetImage().GetTenantId())
	require.True(t, pres.GetDeduplicated())
	platformKey := addKey(t, f.admin, "", "release", imagesig.AlgECDSAP256)
	_, err = sign(t, f.admin, "", pres.GetImage(), platformKey)
	require.NoError(t, err)
	_, err = f.verify(t, f.acme, "ramdisk")
	require.Equal(t, "NOT_FOUND", client.Code(err), "a private platform image is nobody else's")
	_, err = f.admin.Images.Promote(context.Background(), connect.NewRequest(&apiv1.PromoteImageRequest{Image: "ramdisk"}))
	require.NoError(t, err)
	d, err := f.verify(t, f.acme, "ramdisk")
	require.NoError(t, err, "a public platform image resolves by name")
	_, err = imagesig.CopyVerified(&bytes.Buffer{}, bytes.NewReader(b), d.Descriptor, d.Trusted)
	require.NoError(t, err)
}

func TestDeleteInUseAndCollect(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	c := f.keys["admin"]
	b, sum := content(t, 1024)
	a, err := push(t, c, "acme", "a", "raw", b)
	require.NoError(t, err)
	_, err = push(t, c, "acme", "b", "raw", b)
	require.NoError(t, err)

	// A machine deployed with a: the deploy path's reference.
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		return images.RefInsert(ctx, tx, &images.Ref{ImageID: a.GetImage().GetId(), Kind: "machine", RefID: "mch_1", TenantID: f.acme,
			CreateTime: f.cp.Clock.Now()})
	}))
	_, err = c.Images.Delete(ctx, connect.NewRequest(&apiv1.DeleteImageRequest{Tenant: "acme", Image: "a"}))
	require.Equal(t, "IMAGE_IN_USE", client.Code(err), "err: %v", err)
	require.Contains(t, err.Error(), "mch_1")
	require.NoError(t, f.cp.App.DB.Write(ctx, func(ctx context.Context, tx store.Tx) error {
		_, err := images.RefDelete(ctx, tx, a.GetImage().GetId(), "machine", "mch_1")
		return err
	}))

	_, err = c.Images.Delete(ctx, connect.NewRequest(&apiv1.DeleteImageRequest{Tenant: "acme", Image: "a"}))
	require.NoError(t, err)
	blobs, _ := f.blobFiles(t)
	require.Equal(t, []string{sum}, blobs, "b still names the bytes")
	_, err = c.Images.Delete(ctx, connect.NewRequest(&apiv1.DeleteImageRequest{Tenant: "acme", Image: "b"}))
	require.NoError(t, err)
	bctest.WaitFor(t, "the blob to be collected", func() bool {
		blobs, _ := f.blobFiles(t)
		return len(blobs) == 0
	})
	_, err = c.Images.Delete(ctx, connect.NewRequest(&apiv1.DeleteImageRequest{Tenant: "acme", Image: "b"}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
}

func TestCrossTenantLooksLikeNotFound(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	b, _ := content(t, 512)
	res, err := push(t, f.keys["admin"], "acme", "disk", "raw", b)
	require.NoError(t, err)
	id := res.GetImage().GetId()
	evil := f.keys["evil"]
	key := addKey(t, evil, "other", "ci", imagesig.AlgEd25519)
	sig, err := key.Sign(imagesig.Payload("disk", "raw", res.GetImage().GetSha256()))
	require.NoError(t, err)

	// Named under acme: refused. Named under its own tenant: not found,
	// exactly as an id that does not exist.
	_, err = evil.Images.Get(ctx, connect.NewRequest(&apiv1.GetImageRequest{Tenant: "acme", Image: id}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
	for name, call := range map[string]func(image string) error{
		"get": func(image string) error {
			_, err := evil.Images.Get(ctx, connect.NewRequest(&apiv1.GetImageRequest{Tenant: "other", Image: image}))
			return err
		},
		"sign": func(image string) error {
			_, err := evil.Images.Sign(ctx, connect.NewRequest(&apiv1.SignImageRequest{Tenant: "other", Image: image,
				KeyFingerprint: key.Public.Fingerprint, Signature: sig}))
			return err
		},
		"delete": func(image string) error {
			_, err := evil.Images.Delete(ctx, connect.NewRequest(&apiv1.DeleteImageRequest{Tenant: "other", Image: image}))
			return err
		},
	} {
		errReal := call(id)
		errNone := call("img_00000000000000000000000000")
		require.Equal(t, "NOT_FOUND", client.Code(errReal), name)
		require.Equal(t, "NOT_FOUND", client.Code(errNone), name)
		require.Equal(t, client.Detail(errNone).GetMessage()[:len("image")], client.Detail(errReal).GetMessage()[:len("image")], name)
	}
	// Pushing into acme is refused before a byte is kept.
	_, err = push(t, evil, "acme", "evil", "raw", b)
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
	// acme's image is untouched.
	got, err := f.keys["admin"].Images.Get(ctx, connect.NewRequest(&apiv1.GetImageRequest{Tenant: "acme", Image: id}))
	require.NoError(t, err)
	require.Empty(t, got.Msg.GetImage().GetSignatures())
}

func TestSignerKeys(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	c := f.keys["admin"]
	s := addKey(t, c, "acme", "ci", imagesig.AlgEd25519)
	// The same key twice, or the name twice.
	_, err := c.SignerKeys.Add(ctx, connect.NewRequest(&apiv1.AddSignerKeyRequest{Tenant: "acme", Name: "ci-2", PublicKey: s.Public.PEM()}))
	require.Equal(t, "ALREADY_EXISTS", client.Code(err))
	s2, _, err := imagesig.GenerateKey(imagesig.AlgEd25519)
	require.NoError(t, err)
	_, err = c.SignerKeys.Add(ctx, connect.NewRequest(&apiv1.AddSignerKeyRequest{Tenant: "acme", Name: "ci", PublicKey: s2.Public.PEM()}))
	require.Equal(t, "ALREADY_EXISTS", client.Code(err))
	// A private key is refused and never echoed.
	_, priv, err := imagesig.GenerateKey(imagesig.AlgEd25519)
	require.NoError(t, err)
	_, err = c.SignerKeys.Add(ctx, connect.NewRequest(&apiv1.AddSignerKeyRequest{Tenant: "acme", Name: "oops", PublicKey: string(priv)}))
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err))
	require.Equal(t, "public_key", client.Detail(err).GetViolations()[0].GetField())
	require.NotContains(t, err.Error(), string(priv[40:80]))
	// Only the platform adds to the platform's allowlist; a tenant admin's
	// empty tenant means its own.
	_, err = f.keys["viewer"].SignerKeys.Add(ctx, connect.NewRequest(&apiv1.AddSignerKeyRequest{Tenant: "acme", Name: "v", PublicKey: s2.Public.PEM()}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))

	list, err := f.keys["viewer"].SignerKeys.List(ctx, connect.NewRequest(&apiv1.ListSignerKeysRequest{Tenant: "acme"}))
	require.NoError(t, err)
	require.Len(t, list.Msg.GetSignerKeys(), 1)
	require.Equal(t, s.Public.Fingerprint, list.Msg.GetSignerKeys()[0].GetFingerprint())
	require.Equal(t, s.Public.PEM(), list.Msg.GetSignerKeys()[0].GetPublicKey())
	_, err = f.keys["evil"].SignerKeys.List(ctx, connect.NewRequest(&apiv1.ListSignerKeysRequest{Tenant: "acme"}))
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
	_, err = f.keys["evil"].SignerKeys.Remove(ctx, connect.NewRequest(&apiv1.RemoveSignerKeyRequest{Tenant: "other", Key: s.Public.Fingerprint}))
	require.Equal(t, "NOT_FOUND", client.Code(err))

	_, err = c.SignerKeys.Remove(ctx, connect.NewRequest(&apiv1.RemoveSignerKeyRequest{Key: s.Public.Fingerprint}))
	require.NoError(t, err, "by fingerprint, in the caller's own tenant")
	_, err = c.SignerKeys.Remove(ctx, connect.NewRequest(&apiv1.RemoveSignerKeyRequest{Tenant: "acme", Key: "ci"}))
	require.Equal(t, "NOT_FOUND", client.Code(err))
}

// TestPushOverGRPC: the push is a client stream over gRPC (HTTP/2) as well
// as over the Connect protocol on HTTP/1.1 (the other tests).
func TestPushOverGRPC(t *testing.T) {
	t.Parallel()
	f := setup(t)
	h2c := &http.Client{Transport: &http.Transport{Protocols: func() *http.Protocols {
		p := new(http.Protocols)
		p.SetUnencryptedHTTP2(true)
		return p
	}()}}
	grpc := client.New(f.cp.URL, f.cp.AdminKey, client.WithGRPC(), client.WithHTTPClient(h2c))
	b, sum := content(t, 2*client.PushChunkBytes+1)
	res, err := push(t, grpc, "acme", "disk", "qcow2", b)
	require.NoError(t, err)
	require.Equal(t, sum, res.GetImage().GetSha256())
	stored, err := os.ReadFile(f.cp.App.Blobs.Path(sum))
	require.NoError(t, err)
	require.Equal(t, b, stored)
	_, err = grpc.PushImage(context.Background(), &apiv1.PushImageHeader{Tenant: "acme", Name: "bad", Kind: "raw", Sha256: sum,
		SizeBytes: int64(len(b))}, bytes.NewReader(b[1:]), "")
	require.Equal(t, "DIGEST_MISMATCH", client.Code(err))
}

// TestPull streams content back, resumes at an offset, and hides another
// tenant's private image.
func TestPull(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	b, sum := content(t, 2*images.PullChunkBytes+3)
	_, err := push(t, f.keys["admin"], "acme", "disk", "raw", b)
	require.NoError(t, err)

	var out bytes.Buffer
	img, err := f.keys["viewer"].PullImage(ctx, &apiv1.PullImageRequest{Tenant: "acme", Image: "disk"}, &out)
	require.NoError(t, err)
	require.Equal(t, sum, img.GetSha256())
	require.Equal(t, b, out.Bytes())

	out.Reset()
	_, err = f.keys["viewer"].PullImage(ctx, &apiv1.PullImageRequest{Tenant: "acme", Image: "disk", Offset: int64(len(b) - 10)}, &out)
	require.NoError(t, err)
	require.Equal(t, b[len(b)-10:], out.Bytes())

	_, err = f.keys["viewer"].PullImage(ctx, &apiv1.PullImageRequest{Tenant: "acme", Image: "disk", Offset: int64(len(b) + 1)}, &out)
	require.Equal(t, "INVALID_ARGUMENT", client.Code(err))
	_, err = f.keys["evil"].PullImage(ctx, &apiv1.PullImageRequest{Tenant: "other", Image: img.GetId()}, &out)
	require.Equal(t, "NOT_FOUND", client.Code(err))
	_, err = f.keys["evil"].PullImage(ctx, &apiv1.PullImageRequest{Tenant: "acme", Image: img.GetId()}, &out)
	require.Equal(t, "PERMISSION_DENIED", client.Code(err))
}
