package images

import (
	"context"
	"errors"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/imagesig"
	"github.com/better-compute/better-compute/internal/store"
)

// trust is what an image's signatures prove now, against the allowlists as
// they are (a removed key's signatures no longer count).
type trust struct {
	// trusted: a key on the owner's or the platform's allowlist signed it.
	trusted bool
	// platform: a key on the platform's allowlist signed it.
	platform bool
	sigs     []Signature
	// keys are the allowlisted keys whose signatures verified, by
	// fingerprint.
	keys map[string]SignerKey
}

// evaluate checks every signature of an image against the keys of the
// allowlists that count for it.
func evaluate(ctx context.Context, q store.Querier, i Image) (trust, error) {
	t := trust{keys: map[string]SignerKey{}}
	var err error
	if t.sigs, err = SignatureList(ctx, q, i.ID); err != nil || len(t.sigs) == 0 {
		return t, err
	}
	fps := make([]string, 0, len(t.sigs))
	for _, s := range t.sigs {
		fps = append(fps, s.KeyFingerprint)
	}
	keys, err := SignerKeysByFingerprint(ctx, q, allowlists(i.TenantID), fps)
	if err != nil {
		return t, err
	}
	payload := imagesig.Payload(i.Name, i.Kind, i.SHA256)
	for _, s := range t.sigs {
		for _, k := range keys {
			if k.Fingerprint != s.KeyFingerprint {
				continue
			}
			pub, err := imagesig.ParsePublicKeyDER(k.PublicKey)
			if err != nil || pub.Verify(payload, s.Signature) != nil {
				continue
			}
			t.keys[k.Fingerprint] = k
			t.trusted = true
			if k.TenantID == "" {
				t.platform = true
			}
		}
	}
	return t, nil
}

// Deployable is an image a tenant may deploy, with what the ramdisk needs
// to check the bytes it downloads (imagesig.CopyVerified).
type Deployable struct {
	Image      Image
	Descriptor imagesig.Descriptor
	// Trusted are the allowlisted keys whose signatures verified: the keys
	// to hand the ramdisk, never keys of the image's own choosing.
	Trusted []imagesig.PublicKey
}

// Verify is the deploy path's check: may tenantID (” for the platform)
// deploy the image ref (name or id)? It resolves ref as a read would (the
// tenant's own image, a public platform image by name, any public image by
// id) and requires a trusted signature:
//
//   - the tenant's own image: signed by a key on the tenant's or the
//     platform's allowlist;
//   - a public image: signed by a platform key;
//   - a ramdisk, whoever owns it: signed by a platform key.
//
// An image the tenant cannot see is NOT_FOUND, exactly as one that does not
// exist; an unsigned or wrongly signed one is IMAGE_UNTRUSTED. Errors are
// *envelope.Error for those, store errors otherwise. It reads through q so
// the caller can run it in the transaction that starts the deployment (and
// insert the image_refs row there with RefInsert).
func Verify(ctx context.Context, q store.Querier, tenantID, ref string) (Deployable, error) {
	var (
		i     Image
		found bool
	)
	for n, get := range []func() (Image, error){
		func() (Image, error) { return ImageGet(ctx, q, tenantID, ref) },
		func() (Image, error) { return ImageGet(ctx, q, "", ref) },
		func() (Image, error) { return ImageGetPublic(ctx, q, ref) },
	} {
		img, err := get()
		if err != nil {
			if isNotFound(err) {
				continue
			}
			return Deployable{}, err
		}
		if n > 0 && img.Visibility != VisibilityPublic {
			continue
		}
		i, found = img, true
		break
	}
	if !found {
		return Deployable{}, envelope.NotFound("image", ref)
	}
	t, err := evaluate(ctx, q, i)
	if err != nil {
		return Deployable{}, err
	}
	switch {
	case i.Kind == KindRamdisk && !t.platform:
		return Deployable{}, envelope.Errorf(envelope.CodeImageUntrusted, "image %q is a ramdisk: it must be signed by a platform signer key", i.Name)
	case i.TenantID != tenantID && !t.platform:
		return Deployable{}, envelope.Errorf(envelope.CodeImageUntrusted, "image %q is not platform-signed: another tenant's image is deployable only with the platform's signature", i.Name)
	case !t.trusted:
		return Deployable{}, envelope.Errorf(envelope.CodeImageUntrusted,
			"image %q has no signature by a key on its tenant's or the platform's signer allowlist: sign it (images sign) before deploying", i.Name)
	}
	d := Deployable{Image: i, Descriptor: imagesig.Descriptor{Name: i.Name, Kind: i.Kind, SHA256: i.SHA256, Size: i.SizeBytes}}
	for _, s := range t.sigs {
		k, ok := t.keys[s.KeyFingerprint]
		if !ok || (i.TenantID != tenantID || i.Kind == KindRamdisk) && k.TenantID != "" {
			// Only the signatures that earned the trust travel.
			continue
		}
		pub, err := imagesig.ParsePublicKeyDER(k.PublicKey)
		if err != nil {
			return Deployable{}, err
		}
		d.Descriptor.Signatures = append(d.Descriptor.Signatures, imagesig.Signature{KeyFingerprint: s.KeyFingerprint, Signature: s.Signature})
		d.Trusted = append(d.Trusted, pub)
	}
	return d, nil
}

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }
