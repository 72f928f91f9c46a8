package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/client"
	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/imagesig"
)

// imagesTenantHelp says what an empty tenant means for images and signer
// keys.
const imagesTenantHelp = "tenant name or id (default: the context's tenant, else the token's; a platform key without one means the platform's)"

func (a *app) imagesCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "images", Aliases: []string{"image"}, Short: "Push, sign, promote and delete images of the catalog"}
	var tenant, confirmationID string
	addFlag := func(c *cobra.Command) { c.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp) }

	var name, kind string
	push := &cobra.Command{
		Use:   "push FILE --name N [--kind raw|qcow2|kernel|initrd|ramdisk]",
		Short: "Push an image file (streamed and hashed; the server keeps it only if the bytes match)",
		Long: `Push an image: the file is read once to hash it, then streamed to the server,
which hashes what arrives and keeps nothing unless the sha256 and size match.
The same bytes pushed again (under any name) share one blob. A new image is
private and unsigned: sign it (images sign) before it can be deployed.`,
		Args: positional("FILE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if name == "" {
				return invalidArg("name", "required: pass --name")
			}
			f, err := os.Open(argv[0])
			if err != nil {
				return err
			}
			defer f.Close()
			h := sha256.New()
			size, err := io.Copy(h, f)
			if err != nil {
				return err
			}
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			hdr := &apiv1.PushImageHeader{Tenant: t, Name: name, Kind: kind, Sha256: hex.EncodeToString(h.Sum(nil)), SizeBytes: size}
			m := newCreate(confirmationID)
			var res *apiv1.PushImageResponse
			err = a.retry(cmd.Context(), func() error {
				if _, err := f.Seek(0, io.SeekStart); err != nil {
					return err
				}
				res, err = c.PushImage(cmd.Context(), hdr, f, m.idempotencyKey)
				return err
			})
			if err != nil {
				return err
			}
			return a.printImages(cmd, res, res.GetImage())
		},
	}
	addFlag(push)
	push.Flags().StringVar(&name, "name", "", "image name, unique in its tenant")
	push.Flags().StringVar(&kind, "kind", "raw", "raw, qcow2, kernel, initrd or ramdisk")

	get := &cobra.Command{
		Use:   "get IMAGE",
		Short: "Show an image (name or id), its signatures and whether it is trusted",
		Args:  positional("IMAGE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Images.Get(cmd.Context(), connect.NewRequest(&apiv1.GetImageRequest{Tenant: t, Image: argv[0]}))
			if err != nil {
				return err
			}
			return a.printImages(cmd, resp.Msg, resp.Msg.GetImage())
		},
	}
	addFlag(get)

	var limit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List the tenant's images and every public image",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Image, string, error) {
				resp, err := c.Images.List(ctx, connect.NewRequest(&apiv1.ListImagesRequest{Tenant: t, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetImages(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printImages(cmd, &apiv1.ListImagesResponse{Images: all}, all...)
		},
	}
	addFlag(list)
	addLimitFlag(list, &limit)

	var pullOut string
	pull := &cobra.Command{
		Use:   "pull IMAGE --out FILE",
		Short: "Download an image's content; FILE appears only once its sha256 and size match",
		Args:  positional("IMAGE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if pullOut == "" {
				return invalidArg("out", "required: pass --out FILE")
			}
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			tmp, err := os.CreateTemp(filepath.Dir(pullOut), ".pull-*")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			h := sha256.New()
			img, err := c.PullImage(cmd.Context(), &apiv1.PullImageRequest{Tenant: t, Image: argv[0]}, io.MultiWriter(tmp, h))
			if cerr := tmp.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			st, err := os.Stat(tmp.Name())
			if err != nil {
				return err
			}
			if got := hex.EncodeToString(h.Sum(nil)); got != img.GetSha256() || st.Size() != img.GetSizeBytes() {
				return fmt.Errorf("downloaded %d bytes with sha256 %s, but image %s has %d bytes with sha256 %s; nothing was written",
					st.Size(), got, img.GetName(), img.GetSizeBytes(), img.GetSha256())
			}
			if err := os.Rename(tmp.Name(), pullOut); err != nil {
				return err
			}
			return a.printImages(cmd, img, img)
		},
	}
	addFlag(pull)
	pull.Flags().StringVar(&pullOut, "out", "", "file to write")

	var keyFile string
	sign := &cobra.Command{
		Use:   "sign IMAGE --key KEYFILE",
		Short: "Sign an image with a private key whose public key is on an allowlist",
		Long: `Sign an image: the private key (PEM "PRIVATE KEY", Ed25519 or ECDSA P-256;
images keygen makes one) signs the image's payload here, and only the
signature goes to the server, which verifies it against the public keys on
the image tenant's and the platform's signer allowlists.`,
		Args: positional("IMAGE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if keyFile == "" {
				return invalidArg("key", "required: pass --key with a private key file")
			}
			text, err := os.ReadFile(keyFile)
			if err != nil {
				return err
			}
			signer, err := imagesig.ParsePrivateKeyPEM(text)
			if err != nil {
				return invalidArg("key", err.Error())
			}
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			got, err := c.Images.Get(cmd.Context(), connect.NewRequest(&apiv1.GetImageRequest{Tenant: t, Image: argv[0]}))
			if err != nil {
				return err
			}
			img := got.Msg.GetImage()
			sig, err := signer.Sign(imagesig.Payload(img.GetName(), img.GetKind(), img.GetSha256()))
			if err != nil {
				return err
			}
			resp, err := c.Images.Sign(cmd.Context(), request(&apiv1.SignImageRequest{Tenant: t, Image: img.GetId(),
				KeyFingerprint: signer.Public.Fingerprint, Signature: sig}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printImages(cmd, resp.Msg, resp.Msg.GetImage())
		},
	}
	addFlag(sign)
	sign.Flags().StringVar(&keyFile, "key", "", "private key file (PEM)")

	promote := &cobra.Command{
		Use:   "promote IMAGE",
		Short: "Make a platform-signed image public (platform administrators)",
		Args:  positional("IMAGE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Images.Promote(cmd.Context(), request(&apiv1.PromoteImageRequest{Tenant: t, Image: argv[0]}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printImages(cmd, resp.Msg, resp.Msg.GetImage())
		},
	}
	addFlag(promote)

	del := &cobra.Command{
		Use:   "delete IMAGE",
		Short: "Delete an image nothing uses",
		Args:  positional("IMAGE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Images.Delete(cmd.Context(), request(&apiv1.DeleteImageRequest{Tenant: t, Image: argv[0]}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { fmt.Fprintf(w, "deleted image %s\n", argv[0]) })
		},
	}
	addFlag(del)
	for _, c := range []*cobra.Command{sign, promote, del} {
		addConfirmationFlag(c, &confirmationID)
	}

	var out, alg string
	keygen := &cobra.Command{
		Use:   "keygen --out FILE [--algorithm ed25519|ecdsa-p256]",
		Short: "Make a signing key: the private key to FILE (0600), the public key to stdout",
		Long: `Make a signing key locally. The private key goes to FILE (PEM "PRIVATE KEY",
mode 0600) and never to the server; the public key (PEM "PUBLIC KEY") is
printed for signer-keys add.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return invalidArg("out", "required: pass --out FILE for the private key")
			}
			s, priv, err := imagesig.GenerateKey(alg)
			if err != nil {
				return invalidArg("algorithm", err.Error())
			}
			f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return err
			}
			if _, err := f.Write(priv); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
			_, err = io.WriteString(cmd.OutOrStdout(), s.Public.PEM())
			return err
		},
	}
	keygen.Flags().StringVar(&out, "out", "", "file for the private key (must not exist)")
	keygen.Flags().StringVar(&alg, "algorithm", imagesig.AlgEd25519, "ed25519 or ecdsa-p256")

	cmd.AddCommand(push, list, get, pull, sign, promote, del, keygen)
	return cmd
}

func (a *app) signerKeysCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "signer-keys", Aliases: []string{"signer-key"}, Short: "Manage the public keys whose image signatures a tenant trusts"}
	var tenant, confirmationID string
	addFlag := func(c *cobra.Command) { c.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp) }

	var pubFile string
	add := &cobra.Command{
		Use:   "add NAME --public-key FILE",
		Short: "Put a public key (PEM \"PUBLIC KEY\", Ed25519 or ECDSA P-256) on the allowlist",
		Args:  positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if pubFile == "" {
				return invalidArg("public-key", "required: pass --public-key FILE")
			}
			text, err := os.ReadFile(pubFile)
			if err != nil {
				return err
			}
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.AddSignerKeyResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.SignerKeys.Add(cmd.Context(), request(&apiv1.AddSignerKeyRequest{Tenant: t, Name: argv[0],
					PublicKey: strings.ReplaceAll(string(text), "\r\n", "\n")}, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printSignerKeys(cmd, resp.Msg, resp.Msg.GetSignerKey())
		},
	}
	addFlag(add)
	add.Flags().StringVar(&pubFile, "public-key", "", "public key file (PEM)")
	addConfirmationFlag(add, &confirmationID)

	var limit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List an allowlist",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.SignerKey, string, error) {
				resp, err := c.SignerKeys.List(ctx, connect.NewRequest(&apiv1.ListSignerKeysRequest{Tenant: t, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetSignerKeys(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printSignerKeys(cmd, &apiv1.ListSignerKeysResponse{SignerKeys: all}, all...)
		},
	}
	addFlag(list)
	addLimitFlag(list, &limit)

	remove := &cobra.Command{
		Use:   "remove KEY",
		Short: "Take a key (name, id or fingerprint) off the allowlist; its signatures stop counting",
		Args:  positional("KEY"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.SignerKeys.Remove(cmd.Context(), request(&apiv1.RemoveSignerKeyRequest{Tenant: t, Key: argv[0]}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { fmt.Fprintf(w, "removed signer key %s\n", argv[0]) })
		},
	}
	addFlag(remove)
	addConfirmationFlag(remove, &confirmationID)

	cmd.AddCommand(add, list, remove)
	return cmd
}

// imagesClient returns the client and the tenant images and signer keys
// act in: the flag, the context's or the token's tenant, or none (the
// platform's) for a platform key.
func (a *app) imagesClient(cmd *cobra.Command, flag string) (*client.Client, string, error) {
	c, err := a.client()
	if err != nil {
		return nil, "", err
	}
	t, err := a.tenant(cmd.Context(), flag, false)
	if err != nil {
		return nil, "", err
	}
	return c, t, nil
}

func (a *app) printImages(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Image) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "NAME", "KIND", "SIZE", "SHA256", "VISIBILITY", "TRUST", "OWNER", "CREATED")
		for _, i := range items {
			trust := "unsigned"
			switch {
			case i.GetPlatformSigned():
				trust = "platform"
			case i.GetTrusted():
				trust = "tenant"
			case len(i.GetSignatures()) > 0:
				trust = "untrusted"
			}
			owner := i.GetTenantId()
			if owner == "" {
				owner = "platform"
			}
			row(w, i.GetId(), i.GetName(), i.GetKind(), fmt.Sprint(i.GetSizeBytes()), i.GetSha256()[:min(12, len(i.GetSha256()))],
				i.GetVisibility(), trust, owner, ts(i.GetCreateTime()))
		}
	})
}

func (a *app) printSignerKeys(cmd *cobra.Command, msg proto.Message, items ...*apiv1.SignerKey) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "NAME", "ALGORITHM", "FINGERPRINT", "ALLOWLIST", "CREATED")
		for _, k := range items {
			list := k.GetTenantId()
			if list == "" {
				list = "platform"
			}
			row(w, k.GetId(), k.GetName(), k.GetAlgorithm(), k.GetFingerprint(), list, ts(k.GetCreateTime()))
		}
	})
}
