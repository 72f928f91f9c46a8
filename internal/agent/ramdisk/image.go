package ramdisk

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/better-compute/better-compute/internal/imagesig"
)

// imageCommand downloads an image to the spool, checks its size, sha256
// and a signature by a trusted key, and only then writes it to the drive.
//
// Params: url (default: the site's image cache, Config.ImagesURL + "/" +
// sha256), device, trusted_keys (PEM public keys the control plane's signer
// allowlist holds for this image, besides Config.TrustedImageKeys), and the
// descriptor: name, kind, sha256, size_bytes, signatures
// [{key_fingerprint, signature (base64)}].
func (r *Ramdisk) imageCommand(ctx context.Context, params map[string]any) (map[string]any, error) {
	if paramString(params, "url") == "" && r.cfg.ImagesURL != "" && imagesig.ValidDigest(paramString(params, "sha256")) {
		params["url"] = strings.TrimSuffix(r.cfg.ImagesURL, "/") + "/" + paramString(params, "sha256")
	}
	d, url, device, err := imageParams(params)
	if err != nil {
		return nil, err
	}
	trusted, err := r.trustedKeys(params)
	if err != nil {
		return nil, err
	}
	// A signature that cannot verify fails before anything is downloaded.
	if err := imagesig.VerifySignatures(d, trusted); err != nil {
		return nil, fmt.Errorf("image %s: %w", d.Name, err)
	}
	dst, err := r.open(device)
	if err != nil {
		return nil, err
	}
	defer dst.f.Close()
	if d.Size > dst.size {
		return nil, fmt.Errorf("%w: image of %d bytes does not fit %s (%d bytes)", ErrInvalidParams, d.Size, device, dst.size)
	}
	spool, err := os.CreateTemp(r.cfg.SpoolDir, "image-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(spool.Name())
	defer spool.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: url: %w", ErrInvalidParams, err)
	}
	resp, err := r.cfg.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("download %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("download %s: %s", url, resp.Status)
	}
	if _, err := imagesig.CopyVerified(spool, resp.Body, d, trusted); err != nil {
		return nil, fmt.Errorf("image %s: %w", d.Name, err)
	}
	if _, err := spool.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	n, err := io.Copy(io.NewOffsetWriter(dst.f, 0), spool)
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", device, err)
	}
	if err := dst.f.Sync(); err != nil {
		return nil, fmt.Errorf("sync %s: %w", device, err)
	}
	return map[string]any{"sha256": d.SHA256, "bytes": n, "device": device, "source": url}, nil
}

// trustedKeys are the configured keys plus the PEM keys the command names.
func (r *Ramdisk) trustedKeys(params map[string]any) ([]imagesig.PublicKey, error) {
	pems, err := paramStrings(params, "trusted_keys")
	if err != nil {
		return nil, err
	}
	keys := append([]imagesig.PublicKey(nil), r.cfg.TrustedImageKeys...)
	for i, p := range pems {
		k, err := imagesig.ParsePublicKeyPEM([]byte(p))
		if err != nil {
			return nil, fmt.Errorf("%w: trusted_keys[%d]: %w", ErrInvalidParams, i, err)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

func imageParams(params map[string]any) (imagesig.Descriptor, string, string, error) {
	d := imagesig.Descriptor{Name: paramString(params, "name"), Kind: paramString(params, "kind"), SHA256: paramString(params, "sha256")}
	url, device := paramString(params, "url"), paramString(params, "device")
	size, _ := params["size_bytes"].(float64)
	d.Size = int64(size)
	switch {
	case url == "" || device == "":
		return d, "", "", fmt.Errorf("%w: url and device are required", ErrInvalidParams)
	case !imagesig.ValidDigest(d.SHA256):
		return d, "", "", fmt.Errorf("%w: sha256: must be 64 lower-case hex characters", ErrInvalidParams)
	case d.Size <= 0:
		return d, "", "", fmt.Errorf("%w: size_bytes: must be positive", ErrInvalidParams)
	}
	sigs, _ := params["signatures"].([]any)
	for _, s := range sigs {
		m, _ := s.(map[string]any)
		raw, err := base64.StdEncoding.DecodeString(paramString(m, "signature"))
		if err != nil || paramString(m, "key_fingerprint") == "" {
			return d, "", "", fmt.Errorf("%w: signatures: each needs key_fingerprint and a base64 signature", ErrInvalidParams)
		}
		d.Signatures = append(d.Signatures, imagesig.Signature{KeyFingerprint: paramString(m, "key_fingerprint"), Signature: raw})
	}
	if len(d.Signatures) == 0 {
		return d, "", "", errors.Join(ErrInvalidParams, errors.New("signatures: the image is unsigned"))
	}
	return d, url, device, nil
}
