package cli

import (
	"context"
	"fmt"
	"io"
	"os"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

func (a *app) iamCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "iam", Short: "Identity and access management"}
	cmd.AddCommand(a.policiesCommand(), a.iamSetupCommand())
	return cmd
}

func (a *app) policiesCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "policies", Aliases: []string{"policy"}, Short: "Manage a tenant's Cedar policies"}

	var tenant string
	get := &cobra.Command{
		Use:   "get ID",
		Short: "Show a policy and its text",
		Args:  positional("ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Policies.Get(cmd.Context(), connect.NewRequest(&apiv1.GetPolicyRequest{Tenant: t, Id: argv[0]}))
			if err != nil {
				return err
			}
			return a.printPolicy(cmd, resp.Msg, resp.Msg.GetPolicy())
		},
	}
	addTenantFlag(get, &tenant)

	var file, text, confirmationID string
	put := &cobra.Command{
		Use:   "put ID (--file FILE | --text TEXT)",
		Short: "Create or replace a policy",
		Args:  positional("ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			body, err := policyText(cmd, file, text)
			if err != nil {
				return err
			}
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			// Put replaces the whole policy, so repeating it is harmless.
			var resp *connect.Response[apiv1.PutPolicyResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.Policies.Put(cmd.Context(), request(&apiv1.PutPolicyRequest{Tenant: t, Id: argv[0], Text: body}, mutation{confirmationID: confirmationID}))
				return err
			})
			if err != nil {
				return err
			}
			return a.printPolicy(cmd, resp.Msg, resp.Msg.GetPolicy())
		},
	}
	addTenantFlag(put, &tenant)
	put.Flags().StringVarP(&file, "file", "f", "", "read the Cedar text from this file (- for stdin)")
	put.Flags().StringVar(&text, "text", "", "the Cedar text")
	put.MarkFlagsMutuallyExclusive("file", "text")
	addConfirmationFlag(put, &confirmationID)

	var limit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List policies",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Policy, string, error) {
				resp, err := c.Policies.List(ctx, connect.NewRequest(&apiv1.ListPoliciesRequest{Tenant: t, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetPolicies(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(&apiv1.ListPoliciesResponse{Policies: all}, func(w io.Writer) {
				row(w, "ID", "TENANT", "UPDATED")
				for _, p := range all {
					row(w, p.GetId(), p.GetTenantId(), ts(p.GetUpdateTime()))
				}
			})
		},
	}
	addTenantFlag(list, &tenant)
	addLimitFlag(list, &limit)

	cmd.AddCommand(get, put, list)
	return cmd
}

// policyText reads --file (- = stdin) or --text; exactly one is required.
func policyText(cmd *cobra.Command, file, text string) (string, error) {
	switch {
	case file == "" && !cmd.Flags().Changed("text"):
		return "", invalidArg("file", "pass --file FILE (- for stdin) or --text TEXT")
	case file == "-":
		b, err := io.ReadAll(cmd.InOrStdin())
		if err != nil {
			return "", fmt.Errorf("read policy from stdin: %w", err)
		}
		return string(b), nil
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", invalidArg("file", err.Error())
		}
		return string(b), nil
	default:
		return text, nil
	}
}

func (a *app) printPolicy(cmd *cobra.Command, msg proto.Message, p *apiv1.Policy) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "TENANT", "UPDATED")
		row(w, p.GetId(), p.GetTenantId(), ts(p.GetUpdateTime()))
		// The Cedar text is the point of `get`; it follows the table
		// verbatim so it can be copied back into a file.
		fmt.Fprintf(w, "\n%s", p.GetText())
		if t := p.GetText(); t != "" && t[len(t)-1] != '\n' {
			fmt.Fprintln(w)
		}
	})
}

func (a *app) confirmationsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "confirmations", Aliases: []string{"confirmation"}, Short: "List and approve requests that await a human"}

	var tenant, state string
	var limit int
	list := &cobra.Command{
		Use:   "list",
		Short: "List confirmations",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.Confirmation, string, error) {
				resp, err := c.Confirmations.List(ctx, connect.NewRequest(&apiv1.ListConfirmationsRequest{Tenant: t, State: state, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetConfirmations(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printConfirmations(cmd, &apiv1.ListConfirmationsResponse{Confirmations: all}, all...)
		},
	}
	addTenantFlag(list, &tenant)
	addLimitFlag(list, &limit)
	list.Flags().StringVar(&state, "state", "", "only in this state: pending, approved, used or expired")

	approve := &cobra.Command{
		Use:   "approve ID",
		Short: "Approve a pending confirmation, letting one replay of its request through",
		Args:  positional("ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.Confirmations.Approve(cmd.Context(), connect.NewRequest(&apiv1.ApproveConfirmationRequest{Tenant: t, Id: argv[0]}))
			if err != nil {
				return err
			}
			return a.printConfirmations(cmd, resp.Msg, resp.Msg.GetConfirmation())
		},
	}
	addTenantFlag(approve, &tenant)

	cmd.AddCommand(list, approve)
	return cmd
}

func (a *app) printConfirmations(cmd *cobra.Command, msg proto.Message, items ...*apiv1.Confirmation) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "STATE", "ACTION", "RESOURCE", "PRINCIPAL", "APPROVED BY", "EXPIRES")
		for _, c := range items {
			row(w, c.GetId(), c.GetState(), c.GetAction(), resource(c.GetResourceType(), c.GetResourceId()),
				dash(c.GetPrincipalId()), dash(c.GetApprovedBy()), ts(c.GetExpireTime()))
		}
	})
}

// resource names a resource as Type/id, the way audit and events show it.
func resource(typ, id string) string {
	if typ == "" && id == "" {
		return "-"
	}
	return typ + "/" + id
}
