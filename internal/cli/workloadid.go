package cli

import (
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

func (a *app) workloadTokenCommand() *cobra.Command {
	var (
		tenant, audience string
		ttl              time.Duration
	)
	cmd := &cobra.Command{
		Use:   "workload-token reservation|instance|sandbox ID --audience AUD [--ttl 15m]",
		Short: "Issue a short-lived JWT naming a workload, for an external service",
		Long: `workload-token prints a signed JWT (ES256) that names the tenant, project and
workload, for a service that trusts the control plane's JWKS
(<issuer>/.well-known/jwks.json): an object store, a registry. It lives --ttl
(1m to 1h, default 15m) and never past the workload's end. -o json shows its
claims beside it. See docs/workload-identity.md.`,
		Args: positional("kind", "id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if ttl%time.Second != 0 {
				return invalidArg("ttl", fmt.Sprintf("must be whole seconds, got %s", ttl))
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.WorkloadIdentity.IssueToken(cmd.Context(), connect.NewRequest(&apiv1.IssueWorkloadTokenRequest{Tenant: t,
				WorkloadKind: args[0], Workload: args[1], Audience: audience, TtlSeconds: int32(ttl / time.Second)}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				// The token alone, so TOKEN=$(better-compute workload-token …) works.
				fmt.Fprintln(w, resp.Msg.GetToken())
			})
		},
	}
	addTenantFlag(cmd, &tenant)
	cmd.Flags().StringVar(&audience, "audience", "", "the service the token is for (its aud claim; required)")
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "lifetime, 1m to 1h (default 15m)")
	return cmd
}
