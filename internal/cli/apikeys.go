package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
)

func (a *app) apiKeysCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "api-keys", Aliases: []string{"api-key", "apikeys"}, Short: "Issue, list and revoke API keys"}

	var tenant, role, name, confirmationID string
	var ttl time.Duration
	var person bool
	create := &cobra.Command{
		Use:   "create",
		Short: "Create an API key and print its secret once",
		Long: `Create an API key in a tenant (--role admin, operator, member, viewer or agent), or,
with no tenant (or --role platform-admin, whatever the context's tenant), a
platform key (role platform-admin). The secret is printed
once and never again: store it now.`,
		Args: positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			// A platform key has no tenant: --role platform-admin asks for
			// one even where the context defaults a tenant (dev's sim).
			var t string
			if role == "platform-admin" {
				if tenant != "" {
					return invalidArg("tenant", "a platform-admin key belongs to no tenant: drop --tenant")
				}
			} else if t, err = a.tenant(cmd.Context(), tenant, false); err != nil {
				return err
			}
			r := role
			switch {
			case r == "" && t == "":
				r = "platform-admin"
			case r == "":
				return invalidArg("role", "required for a tenant key: admin, operator, member, viewer or agent")
			}
			if ttl < 0 {
				return invalidArg("ttl", "must not be negative")
			}
			m := newCreate(confirmationID)
			var resp *connect.Response[apiv1.CreateApiKeyResponse]
			err = a.retry(cmd.Context(), func() (err error) {
				resp, err = c.ApiKeys.Create(cmd.Context(), request(&apiv1.CreateApiKeyRequest{
					Tenant: t, Name: name, Role: r, TtlSeconds: int64(ttl / time.Second), Person: person,
				}, m))
				return err
			})
			if err != nil {
				return err
			}
			return a.printer(cmd.OutOrStdout()).print(resp.Msg, func(w io.Writer) {
				keyTable(w, resp.Msg.GetApiKey())
				// After the table, on its own line, so it is not mistaken for a
				// column and is easy to copy.
				fmt.Fprintf(w, "\nsecret: %s  (shown once; store it now)\n", resp.Msg.GetSecret())
			})
		},
	}
	addTenantFlag(create, &tenant)
	create.Flags().StringVar(&role, "role", "", "admin, operator, member, viewer or agent; platform-admin for a platform key")
	create.Flags().StringVar(&name, "name", "", "key name (default: the role)")
	create.Flags().DurationVar(&ttl, "ttl", 0, "lifetime, e.g. 24h (default: no expiry)")
	create.Flags().BoolVar(&person, "person", false, "a person's key, which may approve others' confirmations (made by a person who is a platform admin)")
	addConfirmationFlag(create, &confirmationID)

	var limit int
	var includeRevoked bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List API keys (never their secrets)",
		Args:  positional(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, t, err := a.clientTenant(cmd, tenant)
			if err != nil {
				return err
			}
			all, err := listAll(cmd.Context(), limit, func(ctx context.Context, token string, size int32) ([]*apiv1.ApiKey, string, error) {
				resp, err := c.ApiKeys.List(ctx, connect.NewRequest(&apiv1.ListApiKeysRequest{Tenant: t, IncludeRevoked: includeRevoked, PageToken: token, PageSize: size}))
				if err != nil {
					return nil, "", err
				}
				return resp.Msg.GetApiKeys(), resp.Msg.GetNextPageToken(), nil
			})
			if err != nil {
				return err
			}
			return a.printKeys(cmd, &apiv1.ListApiKeysResponse{ApiKeys: all}, all...)
		},
	}
	addTenantFlag(list, &tenant)
	addLimitFlag(list, &limit)
	list.Flags().BoolVar(&includeRevoked, "include-revoked", false, "include revoked keys")

	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke an API key",
		Long: `Revoke an API key by its id. The id is unique across tenants, so no
--tenant is needed: the server finds the key (a tenant's admin, in its own
tenant). --tenant, when given, must be the key's tenant.`,
		Args: positional("ID"),
		RunE: func(cmd *cobra.Command, argv []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			// Only an explicit --tenant: the context's would refuse a key
			// of another tenant that the id alone finds.
			resp, err := c.ApiKeys.Revoke(cmd.Context(), request(&apiv1.RevokeApiKeyRequest{Tenant: tenant, Id: argv[0]}, mutation{confirmationID: confirmationID}))
			if err != nil {
				return err
			}
			return a.printKeys(cmd, resp.Msg, resp.Msg.GetApiKey())
		},
	}
	addTenantFlag(revoke, &tenant)
	addConfirmationFlag(revoke, &confirmationID)

	cmd.AddCommand(create, list, revoke)
	return cmd
}

func (a *app) printKeys(cmd *cobra.Command, msg proto.Message, items ...*apiv1.ApiKey) error {
	return a.printer(cmd.OutOrStdout()).print(msg, func(w io.Writer) { keyTable(w, items...) })
}

func keyTable(w io.Writer, items ...*apiv1.ApiKey) {
	row(w, "ID", "NAME", "ROLE", "KIND", "PREFIX", "TENANT", "CREATED", "EXPIRES", "REVOKED")
	for _, k := range items {
		row(w, k.GetId(), dash(k.GetName()), dash(k.GetRole()), dash(k.GetKind()), dash(k.GetPrefix()),
			dash(k.GetTenantId()), ts(k.GetCreateTime()), ts(k.GetExpireTime()), ts(k.GetRevokeTime()))
	}
}
