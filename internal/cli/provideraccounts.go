package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

// Provider accounts name their credentials only as secret references: the
// token itself goes in with `secrets put` (from a file or stdin), never on
// this command line.
func (a *app) providerAccountsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "provider-accounts", Aliases: []string{"provider-account"},
		Short: "Manage a tenant's accounts at server providers (Hetzner Cloud, Hetzner Robot, Proxmox VE)"}
	var (
		tenant, confirmationID, typ, endpoint string
		settings, refs                        []string
		limit                                 int
	)
	kvFlag := func(name string, kvs []string) (map[string]string, error) {
		m := map[string]string{}
		for _, kv := range kvs {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return nil, invalidArg(name, fmt.Sprintf("must be k=v, got %q", kv))
			}
			m[k] = v
		}
		return m, nil
	}
	create := &cobra.Command{
		Use:   "create NAME --type TYPE --secret-ref FIELD=secret://NAME [--setting K=V]",
		Short: "Add an account, checked against its type's manifest (provider-accounts types)",
		Args:  positional("NAME"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			s, err := kvFlag("setting", settings)
			if err != nil {
				return err
			}
			r, err := kvFlag("secret-ref", refs)
			if err != nil {
				return err
			}
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			msg := &apiv1.CreateProviderAccountRequest{Tenant: t, Name: argv[0], Type: typ, Settings: s, SecretRefs: r, Endpoint: endpoint}
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.CreateProviderAccountResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.ProviderAccounts.Create(cmd.Context(), request(msg, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printProviderAccounts(cmd, resp.Msg, resp.Msg.GetAccount())
		},
	}
	create.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)
	create.Flags().StringVar(&typ, "type", "", "the provider type (provider-accounts types lists them)")
	create.Flags().StringArrayVar(&settings, "setting", nil, "a setting of the type's manifest, K=V (repeatable)")
	create.Flags().StringArrayVar(&refs, "secret-ref", nil, "a credential of the type's manifest as FIELD=secret://NAME (repeatable)")
	create.Flags().StringVar(&endpoint, "endpoint", "", "another API URL than the provider's own (platform admins only)")
	addConfirmationFlag(create, &confirmationID)

	get := &cobra.Command{
		Use:   "get ACCOUNT",
		Short: "Show an account (its references; no credential is ever shown)",
		Args:  positional("ACCOUNT"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.ProviderAccounts.Get(cmd.Context(), connect.NewRequest(&apiv1.GetProviderAccountRequest{Tenant: t, Account: argv[0]}))
			if err != nil {
				return err
			}
			return a.printProviderAccounts(cmd, resp.Msg, resp.Msg.GetAccount())
		},
	}
	get.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)

	list := &cobra.Command{
		Use:   "list",
		Short: "List a tenant's provider accounts",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.ProviderAccount, string, error) {
				resp, err := c.ProviderAccounts.List(ctx, connect.NewRequest(&apiv1.ListProviderAccountsRequest{Tenant: t, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetAccounts(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printProviderAccounts(cmd, &apiv1.ListProviderAccountsResponse{Accounts: all}, all...)
		},
	}
	list.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)
	addLimitFlag(list, &limit)

	del := &cobra.Command{
		Use:   "delete ACCOUNT",
		Short: "Delete a provider account",
		Args:  positional("ACCOUNT"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, t, err := a.imagesClient(cmd, tenant)
			if err != nil {
				return err
			}
			resp, err := c.ProviderAccounts.Delete(cmd.Context(), request(&apiv1.DeleteProviderAccountRequest{Tenant: t, Account: argv[0]},
				mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) { fmt.Fprintf(w, "deleted %s\n", argv[0]) })
		},
	}
	del.Flags().StringVar(&tenant, "tenant", "", imagesTenantHelp)
	addConfirmationFlag(del, &confirmationID)

	types := &cobra.Command{
		Use:   "types",
		Short: "List the provider types and what an account of each needs",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			resp, err := c.ProviderAccounts.ListTypes(cmd.Context(), connect.NewRequest(&apiv1.ListProviderTypesRequest{}))
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				row(w, "TYPE", "FIELD", "KIND", "REQUIRED", "DESCRIPTION")
				for _, pt := range resp.Msg.GetTypes() {
					for _, f := range pt.GetFields() {
						kind := "setting"
						if f.GetSecret() {
							kind = "secret-ref"
						}
						row(w, pt.GetType(), f.GetName(), kind, fmt.Sprint(f.GetRequired()), f.GetDescription())
					}
				}
			})
		},
	}

	cmd.AddCommand(create, list, get, del, types)
	return cmd
}

func (a *app) printProviderAccounts(cmd *cobra.Command, msg proto.Message, items ...*apiv1.ProviderAccount) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) {
		row(w, "ID", "NAME", "TYPE", "SETTINGS", "SECRET REFS", "ENDPOINT")
		for _, p := range items {
			row(w, p.GetId(), p.GetName(), p.GetType(), dash(kvString(p.GetSettings())), dash(kvString(p.GetSecretRefs())), dash(p.GetEndpoint()))
		}
	})
}

// kvString prints a map sorted, k=v,k=v.
func kvString(m map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}
