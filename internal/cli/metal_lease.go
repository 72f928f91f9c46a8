package cli

import (
	"fmt"
	"io"
	"os"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// leaseCommands are the dedicated-root lease verbs of `machines`: the
// owner's lease, the lessee's accept, either's release, and get.
func (a *app) leaseCommands() []*cobra.Command {
	var (
		tenant, confirmationID, lessee, image, keyFile string
	)
	lease := &cobra.Command{
		Use:   "lease MACHINE --lessee TENANT",
		Short: "Offer a ready machine whole to a tenant (binding machine); it runs nothing until the lessee accepts",
		Long: `lease offers a ready, commissioned machine to another tenant as a dedicated-root
lease. The machine's BMC must rotate passwords (ipmi) and its commissioning must
have recorded a signed firmware baseline: the teardown needs both. Until the
lessee accepts (machines lease-accept), nothing runs on the machine, and the
offer can be withdrawn with machines lease-release.`,
		Args: positional("MACHINE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			r, err := c.Machines.Lease(cmd.Context(), request(&apiv1.LeaseMachineRequest{Tenant: t, Machine: argv[0], Lessee: lessee},
				newCreate(confirmationID)))
			if err != nil {
				return err
			}
			return a.printLease(cmd, r.Msg, r.Msg.GetLease())
		},
	}
	addTenantFlag(lease, &tenant)
	addConfirmationFlag(lease, &confirmationID)
	lease.Flags().StringVar(&lessee, "lessee", "", "the tenant the machine is lent to")

	accept := &cobra.Command{
		Use:   "lease-accept LEASE --image IMAGE --ssh-key-file F",
		Short: "As the lessee, deploy a leased machine with your signed image, root by your SSH key",
		Long: `lease-accept deploys the leased machine with the lessee's own signed raw or
qcow2 image and writes the key as root's authorized key. The deployed OS gets no
platform join token: it answers to the lessee, and nothing it says reaches the
platform's trust.`,
		Args: positional("LEASE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if keyFile == "" {
				return invalidArg("ssh-key-file", "pass --ssh-key-file FILE (an OpenSSH public key, - for stdin)")
			}
			var (
				b   []byte
				err error
			)
			if keyFile == "-" {
				b, err = io.ReadAll(io.LimitReader(cmd.InOrStdin(), 16<<10))
			} else {
				b, err = os.ReadFile(keyFile)
			}
			if err != nil {
				return invalidArg("ssh-key-file", err.Error())
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			r, err := c.Machines.AcceptLease(cmd.Context(), request(&apiv1.AcceptMachineLeaseRequest{Tenant: t, Lease: argv[0],
				Image: image, SshKey: strings.TrimSpace(string(b))}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printLease(cmd, r.Msg, r.Msg.GetLease())
		},
	}
	addTenantFlag(accept, &tenant)
	addConfirmationFlag(accept, &confirmationID)
	accept.Flags().StringVar(&image, "image", "", "your signed image (name or id)")
	accept.Flags().StringVar(&keyFile, "ssh-key-file", "", "root's OpenSSH public key file (- for stdin)")

	release := &cobra.Command{
		Use:   "lease-release LEASE",
		Short: "End a lease: fence, erase, diagnose, check firmware, rotate the BMC password; ready again only on every step's signed evidence",
		Args:  positional("LEASE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			r, err := c.Machines.ReleaseLease(cmd.Context(), request(&apiv1.ReleaseMachineLeaseRequest{Tenant: t, Lease: argv[0]},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printLease(cmd, r.Msg, r.Msg.GetLease())
		},
	}
	addTenantFlag(release, &tenant)
	addConfirmationFlag(release, &confirmationID)

	get := &cobra.Command{
		Use:   "lease-get LEASE",
		Short: "Show a lease and its teardown evidence (to its lessee and the machine's owner)",
		Args:  positional("LEASE"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			r, err := c.Machines.GetLease(cmd.Context(), connect.NewRequest(&apiv1.GetMachineLeaseRequest{Tenant: t, Lease: argv[0]}))
			if err != nil {
				return err
			}
			return a.printLease(cmd, r.Msg, r.Msg.GetLease())
		},
	}
	addTenantFlag(get, &tenant)
	return []*cobra.Command{lease, accept, release, get}
}

func (a *app) printLease(cmd *cobra.Command, msg proto.Message, l *apiv1.MachineLease) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		fmt.Fprintf(w, "lease %s  machine %s  binding %s  %s\n", l.GetId(), l.GetMachineId(), l.GetBinding(), l.GetState())
		fmt.Fprintf(w, "owner %s  lessee %s\n", l.GetOwnerTenantId(), l.GetLesseeTenantId())
		if l.GetImageId() != "" {
			fmt.Fprintf(w, "image %s (%s, sha256 %s)  root key %s\n", l.GetImageName(), l.GetImageId(), l.GetImageSha256(), l.GetSshKeyFingerprint())
		}
		if r := l.GetReason(); r != "" {
			fmt.Fprintf(w, "reason: %s\n", r)
		}
		if ev := l.GetEvidence(); len(ev) > 0 {
			fmt.Fprintf(w, "\nteardown evidence:\n")
			for _, e := range ev {
				mark := "ok"
				if !e.GetVerified() {
					mark = "REFUSED"
				}
				fmt.Fprintf(w, "  %-16s %-8s %-18s signer %-32s digest %s\n    %s\n", e.GetStep(), mark, e.GetKind(), e.GetSigner(),
					short(e.GetDigest()), e.GetDetail())
			}
		}
	})
}

func short(digest string) string {
	if len(digest) > 16 {
		return digest[:16] + "…"
	}
	return digest
}
