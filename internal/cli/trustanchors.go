package cli

import (
	"context"
	"io"
	"os"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

func (a *app) trustAnchorsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "trust-anchors", Aliases: []string{"trust-anchor"}, Short: "Register what vouches for a tenant's machines at join (TPM EK CAs, machine CAs, cloud accounts)"}
	var tenant, confirmationID string

	var attestor, certFile, ekSHA, account, region string
	create := &cobra.Command{
		Use:   "create NAME --tenant T --attestor tpm|x509|cloud|kubelet",
		Short: "Register a trust anchor",
		Long: `Register a trust anchor for join tokens that require an attestor
(docs/attestation.md): for tpm, the TPM vendors' EK CA certificates
(--certificates, roots and intermediates) or the SHA-256 of one TPM's EK
public key (--ek-public-sha256); for x509, the CA that issues the machine
certificates; for cloud, the provider's instance-identity certificate and
the account (--cloud-account, and --cloud-region to admit one region).`,
		Args: positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			var pemText []byte
			if certFile != "" {
				b, err := os.ReadFile(certFile)
				if err != nil {
					return invalidArg("certificates", err.Error())
				}
				pemText = b
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.CreateTrustAnchorResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.TrustAnchors.Create(cmd.Context(), request(&apiv1.CreateTrustAnchorRequest{
					Tenant: t, Name: argv[0], Attestor: attestor, CertificatesPem: string(pemText), EkPublicSha256: ekSHA,
					CloudAccount: account, CloudRegion: region,
				}, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { trustAnchorTable(w, resp.Msg.GetTrustAnchor()) })
		},
	}
	addTenantFlag(create, &tenant)
	create.Flags().StringVar(&attestor, "attestor", "", "tpm, x509, cloud or kubelet")
	create.Flags().StringVar(&certFile, "certificates", "", "PEM file of the CA (or provider) certificates")
	create.Flags().StringVar(&ekSHA, "ek-public-sha256", "", "tpm: pin one TPM's EK public key (SHA-256 hex of its PKIX DER) instead of EK CAs")
	create.Flags().StringVar(&account, "cloud-account", "", "cloud: the account id instance documents must name")
	create.Flags().StringVar(&region, "cloud-region", "", "cloud: the one region admitted (default any)")
	addConfirmationFlag(create, &confirmationID)

	var limit int
	list := &cobra.Command{
		Use:   "list --tenant T",
		Short: "List a tenant's trust anchors",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.TrustAnchor, string, error) {
				resp, err := c.TrustAnchors.List(ctx, connect.NewRequest(&apiv1.ListTrustAnchorsRequest{Tenant: t, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetTrustAnchors(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(&apiv1.ListTrustAnchorsResponse{TrustAnchors: all}, func(w io.Writer) { trustAnchorTable(w, all...) })
		},
	}
	addTenantFlag(list, &tenant)
	addLimitFlag(list, &limit)

	del := &cobra.Command{
		Use:   "delete NAME|ID --tenant T",
		Short: "Delete a trust anchor: joins it vouched for are refused from then on",
		Args:  positional("NAME|ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.TrustAnchors.Delete(cmd.Context(), request(&apiv1.DeleteTrustAnchorRequest{Tenant: t, TrustAnchor: argv[0]}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { trustAnchorTable(w, resp.Msg.GetTrustAnchor()) })
		},
	}
	addTenantFlag(del, &tenant)
	addConfirmationFlag(del, &confirmationID)

	cmd.AddCommand(create, list, del)
	return cmd
}

func trustAnchorTable(w io.Writer, items ...*apiv1.TrustAnchor) {
	row(w, "ID", "NAME", "ATTESTOR", "TENANT", "EK PIN", "CLOUD ACCOUNT", "REGION", "CREATED")
	for _, t := range items {
		row(w, t.GetId(), t.GetName(), t.GetAttestor(), t.GetTenantId(), dash(t.GetEkPublicSha256()), dash(t.GetCloudAccount()),
			dash(t.GetCloudRegion()), ts(t.GetCreateTime()))
	}
}
